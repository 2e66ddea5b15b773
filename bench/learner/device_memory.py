"""The device check's memory part: a learner with Qwen2.5-Math-7B's layer shapes under the 7B recipe.

``learners.learner.Learner`` with the 7B recipe's learner section (``configs/qwen2.5-math-7b.yaml``:
ZeRO-3, micro-batches of 4 sequences and at most 9216 padded tokens, lm_head log-probs in chunks of 4096
positions, gradient checkpointing "auto" = on for a GPU learner) at world size 1, on a random model of
Qwen2.5-Math-7B's layer shapes (hidden 3584, intermediate 18944, 28 heads, 4 KV heads, vocabulary 152064,
untied lm_head) with few layers (``--layers-7b``, default 2). Each update trains 2 groups x 8 rollouts whose
prompts are max_prompt_len long and whose first rollout is max_response_len long (the recipe's longest
sequence, 9216 tokens: the micro-batch the plan sizes), the others long-tailed.

Peaks (``torch.cuda.max_memory_allocated``, weights included; CPU: none):
    setup         from before ``Learner.setup`` to its end (the random model was built and freed before);
                  also ``resident`` = ``memory_allocated`` after it
    forward/backward  until each optimiser step: the proximal no-grad pass and the micro-batches'
                  forwards and backwards (``RankEngine.step`` is wrapped in this process to read it)
    step          during each ``RankEngine.step`` (DeepSpeed's step; the first one allocates AdamW's moments)
each per update, printed beside ``exgrpo.runtime.memory_plan.learner_terms`` for the same config and shape
(every term it returns, by name, and their sum).
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch

from bench.common import synchronize
from bench.learner.device_shapes import (
    GIB,
    Sizes,
    allocated,
    gib,
    long_tail_groups,
    peak,
    recipe_config,
    reset_peak,
    save_model,
    setup_device,
    start_learner,
)
from exgrpo.core import metric_names as M
from exgrpo.core.records import TrainBatch
from exgrpo.runtime.memory_plan import learner_peak, learner_terms, read_shape


def _watch_steps(dev: torch.device, rec: dict[str, int]) -> Any:
    """Wrap ``learners.engine.RankEngine.step`` (this process only): the peak before each step goes to
    ``rec["forward_backward"]``, the peak during it to ``rec["step"]`` (maxima); returns the original."""
    from learners.engine import RankEngine

    original = RankEngine.step

    def step(self: Any) -> tuple[float, bool]:
        rec["forward_backward"] = max(rec["forward_backward"], peak(dev))
        reset_peak(dev)
        try:
            return original(self)
        finally:
            rec["step"] = max(rec["step"], peak(dev))
            reset_peak(dev)

    RankEngine.step = step  # type: ignore[method-assign]
    return original


def check_memory(*, sizes: Sizes, device: str, updates: int, deadline: float) -> dict[str, Any]:
    """Set up the learner, then ``updates`` updates (the first allocates the optimiser's moments)."""

    dev = setup_device(device)
    cuda = dev.type == "cuda"
    cfg = recipe_config(sizes, cuda=cuda)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="exgrpo-device-memory-") as model_dir:
        params = save_model(sizes, model_dir, dtype=cfg.model.dtype, device=dev)
        terms = learner_terms(cfg, read_shape(model_dir), on_gpu=cuda)
        before = allocated(dev)
        reset_peak(dev)
        learner = start_learner(cfg, model_dir, max_response_len=sizes.max_response_len)
    synchronize(dev)
    setup = {
        "seconds": time.perf_counter() - t0,
        "before_bytes": before,
        "resident_bytes": allocated(dev),
        "peak_bytes": peak(dev),
    }
    print(
        f"[memory] 7B-shaped learner, {sizes.layers} layers, {params / 1e9:.3f} B params, ZeRO-"
        f"{cfg.learners.zero_stage}, setup {setup['seconds']:.1f} s",
        flush=True,
    )
    rec = {"forward_backward": 0, "step": 0}
    original = _watch_steps(dev, rec)
    rows: list[dict[str, Any]] = []
    try:
        for step in range(updates):
            if rows and time.monotonic() > deadline:
                break
            groups = long_tail_groups(sizes, groups=2, rollouts=8, seed=step, full_first=True)
            rec.update(forward_backward=0, step=0)
            reset_peak(dev)
            synchronize(dev)
            s0 = time.perf_counter()
            m = learner.update(TrainBatch(groups=tuple(groups), version=step, clip=False)).metrics
            synchronize(dev)
            rows.append(
                {
                    "seconds": time.perf_counter() - s0,
                    "response_tokens": int(m[M.LEARNER_TOKENS]),
                    "sequence_tokens": sum(len(g.prompt_ids) * len(g.trajectories) for g in groups)
                    + sum(len(t.response_ids) for g in groups for t in g.trajectories),
                    "longest": max(
                        len(g.prompt_ids) + len(t.response_ids) for g in groups for t in g.trajectories
                    ),
                    "grad_norm": float(m[M.GRAD_NORM]),
                    "forward_backward_peak_bytes": rec["forward_backward"],
                    "step_peak_bytes": rec["step"],
                }
            )
    finally:
        from learners.engine import RankEngine

        RankEngine.step = original  # type: ignore[method-assign]
    return _report(cfg, sizes, params, setup, rows, terms, cuda)


def _report(
    cfg: Any,
    sizes: Sizes,
    params: int,
    setup: dict[str, Any],
    rows: list[dict[str, Any]],
    terms: dict[str, int],
    cuda: bool,
) -> dict[str, Any]:
    plan_total = learner_peak(terms)  # persistent terms + the largest phase, as the plan counts it
    fb = max((r["forward_backward_peak_bytes"] for r in rows), default=0)
    st = max((r["step_peak_bytes"] for r in rows), default=0)
    out = {
        "sizes": dict(sizes.__dict__),
        "params": params,
        "learner_config": {
            k: getattr(cfg.learners, k)
            for k in (
                "zero_stage",
                "micro_batch_size",
                "max_tokens_per_micro_batch",
                "logits_chunk_tokens",
                "gradient_checkpointing",
                "minibatches",
            )
        },
        "setup": setup,
        "updates": rows,
        "plan_terms_bytes": terms,
        "plan_total_bytes": plan_total,
        "peak_bytes": max(fb, st, setup["peak_bytes"]) if cuda else None,
    }
    line = ", ".join(f"{k} {v / GIB:.2f}" for k, v in terms.items())
    print(f"[memory] plan (GiB): {line}; peak {plan_total / GIB:.2f}", flush=True)
    if cuda:
        print(
            f"[memory] measured (GiB): setup peak {gib(setup['peak_bytes']):.2f} (resident after "
            f"{gib(setup['resident_bytes']):.2f}), forward/backward peak {gib(fb):.2f}, step peak "
            f"{gib(st):.2f}; largest over the plan's total {max(fb, st) / plan_total:.2f}",
            flush=True,
        )
    else:
        print("[memory] measured: n/a on CPU (no allocator statistics)", flush=True)
    for i, r in enumerate(rows):
        print(
            f"[memory] update {i}: {r['seconds']:.2f} s, {r['sequence_tokens']} tokens (longest "
            f"{r['longest']}), grad norm {r['grad_norm']:.4g}",
            flush=True,
        )
    return out
