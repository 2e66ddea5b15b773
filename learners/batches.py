"""The update's batch layout: groups as training rows, rows as padded model inputs, and micro-batch slices
(by rows, or by padded tokens under ``learners.max_tokens_per_micro_batch``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from exgrpo.core.algorithm import group_advantages
from exgrpo.core.records import Group


@dataclass(frozen=True)
class Row:
    """One training sequence: prompt + response, its advantage and behaviour log-probs."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    behaviour: tuple[float, ...]  # sampler log-probs (fresh) or stored ones (replayed)
    replayed: bool = False
    advantage: float = 0.0


PADDING_ROW = Row(prompt_ids=(0,), response_ids=(0,), behaviour=(0.0,))  # the forward of an empty slice


@dataclass(frozen=True)
class Encoded:
    """Model inputs of n rows in m sequences: one row a sequence (m = n), or, packed, the rows that share a
    prompt in one sequence (the prompt once, then each response, attending to the prompt and itself only)."""

    input_ids: Tensor  # (m, S) right-padded with 0
    attention_mask: Tensor  # (m, S) 0/1, or packed (m, 1, S, S) bool: query attends to key
    positions: Tensor  # (n, R) index in its sequence of the logit predicting each response token
    tokens: Tensor  # (n, R) response tokens (0 at padding)
    mask: Tensor  # (n, R) bool, true on response tokens
    seq: Tensor  # (n,) the sequence each row is in
    position_ids: Tensor | None = None  # (m, S) packed: each response continues its prompt's positions

    def forward_kwargs(self) -> dict[str, Tensor]:
        """The HF forward's inputs (position ids only when packed)."""
        out = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        return out if self.position_ids is None else {**out, "position_ids": self.position_ids}


def build_rows(groups: Sequence[Group], *, std_normalize: bool) -> tuple[list[Row], list[int]]:
    """The groups' trajectories as rows with their group's advantages, and the group bounds (G + 1)."""
    rows, bounds = [], [0]
    for g in groups:
        rewards = torch.tensor([[t.reward for t in g.trajectories]])  # (1, K)
        adv = group_advantages(rewards, std_normalize=std_normalize)[0]  # (K,)
        for t, a in zip(g.trajectories, adv.tolist(), strict=True):
            rows.append(Row(g.prompt_ids, t.response_ids, t.logprobs, t.replayed, a))
        bounds.append(len(rows))
    return rows, bounds


def encode(rows: Sequence[Row], r_max: int, device: torch.device, *, pack: bool = False) -> Encoded:
    """The rows as right-padded model inputs and the response tokens' positions and mask; with ``pack``, each
    run of consecutive rows with the same prompt as one sequence (``packed``)."""
    for r in rows:
        if not r.prompt_ids:
            raise ValueError("a sequence needs at least one prompt token to score its first response token")
    if pack:
        return packed(rows, r_max, device)
    n, s = len(rows), max(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    ids = torch.zeros(n, s, dtype=torch.long)  # (n, S)
    attn = torch.zeros(n, s, dtype=torch.long)  # (n, S)
    pos = torch.zeros(n, r_max, dtype=torch.long)  # (n, R)
    tok = torch.zeros(n, r_max, dtype=torch.long)  # (n, R)
    mask = torch.zeros(n, r_max, dtype=torch.bool)  # (n, R)
    for i, r in enumerate(rows):
        p, k = len(r.prompt_ids), len(r.response_ids)
        ids[i, : p + k] = torch.tensor(r.prompt_ids + r.response_ids)
        attn[i, : p + k] = 1
        pos[i, :k] = torch.arange(p - 1, p + k - 1)
        tok[i, :k] = torch.tensor(r.response_ids)
        mask[i, :k] = True
    seq = torch.arange(n)  # (n,)
    return Encoded(*(t.to(device) for t in (ids, attn, pos, tok, mask, seq)))


def prompt_runs(rows: Sequence[Row]) -> list[slice]:
    """Slices of the maximal runs of consecutive rows with the same prompt (a group's rollouts)."""
    out, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i].prompt_ids != rows[start].prompt_ids:
            out.append(slice(start, i))
            start = i
    return out


def packed(rows: Sequence[Row], r_max: int, device: torch.device) -> Encoded:
    """``encode`` with each run of rows sharing a prompt in one sequence: the prompt's P tokens once, then
    every response; position ids restart at P for each response, and the (S, S) mask lets a response token
    see the prompt and the earlier tokens of its own response only (causal), so each row's log-probs are the
    unpacked forward's (up to float rounding) while the prompt is computed once, not once per row. Padding
    positions attend to themselves (never a row of no keys, whose softmax would be NaN)."""
    runs = prompt_runs(rows)
    lengths = [len(rows[sl][0].prompt_ids) + sum(len(r.response_ids) for r in rows[sl]) for sl in runs]
    m, s, n = len(runs), max(lengths), len(rows)
    ids = torch.zeros(m, s, dtype=torch.long)  # (m, S)
    position_ids = torch.zeros(m, s, dtype=torch.long)  # (m, S)
    segment = torch.full((m, s), -1, dtype=torch.long)  # (m, S): 0 the prompt, i + 1 the run's i-th response
    pos = torch.zeros(n, r_max, dtype=torch.long)  # (n, R)
    tok = torch.zeros(n, r_max, dtype=torch.long)  # (n, R)
    mask = torch.zeros(n, r_max, dtype=torch.bool)  # (n, R)
    seq = torch.zeros(n, dtype=torch.long)  # (n,)
    for j, sl in enumerate(runs):
        prompt = rows[sl][0].prompt_ids
        p = at = len(prompt)
        ids[j, :p], position_ids[j, :p], segment[j, :p] = torch.tensor(prompt), torch.arange(p), 0
        for i, r in enumerate(rows[sl], start=sl.start):
            k = len(r.response_ids)
            if k:
                ids[j, at : at + k] = torch.tensor(r.response_ids)
                position_ids[j, at : at + k] = torch.arange(p, p + k)
                segment[j, at : at + k] = i - sl.start + 1
                pos[i, :k] = torch.tensor([p - 1, *range(at, at + k - 1)])
                tok[i, :k] = torch.tensor(r.response_ids)
                mask[i, :k] = True
            seq[i] = j
            at += k
    index = torch.arange(s)  # (S,)
    causal = index[:, None] >= index[None, :]  # (S, S)
    q, k_ = segment[:, :, None], segment[:, None, :]  # (m, S, 1), (m, 1, S)
    see = causal & (q >= 0) & (k_ >= 0) & ((k_ == 0) | (q == k_))  # (m, S, S)
    see = see | torch.eye(s, dtype=torch.bool)  # padding positions see themselves
    attn = see.unsqueeze(1)  # (m, 1, S, S)
    return Encoded(*(t.to(device) for t in (ids, attn, pos, tok, mask, seq, position_ids)))


def pad(values: Sequence[Sequence[float]], r_max: int) -> Tensor:
    """(N, R) float32, zero-padded on the right."""
    out = torch.zeros(len(values), r_max, dtype=torch.float32)  # (N, R)
    for i, v in enumerate(values):
        out[i, : len(v)] = torch.tensor(v, dtype=torch.float32)
    return out


def micro_slices(rows: Sequence[Row], *, size: int, max_tokens: int | None = None) -> list[slice]:
    """The micro-batches of a mini-batch's rows, for every engine: ``size`` rows each (``chunks``) or, with
    ``max_tokens`` (``learners.max_tokens_per_micro_batch``), at most that many padded tokens too
    (``budget_slices``). Consecutive, in order: the accumulation weights do not depend on them."""
    if max_tokens is None:
        return chunks(len(rows), size)
    seq = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    return budget_slices(seq, max_tokens, max_rows=size)


def chunks(n: int, size: int) -> list[slice]:
    """Consecutive slices of at most ``size`` of ``range(n)`` (the plain micro-batches)."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def budget_slices(seq_lens: Sequence[int], max_tokens: int, max_rows: int) -> list[slice]:
    """Consecutive micro-batches of at most ``max_rows`` rows and ``max_tokens`` padded tokens (rows x the
    micro-batch's longest prompt + response). A row longer than the budget gets a micro-batch of its own
    (it cannot be split). The rows keep their order, so the accumulation weights are unchanged."""
    out, start, longest = [], 0, 0
    for i, n in enumerate(seq_lens):
        grown = max(longest, n)
        if i > start and (grown * (i - start + 1) > max_tokens or i - start >= max_rows):
            out.append(slice(start, i))
            start, grown = i, n
        longest = grown
    if start < len(seq_lens):
        out.append(slice(start, len(seq_lens)))
    return out
