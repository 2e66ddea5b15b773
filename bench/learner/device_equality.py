"""The device check's equality part: the same three updates under every ZeRO stage, chunked and whole logits,
float32 and bfloat16, against one float32 ZeRO-0 learner with whole logits (``check_equality``). The cells and
the tolerances: docs/benchmarks.md, "GPU device check".
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
from typing import Any

import numpy as np
import torch

from bench.learner.gpu_learner import Shape, build_model, synthetic_groups
from exgrpo.core import metric_names as M
from exgrpo.core.config import LearnerConfig, LossConfig
from exgrpo.core.records import TrainBatch
from exgrpo.transport.ranks import free_port

# the equality shape on a GPU: big enough that the chunks split every row, small enough for 12 cells in a minute
GPU_EQ_SHAPE = Shape(256, 4, 4, 2, 512, 4096, 4, 4, 32, 96, 4, 4, 8, 8)
CHUNK = 16  # response positions per lm_head pass in the chunked cells (6 chunks of a 96-token response)
WHOLE = 1 << 20
UPDATES = 3
TOL = {"float32": {"rel": 1e-4, "weights": 1e-4}, "bfloat16": {"rel": 1e-2, "weights": 1e-2}}
CELLS = [("float32", 0, "whole")] + [
    (dtype, stage, logits)
    for dtype, stages in (("float32", (0, 2, 3)), ("bfloat16", (1, 2, 3)))
    for stage in stages
    for logits in ("whole", "chunked")
    if (dtype, stage, logits) != ("float32", 0, "whole")
]


def _run_cell(
    model_dir: str, shape: Shape, *, dtype: str, stage: int, logits: str, cuda: bool
) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    from exgrpo.transport.packed import unpack_weights
    from learners.learner import Learner

    cfg = LearnerConfig(
        lr=1e-3,
        micro_batch_size=shape.micro_batch,
        zero_stage=stage,
        num_gpus=1 if cuda else 0,
        backend="nccl" if cuda else "gloo",
        gradient_checkpointing="off",
        logits_chunk_tokens=CHUNK if logits == "chunked" else WHOLE,
    )
    learner = Learner(
        model_path=model_dir,
        learner=cfg,
        loss=LossConfig(norm="token_mean", entropy_coef=0.01),
        max_response_len=shape.response_len,
        master_port=free_port(),
        dtype=dtype,
    )
    learner.setup()
    losses, norms = [], []
    for step in range(UPDATES):
        m = learner.update(
            TrainBatch(groups=tuple(synthetic_groups(shape, step=step)), version=step, clip=True)
        ).metrics
        losses.append(float(m[M.LOSS]))
        norms.append(float(m[M.GRAD_NORM]))
    packed = learner.get_weights()
    assert packed is not None  # rank 0 of one rank: the full weights
    sent = {s.dtype for s in packed.layout}
    if sent != {dtype}:
        raise RuntimeError(f"{dtype} learner sent weights of dtypes {sorted(sent)}")
    weights = {k: v.to(torch.float32).cpu().clone() for k, v in unpack_weights(packed).items()}
    del learner
    if cuda:
        torch.cuda.empty_cache()
    os.environ.pop("MASTER_PORT", None)
    return losses, norms, weights


def _rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def check_equality(*, shape: Shape, device: str, deadline: float) -> dict[str, Any]:
    """Every cell of ``CELLS`` against the first; cells past ``deadline`` (time.monotonic) are not run."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="exgrpo-device-eq-") as model_dir:
        torch.manual_seed(0)
        seq = shape.prompt_len + shape.response_len
        build_model(
            shape, dtype=torch.float32, device=torch.device("cpu"), max_positions=seq
        ).save_pretrained(model_dir)
        ref: tuple[list[float], list[float], dict[str, torch.Tensor]] | None = None
        for dtype, stage, logits in CELLS:
            if time.monotonic() > deadline:
                print(
                    f"[equality] deadline: {dtype} ZeRO-{stage} {logits} and later cells not run", flush=True
                )
                break
            t0 = time.perf_counter()
            losses, norms, weights = _run_cell(
                model_dir, shape, dtype=dtype, stage=stage, logits=logits, cuda=cuda
            )
            if ref is None:
                ref = (losses, norms, weights)
            w_diff = max(float((weights[k] - ref[2][k]).abs().max()) for k in ref[2])
            tol = TOL[dtype]
            rel_loss, rel_norm = _rel(losses, ref[0]), _rel(norms, ref[1])
            row: dict[str, Any] = {
                "dtype": dtype,
                "zero_stage": stage,
                "logits": logits,
                "losses": losses,
                "grad_norms": norms,
                "loss_rel_diff": rel_loss,
                "grad_norm_rel_diff": rel_norm,
                "max_weight_abs_diff": w_diff,
                "seconds": time.perf_counter() - t0,
            }
            row["ok"] = (
                all(math.isfinite(x) for x in norms)
                and rel_norm <= tol["rel"]
                and w_diff <= tol["weights"]
                and (dtype == "bfloat16" or rel_loss <= tol["rel"])
            )
            rows.append(row)
            print(
                f"[equality] {dtype:8s} ZeRO-{stage} {logits:7s}: grad norm rel diff "
                f"{row['grad_norm_rel_diff']:.2e}, loss rel diff {row['loss_rel_diff']:.2e}, "
                f"max |w - w_ref| {w_diff:.2e} {'ok' if row['ok'] else 'OUT OF TOLERANCE'} "
                f"({row['seconds']:.1f} s)",
                flush=True,
            )
    return {
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "reference": "float32, ZeRO-0, whole logits",
        "shape": dataclasses.asdict(shape),
        "chunk_tokens": CHUNK,
        "updates": UPDATES,
        "tolerances": TOL,
        "cells": rows,
        "all_ok": bool(rows) and len(rows) == len(CELLS) and all(r["ok"] for r in rows),
        "np_version": np.__version__,
    }
