"""The device check's parts for issue 41's open GPU questions, each in its own process under a hard limit
(``bench/learner/device_procs.py``), dispatched from ``bench/learner/device_check.py``: export
(``device_export.py``), memory (``bench_learner_memory.py``), slicing (``device_slicing.py``) and sdpa
(``device_sdpa.py``). Sizes: ``device_shapes.QWEN7B`` on the GPU (``--layers-7b`` layers, 4 for the memory part),
``SMOKE`` with ``--cpu-smoke``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from bench.learner.device_procs import run_processes
from bench.learner.device_shapes import QWEN7B, SMOKE, Sizes, with_layers

QUESTION_PARTS = ("export", "memory", "slicing", "sdpa")
LIMITS_S = {"export": 140.0, "memory": 110.0, "slicing": 50.0, "sdpa": 40.0}  # 340 s in all


class PartFailed(RuntimeError):
    """A part that ran but failed its check: the figures it has are kept in the report."""

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers-7b", type=int, default=None, help="7B-shaped layers (GPU 2)")
    parser.add_argument("--memory-layers", type=int, default=None, help="memory part's layers (GPU 4)")
    parser.add_argument(
        "--export-buffer-mb", type=float, default=None, help="vLLM's packed buffer (GPU 1024, its default)"
    )
    parser.add_argument("--export-buffers", type=int, default=2, help="vLLM's packed_num_buffers")
    parser.add_argument("--export-reps", type=int, default=None, help="producer-only pushes (GPU 3)")
    parser.add_argument("--memory-updates", type=int, default=2, help="updates of the memory part")
    parser.add_argument("--slicing-groups", type=int, default=None, help="groups of 8 rollouts (GPU 8)")
    parser.add_argument("--sdpa-rows", type=int, default=4, help="rows of the SDPA micro-batch")
    parser.add_argument(
        "--prefer-carry", action="store_true", help="vLLM's carried files even where vLLM is installed"
    )
    for part, limit in LIMITS_S.items():
        parser.add_argument(f"--{part}-timeout-s", type=float, default=limit, help=f"the {part} part")


def _sizes(args: argparse.Namespace, *, memory: bool = False) -> Sizes:
    base = SMOKE if args.cpu_smoke else QWEN7B
    layers = args.memory_layers if memory else args.layers_7b
    if layers is None and memory and not args.cpu_smoke:
        layers = 4
    return with_layers(base, layers)


def _one(fn: Any, kw: dict[str, Any], limit: float, ctx: Any) -> dict[str, Any]:
    status, result, error = run_processes(fn, [None], kw, limit, ctx)[None]
    if status != "ok":
        raise PartFailed(str(error), result)
    return result


def _export(args: argparse.Namespace, device: str, limit: float, ctx: Any) -> dict[str, Any]:
    """ZeRO-2, then ZeRO-3: on the GPU each in its own process (half the limit each, the second gets what the
    first left); the smoke runs both in one process (its time is mostly the processes' imports)."""
    from bench.learner.carry_vllm import CARRY, carry
    from bench.learner.device_export import check_export

    smoke = args.cpu_smoke
    prefer_carry = args.prefer_carry or smoke  # the smoke checks the carried set the device imports
    if smoke and not (CARRY / "vllm").exists():
        carry()
    buffer_mb = args.export_buffer_mb if args.export_buffer_mb is not None else (0.05 if smoke else 1024.0)
    out: dict[str, Any] = {"stages": {}, "errors": {}}
    begin = time.monotonic()
    runs: list[tuple[int, ...]] = [(2, 3)] if smoke else [(2,), (3,)]
    for i, stages in enumerate(runs):
        share = (limit - (time.monotonic() - begin)) / (len(runs) - i)
        kw = dict(
            sizes=_sizes(args),
            stages=stages,
            device=device,
            buffer_bytes=int(buffer_mb * 2**20),
            num_buffers=args.export_buffers,
            reps=args.export_reps if args.export_reps is not None else (2 if smoke else 3),
            deadline=time.monotonic() + share - 20,
            prefer_carry=prefer_carry,
        )
        names = [f"zero{z}" for z in stages]
        try:
            out["stages"].update(_one(check_export, kw, share, ctx))
        except PartFailed as exc:
            out["errors"].update({n: str(exc) for n in names})
    for name, res in out["stages"].items():
        if not res["bytes_equal"]:
            out["errors"][name] = "received bytes differ from the state dict"
    if out["errors"]:
        raise PartFailed(f"export: {out['errors']}", out)
    return out


def run_question_part(
    part: str, args: argparse.Namespace, *, kind: str, limit: float, ctx: Any
) -> dict[str, Any]:
    """One of ``QUESTION_PARTS`` in spawned processes under ``limit`` seconds; raises when it failed."""
    device = "cuda:0" if kind == "cuda" else "cpu"
    smoke = args.cpu_smoke
    deadline = time.monotonic() + limit - 20  # the child stops timing past it; the kill comes later
    if part == "export":
        return _export(args, device, limit, ctx)
    if part == "memory":
        from bench.learner.bench_learner_memory import check_memory

        kw: dict[str, Any] = dict(
            sizes=_sizes(args, memory=True), device=device, updates=args.memory_updates, deadline=deadline
        )
        return _one(check_memory, kw, limit, ctx)
    if part == "slicing":
        from bench.learner.device_slicing import check_slicing

        groups = args.slicing_groups if args.slicing_groups is not None else (2 if smoke else 8)
        kw = dict(
            sizes=_sizes(args),
            device=device,
            groups=groups,
            rollouts=8,
            reps=1,
            deadline=deadline,
        )
        return _one(check_slicing, kw, limit, ctx)
    if part == "sdpa":
        from bench.learner.device_sdpa import check_sdpa

        sizes = _sizes(args)
        if smoke:  # the smoke's attention layer: 7B's head ratio at a CPU's size
            sizes = dataclasses.replace(sizes, hidden=7 * 32, heads=7, kv_heads=1)
        kw = dict(sizes=sizes, device=device, rows=args.sdpa_rows, reps=1 if smoke else 3)
        return _one(check_sdpa, kw, limit, ctx)
    raise ValueError(f"unknown part {part!r}")
