"""Device check: one command for a GPU session, under 6 minutes, every figure into one JSON.

    python3 -m bench.learner.device_check --out $OUT                            # on the H200
    .venv/bin/python -m bench.learner.device_check --cpu-smoke --out /tmp/dc   # tiny, CPU (gloo): the logic

Parts (``--parts``): export, memory, slicing, sdpa (the default), stream, learner, equality, broadcast, each in
its own process under a hard limit; exit status 1 when a part failed. The parts, the budget and what travels to
the device: docs/benchmarks.md, "GPU device check".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

import torch

from bench.learner.device_broadcast import check_broadcast
from bench.learner.device_equality import GPU_EQ_SHAPE, check_equality
from bench.learner.device_procs import run_processes
from bench.learner.device_questions import (
    LIMITS_S,
    QUESTION_PARTS,
    PartFailed,
    add_arguments,
    run_question_part,
)
from bench.learner.gpu_learner import GPU_SHAPE, PEAK_TFLOPS, SMOKE_SHAPE, check_learner


def _nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a version string is not worth a failed run
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shape on CPU (gloo)")
    parser.add_argument(
        "--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="model and state"
    )
    parser.add_argument(
        "--collective-backend",
        default="auto",
        choices=["auto", "nccl", "gloo"],
        help="auto: nccl on CUDA, gloo on CPU (nccl with --cpu-smoke exercises the fallback)",
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="JSON path or folder")
    parser.add_argument(
        "--parts",
        default=",".join(QUESTION_PARTS),
        help="comma-separated: export, memory, slicing, sdpa (the default), stream, equality, learner, broadcast",
    )
    parser.add_argument("--equality-timeout-s", type=float, default=150.0, help="the equality part")
    parser.add_argument("--warm", type=int, default=None, help="untimed updates (GPU 2, smoke 1)")
    parser.add_argument("--timed", type=int, default=None, help="timed updates (GPU 4, smoke 2)")
    parser.add_argument(
        "--zero-stage",
        type=int,
        default=None,
        choices=[0, 1, 2, 3],
        help="learner part (default: the recipe's 2)",
    )
    parser.add_argument("--no-checkpointing", action="store_true", help="gradient checkpointing off")
    parser.add_argument(
        "--micro-batch", type=int, default=None, help="sequences per micro-batch (GPU 8, as the recipe)"
    )
    parser.add_argument(
        "--buffer-mb",
        type=float,
        default=1024.0,
        help="packed chunk size, MiB (vLLM's default buffer: 1 GiB)",
    )
    parser.add_argument("--reps", type=int, default=3, help="timed broadcasts / copies")
    parser.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS, help="MFU denominator")
    parser.add_argument("--learner-timeout-s", type=float, default=240.0)
    parser.add_argument(
        "--stream-size", type=int, default=None, help="stream part's square weight (GPU 8192)"
    )
    parser.add_argument("--stream-reps", type=int, default=3, help="stream part's steps per mode")
    parser.add_argument("--stream-timeout-s", type=float, default=60.0, help="the stream part")
    parser.add_argument("--broadcast-timeout-s", type=float, default=150.0, help="both pairs together")
    parser.add_argument("--budget-s", type=float, default=340.0, help="whole run (parts are cut to fit)")
    add_arguments(parser)
    return parser


def _run_part(part: str, args: argparse.Namespace, *, kind: str, limit: float, ctx: Any) -> dict[str, Any]:
    """One part's result, in spawned processes under ``limit`` seconds; raises when it failed."""
    smoke, device = args.cpu_smoke, "cuda:0" if kind == "cuda" else "cpu"
    shape = SMOKE_SHAPE if smoke else GPU_SHAPE
    if args.micro_batch is not None:
        shape = dataclasses.replace(shape, micro_batch=args.micro_batch)
    deadline = (
        time.monotonic() + limit - 20
    )  # the child stops timing (skips cells) past it; the kill comes later
    if part in ("equality", "learner"):
        if part == "equality":
            fn: Any = check_equality
            kw: dict[str, Any] = dict(shape=SMOKE_SHAPE if smoke else GPU_EQ_SHAPE, device=device)
        else:
            fn = check_learner
            kw = dict(
                shape=shape,
                device=device,
                dtype=args.dtype,
                warm=args.warm if args.warm is not None else (1 if smoke else 2),
                timed=args.timed if args.timed is not None else (2 if smoke else 4),
                checkpointing=not args.no_checkpointing,
                peak_flops=args.peak_tflops * 1e12,
                zero_stage=args.zero_stage,
            )
        status, result, error = run_processes(fn, [None], {**kw, "deadline": deadline}, limit, ctx)[None]
        if status != "ok":
            raise RuntimeError(error)
        if part == "equality" and not result["all_ok"]:
            raise RuntimeError("a cell is out of tolerance or did not run (see parts.equality.cells)")
        return result
    if part == "stream":
        from bench.learner.carry_vllm import CARRY, carry
        from bench.learner.device_stream import check_stream

        if smoke and not (CARRY / "vllm").exists():
            carry()  # the smoke checks the carried set the device imports

        size = args.stream_size if args.stream_size is not None else (256 if smoke else 8192)
        kw = dict(device=device, size=size, reps=args.stream_reps, prefer_carry=args.prefer_carry or smoke)
        status, result, error = run_processes(check_stream, [None], kw, limit, ctx)[None]
        if status != "ok":
            raise RuntimeError(error)
        if not result["wait_ok"]:
            raise PartFailed("the push read weights the step had not yet written, after the wait", result)
        return result
    if part == "broadcast":
        coll = args.collective_backend
        result = check_broadcast(
            shape=shape,
            kind=kind,
            backend=coll if coll != "auto" else "nccl" if kind == "cuda" else "gloo",
            dtype=getattr(torch, args.dtype),
            buffer_mb=args.buffer_mb if not smoke else 0.05,
            reps=args.reps,
            timeout_s=limit,
            ctx=ctx,
        )
        if "error" in result:
            raise RuntimeError(result["error"])
        return result
    raise ValueError(f"unknown part {part!r}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    begin = time.monotonic()
    smoke = args.cpu_smoke
    kind = "cuda" if not smoke and torch.cuda.is_available() else "cpu"
    if not smoke and kind == "cpu":
        print("[device_check] no CUDA device: use --cpu-smoke for the CPU logic check", file=sys.stderr)
        return 2
    if kind == "cuda":
        os.environ.setdefault("NCCL_DEBUG", "WARN")  # NCCL's own reason, should it refuse
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    ctx = torch.multiprocessing.get_context("spawn")
    import transformers

    report: dict[str, Any] = {
        "mode": "cpu-smoke" if smoke else "cuda",
        "device": torch.cuda.get_device_name(0) if kind == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": _nccl_version() if kind == "cuda" else None,
        "transformers": transformers.__version__,
        "parts": {},
        "errors": {},
    }
    print(
        f"[device_check] {report['mode']} on {report['device']}, torch {report['torch']}, parts {parts}",
        flush=True,
    )

    def remaining() -> float:
        return args.budget_s - (time.monotonic() - begin)

    for part in parts:
        t0 = time.monotonic()
        timeouts = {
            "learner": args.learner_timeout_s,
            "equality": args.equality_timeout_s,
            "stream": args.stream_timeout_s,
        }
        timeouts.update({p: getattr(args, f"{p}_timeout_s") for p in LIMITS_S})
        limit = min(timeouts.get(part, args.broadcast_timeout_s), remaining())
        try:
            if limit < 10:
                raise TimeoutError(f"only {limit:.0f} s of the budget left")
            if part in QUESTION_PARTS:
                report["parts"][part] = run_question_part(part, args, kind=kind, limit=limit, ctx=ctx)
            else:
                report["parts"][part] = _run_part(part, args, kind=kind, limit=limit, ctx=ctx)
        except Exception as exc:  # noqa: BLE001 - one part's failure must not stop the others
            if isinstance(exc, PartFailed) and exc.result:
                report["parts"][part] = exc.result  # the figures it has
            report["errors"][part] = f"{type(exc).__name__}: {exc}"
            print(f"\n!!! PART {part} FAILED: {report['errors'][part]}\n", file=sys.stderr, flush=True)
        print(f"[device_check] part {part}: {time.monotonic() - t0:.1f} s", flush=True)
    report["wall_s"] = time.monotonic() - begin
    text = json.dumps(report, indent=1, default=str)
    path = args.out if args.out.endswith(".json") else os.path.join(args.out, "device_check.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")
    print(text, flush=True)
    print(
        f"[device_check] wrote {path} in {report['wall_s']:.1f} s; failed parts: {sorted(report['errors'])}",
        flush=True,
    )
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
