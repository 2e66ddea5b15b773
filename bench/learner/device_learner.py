"""The device check's learner part: the project's own ``learners.learner.Learner`` on one device.

``check_learner`` saves a randomly initialised Qwen2 model of ``shape`` (``bench.learner.gpu_learner.build_model``:
no download) as safetensors, starts ``Learner`` on it exactly as a run's learner rank does (DeepSpeed
ZeRO-2 at world size 1, ``GuardedAdamW``, gradient checkpointing on, lm_head log-probs in chunks of
``learners.logits_chunk_tokens``), and times ``Learner.update`` on synthetic groups
(``bench.learner.gpu_learner.synthetic_groups``: half of them replay groups, no clipping) — the update a run
trains, DeepSpeed included. The learner config is the 1.5B recipe's learner section
(``configs/qwen2.5-math-1.5b.yaml``) at one rank; only the sequence shape comes from ``shape``.

Figures (T = prompt + response tokens per update, P = parameters, the tied embedding once, t = mean wall
time of an update):
    tokens_per_s       = T / t
    mfu                = 6 P T / t / peak            (peak: 790 TFLOP/s bf16 dense on an H200, an
                                                      8192^3 bf16 matmul)
    mfu_with_attention = (6 P T + 6 L d sum_i S_i^2) / t / peak (the causal attention matmuls)
    hfu                = (6 + 2 + 2c) P T / t / peak: adds the proximal no-grad forward (2PT; skipped by
                         the learner when it is redundant, so an upper bound) and the recompute (c = 1)
    peak_mem_gib       = ``torch.cuda.max_memory_allocated`` over the timed updates (weights included),
                         against ``predicted_gib``: ``exgrpo.runtime.memory_plan.learner_terms`` for the
                         same config and shape (``plan_terms_gib`` term by term).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.learner.device_shapes import start_learner
from bench.learner.gpu_learner import (
    FULL,
    TINY,
    Shape,
    build_model,
    peak_gib,
    timed_updates,
)
from exgrpo.core.config import Config, from_dict
from exgrpo.runtime.memory_plan import GIB, learner_peak, learner_terms, read_shape

PEAK_TFLOPS = 790.0  # bf16 dense, 8192^3 matmul measured on an H200
# the 1.5B shape at 8k tokens per sequence: 2 groups x 8 rollouts of 512 prompt + 7680 response tokens
GPU_SHAPE = dataclasses.replace(FULL, groups=2, rollouts=8, prompt_len=512, response_len=7680, micro_batch=8)
SMOKE_SHAPE = TINY
RECIPE = Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-math-1.5b.yaml"


def learner_config(
    shape: Shape, *, dtype: str, cuda: bool, checkpointing: bool, zero_stage: int | None = None
) -> Config:
    """The 1.5B recipe's learner and loss sections at one rank, with ``shape``'s sequence lengths (and
    ``zero_stage`` in place of the recipe's, when given)."""
    import yaml

    recipe = yaml.safe_load(RECIPE.read_text())
    learners = {
        **recipe["learners"],
        "num": 1,
        "num_cpus": 1,
        "num_gpus": 1 if cuda else 0,
        "backend": "nccl" if cuda else "gloo",
        "micro_batch_size": shape.micro_batch,
        "gradient_checkpointing": "on" if checkpointing else "off",
    }
    if zero_stage is not None:
        learners["zero_stage"] = zero_stage
    model = {"dtype": dtype, "max_prompt_len": shape.prompt_len, "max_response_len": shape.response_len}
    return from_dict({"model": model, "learners": learners, "loss": recipe["loss"]})


def check_learner(
    *,
    shape: Shape,
    device: str,
    dtype: str,
    warm: int,
    timed: int,
    checkpointing: bool,
    peak_flops: float,
    deadline: float,
    zero_stage: int | None = None,
) -> dict[str, Any]:
    """``warm`` + ``timed`` ``Learner.update`` calls; stops timing early at ``deadline`` (time.monotonic)."""

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
    cfg = learner_config(shape, dtype=dtype, cuda=cuda, checkpointing=checkpointing, zero_stage=zero_stage)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    seq = shape.prompt_len + shape.response_len
    with tempfile.TemporaryDirectory(prefix="exgrpo-device-model-") as model_dir:
        model = build_model(shape, dtype=getattr(torch, dtype), device=torch.device("cpu"), max_positions=seq)
        params = sum(p.numel() for p in model.parameters())  # the tied embedding once
        model.save_pretrained(model_dir)
        del model
        plan = learner_terms(cfg, read_shape(model_dir), on_gpu=cuda)
        learner = start_learner(
            cfg, model_dir, max_response_len=shape.response_len
        )  # cfg.model.dtype = dtype
    setup_s = time.perf_counter() - t0
    engine_model = learner.engine.module
    rows = shape.groups * shape.rollouts
    tokens, response_tokens = rows * seq, rows * shape.response_len
    print(
        f"[learner] project Learner (DeepSpeed ZeRO-{cfg.learners.zero_stage}, {dtype}), "
        f"{params / 1e9:.3f} B params, {rows} x {seq} tokens per update, setup {setup_s:.1f} s",
        flush=True,
    )
    times, norms, losses, skipped = timed_updates(
        learner, shape, dev, warm=warm, timed=timed, deadline=deadline, response_tokens=response_tokens
    )
    if not times:
        raise RuntimeError("no timed update finished")
    t = sum(times) / len(times)
    model_flops = 6 * params * tokens
    attn_flops = 6 * shape.layers * shape.hidden * rows * seq * seq  # 3 (fwd+bwd) x 2 matmuls x 2 S^2 d / 2
    hw_flops = (8 + 2 * int(checkpointing)) * params * tokens
    peak = peak_gib(dev)
    predicted = learner_peak(plan) / GIB  # persistent terms + the largest phase
    out = {
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "learner": f"learners.learner.Learner, DeepSpeed ZeRO-{cfg.learners.zero_stage}, world size 1",
        "dtype": dtype,
        "params": params,
        "shape": dataclasses.asdict(shape),
        "learner_config": dataclasses.asdict(cfg.learners),
        "rows_per_update": rows,
        "tokens_per_update": tokens,
        "response_tokens_per_update": response_tokens,
        "gradient_checkpointing": bool(engine_model.is_gradient_checkpointing and engine_model.training),
        "setup_s": setup_s,
        "step_seconds": times,
        "mean_step_s": t,
        "tokens_per_s": tokens / t,
        "response_tokens_per_s": response_tokens / t,
        "peak_flops": peak_flops,
        "model_flops_per_update": model_flops,
        "attention_flops_per_update": attn_flops,
        "mfu": model_flops / t / peak_flops,
        "mfu_with_attention": (model_flops + attn_flops) / t / peak_flops,
        "hfu": hw_flops / t / peak_flops,
        "grad_norms": norms,
        "losses": losses,
        "grad_norm_finite": all(math.isfinite(n) for n in norms),
        "skipped_steps": skipped,
        "peak_mem_gib": peak,
        "predicted_gib": predicted,
        "plan_terms_gib": {k: v / GIB for k, v in plan.items()},
        "peak_over_predicted": None if peak is None else peak / predicted,
    }
    print(
        f"[learner] {out['tokens_per_s']:.0f} tokens/s, MFU {out['mfu']:.3f} "
        f"(with attention {out['mfu_with_attention']:.3f}, HFU {out['hfu']:.3f}), {t:.3f} s per update, "
        f"peak memory {'n/a' if peak is None else format(peak, '.1f') + ' GiB'} "
        f"(the memory plan predicts {predicted:.1f} GiB)",
        flush=True,
    )
    os.environ.pop("MASTER_PORT", None)
    return out
