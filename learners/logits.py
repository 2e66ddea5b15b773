"""Log-probs and entropies of the response tokens from a model: the full-logits path, and the chunked one
(the model's final hidden states at the response positions through lm_head a chunk at a time, each chunk under
``torch.utils.checkpoint``), so no (n, S, V) tensor exists."""

from __future__ import annotations

from collections.abc import Sequence
from inspect import signature

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from exgrpo.core.algorithm import token_entropy, token_logprobs
from learners.batches import PADDING_ROW, Encoded, Row, chunks, encode


def response_logits(model: torch.nn.Module, enc: Encoded) -> Tensor:
    """(n, R, V) the logits predicting each response token (the full-logits path: tests and fallbacks)."""
    logits = model(**enc.forward_kwargs(), use_cache=False).logits  # (m, S, V)
    return logits[enc.seq.unsqueeze(1), enc.positions]  # (n, R, V)


def _chunked_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The lm_head of an HF causal LM whose logits are ``lm_head(last hidden state)`` and whose forward takes
    ``logits_to_keep`` (unwrapping a DeepSpeed engine's ``.module`` and PEFT's ``get_base_model``: the adapters
    live inside the base's layers); None otherwise (softcapped or scaled logits, no such accessors), and the
    caller takes the full-logits path."""
    inner = getattr(model, "module", model)
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    config = getattr(inner, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    if (
        not hasattr(inner, "get_output_embeddings")
        or "logits_to_keep" not in signature(inner.forward).parameters
    ):
        return None
    return inner.get_output_embeddings()


def _chunk_stats(
    head: torch.nn.Module, hidden: Tensor, tokens: Tensor, entropy: bool = True
) -> tuple[Tensor, Tensor]:
    """(T,) log-probs and (T,) entropies (zeros unless ``entropy``) of T response positions' hidden states
    (T, D): lm_head (float32 under the learner's autocast), then the float32 math of ``token_logprobs`` /
    ``token_entropy`` (same stability rules)."""
    if torch.is_autocast_enabled(hidden.device.type):  # the learner's bfloat16 autocast: lm_head in float32
        with torch.autocast(hidden.device.type, enabled=False):
            logits = head(hidden.float())  # (T, V)
    else:
        logits = head(hidden).float()  # (T, V)
    logp = token_logprobs(logits.unsqueeze(0), tokens.unsqueeze(0))[0]  # (T,)
    return logp, token_entropy(logits) if entropy else torch.zeros_like(logp)  # (T,), (T,)


def chunk_count(head: torch.nn.Module, local: int, device: torch.device) -> int:
    """How many lm_head chunks this rank runs: its own ``local``, or, when the head's weight is a partitioned
    ZeRO-3 parameter in a world of several ranks, the most of any rank. Each call of a ZeRO-3 module gathers
    its weight, a collective every rank must join, and the ranks hold different numbers of response tokens;
    the extra calls run on no positions (as the padding forwards of ``learners.learner``'s micro-batches)."""
    weight = getattr(head, "weight", None)
    if (
        weight is None
        or not hasattr(weight, "ds_id")
        or not dist.is_initialized()
        or dist.get_world_size() < 2
    ):
        return local
    count = torch.tensor(local, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count)


def response_stats(
    model: torch.nn.Module, enc: Encoded, *, chunk_tokens: int | None = None, entropy: bool = True
) -> tuple[Tensor, Tensor]:
    """((n, R) log-probs, (n, R) entropies) of the response tokens, float32, 0 at padding; with
    ``entropy=False`` the entropies are not computed (zeros): the log-prob-only passes skip that work.

    ``chunk_tokens=None``: the full-logits path (``response_logits``). Otherwise the model's own forward
    runs with ``output_hidden_states`` and ``logits_to_keep=1`` (logits of the last position only), the
    response positions' final hidden states are gathered (padding dropped) and each chunk of
    ``chunk_tokens`` positions goes through lm_head -> float32 log-softmax on its own; with grad enabled
    each chunk runs under ``torch.utils.checkpoint``, so the backward recomputes its logits instead of
    keeping them: no (n, S, V) or (n, R, V) tensor exists, only (chunk_tokens, V). Models whose logits
    are not ``lm_head(last hidden state)`` (``_chunked_head`` is None) take the full-logits path.

    The forward goes through ``model`` itself (a DeepSpeed engine on the learners), never through its
    decoder alone: an engine's forward starts each micro-batch for its ZeRO optimiser (ZeRO-3 counts
    micro-batches there and otherwise overwrites, not accumulates, the earlier micro-batches' gradient
    partitions: ``tests/learners/test_learner.py::test_chunked_logits_under_zero_stages_equal_one_plain_rank``)."""
    head = None if chunk_tokens is None else _chunked_head(model)
    if head is None:
        logits = response_logits(model, enc)  # (n, R, V)
        logp = token_logprobs(logits, enc.tokens)  # (n, R)
        ent = token_entropy(logits) if entropy else torch.zeros_like(logp)  # (n, R)
        zero = torch.zeros((), device=logp.device)
        return torch.where(enc.mask, logp, zero), torch.where(enc.mask, ent, zero)
    assert chunk_tokens is not None
    out = model(**enc.forward_kwargs(), use_cache=False, output_hidden_states=True, logits_to_keep=1)
    hidden = out.hidden_states[-1]  # (m, S, D) after the final norm: what lm_head reads
    rows, cols = enc.mask.nonzero(as_tuple=True)  # (T,) each: the response tokens
    picked = hidden[enc.seq[rows], enc.positions[rows, cols]]  # (T, D)
    tokens = enc.tokens[rows, cols]  # (T,)
    logp_parts, ent_parts = [], []
    slices = chunks(tokens.shape[0], chunk_tokens)
    slices += [slice(0, 0)] * (chunk_count(head, len(slices), hidden.device) - len(slices))
    for sl in slices:
        if torch.is_grad_enabled():
            lp, h = checkpoint(_chunk_stats, head, picked[sl], tokens[sl], entropy, use_reentrant=False)
        else:
            lp, h = _chunk_stats(head, picked[sl], tokens[sl], entropy)
        logp_parts.append(lp)
        ent_parts.append(h)
    logp = torch.zeros(enc.mask.shape, dtype=torch.float32, device=hidden.device)  # (n, R)
    ent = torch.zeros(enc.mask.shape, dtype=torch.float32, device=hidden.device)  # (n, R)
    if tokens.shape[0]:
        logp = logp.index_put((rows, cols), torch.cat(logp_parts))
        ent = ent.index_put((rows, cols), torch.cat(ent_parts))
    else:  # no response token: keep the graph connected to the parameters (a zero gradient), head included
        logp = logp + 0.0 * hidden.sum() + sum((0.0 * part.sum() for part in logp_parts), torch.zeros(()))
    return logp, ent


@torch.no_grad()
def per_token(
    model: torch.nn.Module,
    rows: Sequence[Row],
    r_max: int,
    what: str,
    *,
    slices: Sequence[slice],
    device: torch.device,
    chunk_tokens: int | None = None,
    pack: bool = False,
) -> Tensor:
    """(N, R) float32 on the CPU: no-grad log-probs (``what="logp"``) or entropies of the response tokens,
    one forward per slice (an empty slice runs a padding forward, as ZeRO-3 needs; 0 at padding), the
    logits ``chunk_tokens`` positions at a time (``response_stats``), rows sharing a prompt packed with ``pack``."""
    out = torch.zeros(len(rows), r_max)  # (N, R)
    for sl in slices:
        chunk = rows[sl] or [PADDING_ROW]
        enc = encode(chunk, r_max, device, pack=pack)
        logp, ent = response_stats(model, enc, chunk_tokens=chunk_tokens, entropy=what != "logp")  # (n, R)
        vals = logp if what == "logp" else ent  # (n, R)
        if rows[sl]:
            out[sl] = torch.where(enc.mask, vals, 0.0).float().cpu()
    return out
