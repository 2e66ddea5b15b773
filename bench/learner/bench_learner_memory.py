"""Peak memory of learner updates beside the memory plan (``exgrpo.runtime.memory_plan.learner_terms``). On CPU,
one update's backward with whole logits and no checkpointing ("before") against chunked logits and checkpointing
("after"), each in a fresh process (peak RSS; ``--tensors``: the tensors' own peak), with their loss and gradients'
max abs difference; ``check_memory`` is the device check's memory part (7B layer shapes, the 7B recipe, peaks).

    python -m bench.learner.bench_learner_memory [--vocab 32000 --hidden 256 --layers 2 --rows 4 --response 1024] [--tensors]
    python -m bench.learner.bench_learner_memory --slope   # bytes per position x vocabulary entry of a logits chunk
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
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

CONFIGS = {"before": (None, False), "after": (1024, True)}  # (logits_chunk_tokens, checkpointing)


def _record_and_backward(objective: Any, losses: list[float]) -> None:
    losses.append(float(objective.detach()))
    objective.backward()


def workload(
    *, vocab: int, hidden: int, layers: int, rows: int, response: int, dtype: str, checkpointing: bool
) -> tuple[Any, Callable[[int | None, list[float]], None]]:
    """A random Qwen2 of these sizes and ``rows`` random rows of 16 + ``response`` tokens; returns the model
    and ``backward(chunk_tokens, losses)``, one mini-batch's backward as the learner runs it (one micro-batch,
    clipping on, entropy bonus on), appending its objective to ``losses``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import learners.update as U
    from exgrpo.core.config import LossConfig
    from learners import batches
    from learners.engine import ModelEngine
    from learners.modeling import set_checkpointing

    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=hidden // 4,
        max_position_embeddings=response + 64,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(getattr(torch, dtype))
    set_checkpointing(model, checkpointing)
    g = torch.Generator().manual_seed(1)
    data = [
        batches.Row(
            prompt_ids=tuple(torch.randint(vocab, (16,), generator=g).tolist()),
            response_ids=tuple(torch.randint(vocab, (response,), generator=g).tolist()),
            behaviour=tuple((-torch.rand(response, generator=g) * 5).tolist()),
            advantage=(-1.0) ** i,
        )
        for i in range(rows)
    ]
    old_logp, _ = U.old_logprobs(data, response, None, tis_cap=None)
    cpu = torch.device("cpu")

    def backward(chunk_tokens: int | None, losses: list[float]) -> None:
        engine = ModelEngine(model, micro_batch_size=rows, chunk_tokens=chunk_tokens)
        engine.backward = lambda objective: _record_and_backward(objective, losses)  # type: ignore[method-assign]
        mb = U.MiniBatch(data, old_logp, None, r_max=response, totals=U.minibatch_totals(data, device=cpu))
        U.minibatch_backward(
            engine,
            mb,
            loss=LossConfig(entropy_coef=0.01),
            max_response_len=response,
            clip=True,
            proximal_is_current=True,
        )

    return model, backward


def one(args: argparse.Namespace, name: str, out: str) -> None:
    torch.set_num_threads(2)
    chunk, ckpt = CONFIGS[name]
    model, backward = workload(
        vocab=args.vocab,
        hidden=args.hidden,
        layers=args.layers,
        rows=args.rows,
        response=args.response,
        dtype=args.dtype,
        checkpointing=ckpt,
    )
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    total: list[float] = []

    def update() -> None:
        backward(chunk, total)

    tensor_peak = None
    if args.tensors:
        tensor_peak = tensor_peak_bytes(update)
    else:
        update()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    torch.save(
        {
            "loss": sum(total),
            "grads": grads,
            "base_mb": base / 1024,
            "peak_mb": peak_rss / 1024,
            "tensor_peak_mb": None if tensor_peak is None else tensor_peak / 2**20,
        },
        out,
    )


def tensor_peak_bytes(fn) -> int:  # noqa: ANN001
    """Peak bytes of the tensors ``fn`` allocates (what is alive before it is not counted), from torch's
    profiler: every op's own allocations and frees in the order the ops started. Unlike the process's RSS it
    holds no allocator caching or fragmentation, so it is what a GPU's ``max_memory_allocated`` reads."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    live = top = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        top = max(top, live)
    return top


def predicted_mb(args: argparse.Namespace, name: str) -> float:
    """The plan's gradients + activations + logits for this shape and configuration, MB (2^20 bytes). The
    gradients are the model-dtype ones (P x bytes) that this plain backward makes: for bfloat16 the plan adds a
    float32 partition (DeepSpeed's, ZeRO >= 1) that no DeepSpeed engine makes here."""
    from exgrpo.core.config import from_dict
    from exgrpo.runtime.memory_plan import DTYPE_BYTES, Shape, learner_terms

    chunk, ckpt = CONFIGS[name]
    cfg = from_dict(
        {
            "model": {"dtype": args.dtype, "max_prompt_len": 16, "max_response_len": args.response},
            "learners": {
                "micro_batch_size": args.rows,
                "zero_stage": 0 if args.dtype == "float32" else 1,  # bfloat16 needs ZeRO >= 1 (the config)
                "gradient_checkpointing": "on" if ckpt else "off",
                "logits_chunk_tokens": chunk or args.rows * (16 + args.response),
            },
        }
    )
    h = args.hidden
    shape = Shape(
        hidden=h,
        intermediate=2 * h,
        layers=args.layers,
        heads=4,
        kv_heads=4,
        vocab=args.vocab,
        tied=False,
        qkv_bias=True,
    )
    terms = learner_terms(cfg, shape, on_gpu=False, chunked=chunk is not None)
    gradients = shape.params * DTYPE_BYTES[args.dtype]
    return (gradients + terms["activations"] + terms["logits"]) / 2**20


def chunk_slope(dtype_name: str, *, vocab: int = 32000, hidden: int = 256, response: int = 512) -> None:
    """The tensors' peak of a checkpointed update of 2 rows at logits chunks of 128, 256 and 512 positions, and
    its slope in bytes per position and vocabulary entry: what ``memory_plan.CHUNK_BYTES`` models."""
    torch.set_num_threads(1)
    _, backward = workload(
        vocab=vocab, hidden=hidden, layers=2, rows=2, response=response, dtype=dtype_name, checkpointing=True
    )
    peaks = {}
    for chunk in (128, 256, 512):
        backward(chunk, [])  # the gradients exist before the measured update, as in training
        peaks[chunk] = tensor_peak_bytes(lambda chunk=chunk: backward(chunk, []))
    slopes = [(peaks[b] - peaks[a]) / ((b - a) * vocab) for a, b in ((128, 256), (256, 512))]
    mb = ", ".join(f"{c}: +{p / 2**20:.1f} MB" for c, p in peaks.items())
    print(f"{dtype_name}: tensors' peak by chunk size {mb}; slope {slopes[0]:.1f}, {slopes[1]:.1f} bytes")


# ---------------------------------------------------------------------- the device check's memory part
REPORTED = "zero_stage micro_batch_size max_tokens_per_micro_batch logits_chunk_tokens gradient_checkpointing minibatches"


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
    """The device check's memory part: the learner of ``sizes`` under the 7B recipe's learner section at world
    size 1, set up, then ``updates`` updates (the first allocates the optimiser's moments), with the peaks of
    set-up, forward/backward and optimiser step beside the plan's terms (docs/benchmarks.md, "memory")."""

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
        "learner_config": {k: getattr(cfg.learners, k) for k in REPORTED.split()},
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--response", type=int, default=1024)
    ap.add_argument(
        "--tensors",
        action="store_true",
        help="also the tensors' own peak (torch profiler; slower, and the RSS then includes the profiler)",
    )
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="model and gradients")
    ap.add_argument("--slope", action="store_true", help="only the logits chunk's bytes per element")
    ap.add_argument("--one", choices=sorted(CONFIGS))
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.one:
        one(args, args.one, args.out)
        return
    if args.slope:
        for dtype_name in ("float32", "bfloat16"):
            chunk_slope(dtype_name, vocab=args.vocab, hidden=args.hidden)
        return
    root = Path(__file__).resolve().parents[2]
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CONFIGS:
            out = f"{tmp}/{name}.pt"
            cmd = [sys.executable, "-m", "bench.learner.bench_learner_memory", "--one", name, "--out", out]
            cmd += sys.argv[1:]
            subprocess.run(
                cmd, check=True, cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root)}
            )
            res[name] = torch.load(out)
    shape = f"{args.dtype}, vocab {args.vocab}, hidden {args.hidden}, {args.layers} layers, {args.rows} rows x {args.response} tokens"
    print(f"one update ({shape}), peak RSS in a fresh process (MB):")
    for name, (chunk, ckpt) in CONFIGS.items():
        r = res[name]
        print(
            f"  {name:6s} logits_chunk_tokens={chunk} checkpointing={ckpt}: peak {r['peak_mb']:.0f} MB "
            f"(model + inputs {r['base_mb']:.0f} MB; update +{r['peak_mb'] - r['base_mb']:.0f} MB, "
            f"the memory plan predicts +{predicted_mb(args, name):.0f} MB)"
            + ("" if r["tensor_peak_mb"] is None else f"; tensors' own peak +{r['tensor_peak_mb']:.0f} MB")
        )
    print(
        json.dumps(
            {
                "loss_max_abs_diff": abs(res["before"]["loss"] - res["after"]["loss"]),
                "grad_max_abs_diff": float((res["before"]["grads"] - res["after"]["grads"]).abs().max()),
            }
        )
    )


if __name__ == "__main__":
    main()
