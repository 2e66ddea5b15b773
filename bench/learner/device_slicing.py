"""The device check's slicing part: long-tailed response lengths in the recipe's micro-batches, sliced by count
or by token budget, in group order or sorted (``check_slicing``: non-pad tokens/s each). The workload and the
four slicings: docs/benchmarks.md, "GPU device check".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from bench.learner.device_shapes import (
    Sizes,
    build_model,
    long_tail_groups,
    recipe_config,
    setup_device,
    timed,
)

MODES = ("count", "count_sorted", "budget", "budget_sorted")


def slices_for(mode: str, seq: Sequence[int], sizes: Sizes) -> list[slice]:
    """The micro-batches of rows of lengths ``seq`` (already in the mode's order)."""
    from learners import batches

    if mode.startswith("count"):
        return batches.chunks(len(seq), sizes.micro_batch)
    return batches.budget_slices(seq, sizes.token_budget, max_rows=sizes.micro_batch)


def _pass(model: Any, rows: Sequence[Any], slices: Sequence[slice], sizes: Sizes, dev: torch.device) -> None:
    """Forward and backward over every micro-batch, as an update's gradient pass computes them."""
    from learners import batches, logits

    for sl in slices:
        part = rows[sl]
        r_max = max(len(r.response_ids) for r in part)
        enc = batches.encode(part, r_max, dev)
        logp, ent = logits.response_stats(model, enc, chunk_tokens=sizes.chunk_tokens)
        (logp.sum() + 1e-3 * ent.sum()).backward()


def check_slicing(
    *, sizes: Sizes, device: str, groups: int, rollouts: int, reps: int, deadline: float
) -> dict[str, Any]:
    """Every slicing of the same rows: ``reps`` timed passes each, after one warm-up pass."""
    from learners import batches
    from learners.modeling import checkpointing_on, set_checkpointing

    dev = setup_device(device)
    cfg = recipe_config(sizes, cuda=dev.type == "cuda")
    torch.manual_seed(0)
    model = build_model(sizes, dtype=getattr(torch, cfg.model.dtype), device=dev)
    set_checkpointing(model, checkpointing_on(cfg.learners.gradient_checkpointing, dev))
    rows, _ = batches.build_rows(
        long_tail_groups(sizes, groups=groups, rollouts=rollouts, seed=7), std_normalize=True
    )
    seq = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    order = sorted(range(len(rows)), key=lambda i: -seq[i])
    out: dict[str, Any] = {
        "rows": len(rows),
        "layers": sizes.layers,
        "gradient_checkpointing": bool(getattr(model, "is_gradient_checkpointing", False)),
        "seq_lens": seq,
        "response_lens": [len(r.response_ids) for r in rows],
        "non_pad_tokens": sum(seq),
        "modes": {},
        "skipped": [],
    }
    warm = slices_for("budget_sorted", [seq[i] for i in order], sizes)[-1:]
    _pass(model, [rows[i] for i in order], warm, sizes, dev)  # kernels and allocator warm
    for mode in MODES:
        if out["modes"] and time.monotonic() > deadline:
            out["skipped"].append(mode)
            continue
        idx = order if mode.endswith("sorted") else list(range(len(rows)))
        mode_rows, mode_seq = [rows[i] for i in idx], [seq[i] for i in idx]
        slices = slices_for(mode, mode_seq, sizes)
        padded = sum(max(mode_seq[sl]) * len(mode_seq[sl]) for sl in slices)
        seconds = []
        for _ in range(reps):
            model.zero_grad(set_to_none=True)
            seconds.append(timed(partial(_pass, model, mode_rows, slices, sizes, dev), dev))
        best = min(seconds)
        out["modes"][mode] = {
            "micro_batches": len(slices),
            "padded_tokens": padded,
            "pad_fraction": 1 - sum(mode_seq) / padded,
            "seconds": seconds,
            "non_pad_tokens_per_s": sum(mode_seq) / best,
        }
        print(
            f"[slicing] {mode:>13}: {len(slices):3d} micro-batches, {padded} padded tokens "
            f"({out['modes'][mode]['pad_fraction']:.0%} padding), {best:.3f} s, "
            f"{sum(mode_seq) / best:.0f} non-pad tokens/s",
            flush=True,
        )
    return out
