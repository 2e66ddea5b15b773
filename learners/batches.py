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
    input_ids: Tensor  # (n, S) prompt + response, right-padded with 0
    attention_mask: Tensor  # (n, S)
    positions: Tensor  # (n, R) index of the logit predicting each response token
    tokens: Tensor  # (n, R) response tokens (0 at padding)
    mask: Tensor  # (n, R) bool, true on response tokens


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


def encode(rows: Sequence[Row], r_max: int, device: torch.device) -> Encoded:
    """The rows as right-padded model inputs and the response tokens' positions and mask."""
    n, s = len(rows), max(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    ids = torch.zeros(n, s, dtype=torch.long)  # (n, S)
    attn = torch.zeros(n, s, dtype=torch.long)  # (n, S)
    pos = torch.zeros(n, r_max, dtype=torch.long)  # (n, R)
    tok = torch.zeros(n, r_max, dtype=torch.long)  # (n, R)
    mask = torch.zeros(n, r_max, dtype=torch.bool)  # (n, R)
    for i, r in enumerate(rows):
        p, k = len(r.prompt_ids), len(r.response_ids)
        if p == 0:
            raise ValueError("a sequence needs at least one prompt token to score its first response token")
        ids[i, : p + k] = torch.tensor(r.prompt_ids + r.response_ids)
        attn[i, : p + k] = 1
        pos[i, :k] = torch.arange(p - 1, p + k - 1)
        tok[i, :k] = torch.tensor(r.response_ids)
        mask[i, :k] = True
    return Encoded(ids.to(device), attn.to(device), pos.to(device), tok.to(device), mask.to(device))


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
