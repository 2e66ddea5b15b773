"""Device check: one command for a GPU session, under 8 minutes, every figure into one JSON.

    python3 bench/device_check.py --out $OUT               # on the H200: 1.5B shape, bf16, CUDA
    .venv/bin/python bench/device_check.py --cpu-smoke --out /tmp/dc   # tiny shape on CPU (gloo): the logic

Part ``learner``: the project's own ``learners.learner.Learner`` (DeepSpeed ZeRO-2 at world size 1, the
    1.5B recipe's learner section, gradient checkpointing on unless ``--no-checkpointing``) on a
    Qwen2.5-1.5B-shaped random model (no download), bf16, 2 groups x 8 rollouts of 512 prompt + 7680
    response tokens (8192 per sequence) per update: tokens/s, MFU against 790 TFLOP/s, and peak memory
    against the memory plan's prediction (``bench/device_learner.py`` has the formulas). The device has
    no DeepSpeed, hjson or pydantic: carry them as wheels (``scripts/device_wheels.sh``).
Part ``equality`` (``bench/device_equality.py``): the same three updates of a small random Qwen2 model under
    ZeRO 0-3, chunked and whole lm_head log-probs, float32 and bfloat16, each against float32 ZeRO-0 with
    whole logits: loss, grad norm and weights within the stated tolerances (world size 1 on the one device).
Part ``broadcast``: the model's bf16 parameters (random values, tied embedding once) from rank 0 to
    rank 1, two processes on the one device, packed into uint8 chunks by vLLM's rule (a chunk closes
    once it exceeds ``--buffer-mb``, default 1 GiB as in vLLM), through torch.distributed over a
    TCPStore on 127.0.0.1 (NCCL on CUDA, gloo on CPU). NCCL normally refuses two ranks on one GPU;
    then that is printed loudly and the fallback figure is CUDA IPC (torch.multiprocessing hands rank 1
    the packed chunks; it copies them into its own buffers). The IPC pair always runs, so both figures
    appear when NCCL works. A device-to-device memcpy floor (one ``copy_`` of the whole state) is
    measured in the same run. GB/s count each byte once (a copy reads and writes it: the traffic is
    twice that). Every chunk is checksummed on both sides (int16 words: sum and position-weighted sum).
Each part runs in its own spawned process(es) under a hard time limit (killed past it, the part
recorded as failed, the other part still runs); the whole run stays under ``--budget-s``. The JSON
goes to ``--out`` (a ``.json`` path, or a folder that gets ``device_check.json``). Exit status 1 when a
part failed (no figure), 0 otherwise, also when only the NCCL attempt failed and IPC stood in.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import queue
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.device_equality import GPU_EQ_SHAPE, check_equality  # noqa: E402
from bench.device_learner import GPU_SHAPE, PEAK_TFLOPS, SMOKE_SHAPE, check_learner  # noqa: E402
from bench.gpu_learner import Shape, _sync, build_model  # noqa: E402

GB = 1e9
ERROR_GRACE_S = 15.0  # after one rank of a pair fails, how long the other may still report


# ------------------------------------------------------------------------------------------ broadcast
Spec = tuple[str, tuple[int, ...], str]  # name, shape, torch dtype name


def state_specs(shape: Shape, dtype: torch.dtype) -> list[Spec]:
    """The ``shape`` model's parameters (meta device: no memory, no download), the tied embedding once."""
    model = build_model(shape, dtype=dtype, device=torch.device("meta"))
    return [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in model.named_parameters()]


def _nbytes(spec: Spec) -> int:
    return math.prod(spec[1]) * getattr(torch, spec[2]).itemsize


def chunk_plan(specs: Sequence[Spec], buffer_bytes: int) -> list[list[int]]:
    """vLLM's packing rule (``pack_tensors``): tensors in order, a chunk closes once it exceeds the buffer."""
    chunks: list[list[int]] = [[]]
    size = 0
    for i, spec in enumerate(specs):
        chunks[-1].append(i)
        size += _nbytes(spec)
        if size > buffer_bytes:
            chunks.append([])
            size = 0
    return [c for c in chunks if c]


def checksum(flat: torch.Tensor) -> tuple[int, int]:
    """Sum and position-weighted sum of the buffer's int16 words (bytes when the size is odd)."""
    b = flat.detach().reshape(-1)
    words = b.view(torch.int16) if b.numel() * b.element_size() % 2 == 0 else b.view(torch.uint8)
    x = words.to(torch.int64)
    w = torch.arange(x.numel(), device=x.device, dtype=torch.int64) % 65521 + 1
    return int(x.sum()), int((x * w).sum())


def _digest(sums: Sequence[tuple[int, int]]) -> str:
    return hashlib.sha256(repr([list(s) for s in sums]).encode()).hexdigest()[:16]


def _random_state(specs: Sequence[Spec], device: torch.device) -> list[torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    return [
        torch.randn(shape, generator=g, dtype=getattr(torch, dt), device=device) for _, shape, dt in specs
    ]


def _pack(tensors: Sequence[torch.Tensor], chunk: Sequence[int]) -> torch.Tensor:
    """One packed chunk: the tensors' bytes, concatenated (uint8, as vLLM packs them)."""
    return torch.cat([tensors[i].reshape(-1).view(torch.uint8) for i in chunk])


def memcpy_floor(nbytes: int, device: torch.device, reps: int) -> dict[str, Any]:
    """Best of ``reps`` copies of an ``nbytes`` buffer into another on ``device`` (after one warm-up)."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - t0)
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"bytes": nbytes, "seconds": times, "gb_per_s": nbytes / min(times) / GB}


def _device(kind: str) -> torch.device:
    if kind == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    torch.set_num_threads(1)
    return torch.device("cpu")


def broadcast_rank(
    rank: int,
    *,
    port: int,
    specs: list[Spec],
    buffer_bytes: int,
    reps: int,
    kind: str,
    backend: str,
    timeout_s: float,
    report: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """One of 2 ranks: (rank 0) memcpy floor, then ``reps`` packed-chunk broadcasts 0 -> 1, timed.

    Rank 0 packs each chunk inside the timed loop (as a sender must) but without vLLM's double
    buffering (packing on one stream while the previous chunk is on the wire); ``pack_s`` is the
    packing alone. Rank 1 receives into buffers allocated once, before the timed loop."""
    import torch.distributed as dist

    dev = _device(kind)
    plan = chunk_plan(specs, buffer_bytes)
    sizes = [sum(_nbytes(specs[i]) for i in c) for c in plan]
    nbytes = sum(sizes)
    out: dict[str, Any] = {"backend": backend, "chunks": len(plan), "bytes": nbytes}
    if rank == 0:
        out["memcpy_floor"] = memcpy_floor(nbytes, dev, reps)
        report(out)  # the floor survives a failure below
        tensors = _random_state(specs, dev)
        _sync(dev)
        t0 = time.perf_counter()
        for c in plan:
            _pack(tensors, c)
        _sync(dev)
        out["pack_s"] = time.perf_counter() - t0
    else:
        bufs = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=timeout_s),
        device_id=dev if dev.type == "cuda" else None,
    )
    try:
        dist.all_reduce(
            torch.ones(1, device=dev)
        )  # the communicator is up (NCCL's same-device refusal shows here)
        _sync(dev)
        times = []
        for _ in range(reps):
            dist.all_reduce(torch.zeros(1, device=dev))  # start together
            _sync(dev)
            t0 = time.perf_counter()
            for j, c in enumerate(plan):
                dist.broadcast(_pack(tensors, c) if rank == 0 else bufs[j], src=0)
            _sync(dev)
            times.append(time.perf_counter() - t0)
        if rank == 0:
            out.update(sent_bytes=nbytes, checksum=_digest([checksum(_pack(tensors, c)) for c in plan]))
        else:
            out.update(
                received_bytes=sum(b.numel() for b in bufs), checksum=_digest([checksum(b) for b in bufs])
            )
        out.update(seconds=times, gb_per_s=nbytes / min(times) / GB)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return out


def ipc_rank(
    rank: int,
    *,
    specs: list[Spec],
    buffer_bytes: int,
    reps: int,
    kind: str,
    timeout_s: float,
    chan: Any,
    ack: Any,
    floor: bool,
    report: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Rank 0 shares its packed chunks (CUDA IPC, or shared memory on CPU); rank 1 copies them ``reps`` times
    into buffers of its own. With ``floor`` (the collective pair brought none back) rank 0 measures the
    memcpy floor first."""
    dev = _device(kind)
    plan = chunk_plan(specs, buffer_bytes)
    out: dict[str, Any] = {"method": "cuda_ipc" if kind == "cuda" else "shared_memory", "chunks": len(plan)}
    if rank == 0:
        if floor:
            out["memcpy_floor"] = memcpy_floor(sum(_nbytes(s) for s in specs), dev, reps)
            report(out)
        tensors = _random_state(specs, dev)
        flats = [_pack(tensors, c) for c in plan]
        del tensors
        nbytes = sum(f.numel() for f in flats)
        out.update(sent_bytes=nbytes, bytes=nbytes, checksum=_digest([checksum(f) for f in flats]))
        _sync(dev)
        chan.put(flats)
        ack.get(timeout=timeout_s)  # keep the memory alive until rank 1 is done with it
        return out
    t0 = time.perf_counter()
    src = chan.get(timeout=timeout_s)  # opens the IPC handles
    _sync(dev)
    out["open_s"] = time.perf_counter() - t0
    dst = [torch.empty_like(s) for s in src]
    times = []
    for _ in range(reps):
        _sync(dev)
        t0 = time.perf_counter()
        for d, s in zip(dst, src, strict=True):
            d.copy_(s)
        _sync(dev)
        times.append(time.perf_counter() - t0)
    nbytes = sum(d.numel() for d in dst)
    out.update(
        received_bytes=nbytes,
        bytes=nbytes,
        seconds=times,
        gb_per_s=nbytes / min(times) / GB,
        checksum=_digest([checksum(d) for d in dst]),
    )
    del src
    if kind == "cuda":
        torch.cuda.ipc_collect()
    ack.put(True)
    return out


# ------------------------------------------------------------------------------------------ processes
def _entry(fn: Callable[..., dict[str, Any]], rank: int | None, kwargs: dict[str, Any], results: Any) -> None:
    """Child process body: run ``fn`` and put ("ok"|"error", rank, result or partial, error text)."""
    partial: dict[str, Any] = {}

    def report(d: dict[str, Any]) -> None:
        partial.update(d)

    try:
        extra = {"report": report} if rank is not None else {}
        res = fn(rank, **kwargs, **extra) if rank is not None else fn(**kwargs)
        results.put(("ok", rank, res, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the part loudly
        text = f"{type(exc).__name__}: {exc}"
        print(f"[rank {rank}] FAILED: {text}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        results.put(("error", rank, partial, text))


def run_processes(
    fn: Callable[..., dict[str, Any]],
    ranks: Sequence[int | None],
    kwargs: dict[str, Any],
    timeout_s: float,
    ctx: Any,
) -> dict[Any, tuple[str, dict[str, Any], str | None]]:
    """Spawn one process per rank, collect each one's report until ``timeout_s`` (or ``ERROR_GRACE_S``
    after a rank failed), kill what is left."""
    results = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, kwargs, results), daemon=False) for r in ranks]
    for p in procs:
        p.start()
    begin = time.monotonic()
    deadline = begin + timeout_s
    got: dict[Any, tuple[str, dict[str, Any], str | None]] = {}
    while len(got) < len(ranks) and time.monotonic() < deadline:
        try:
            status, rank, res, err = results.get(timeout=0.5)
            got[rank] = (status, res, err)
            who = fn.__name__ if rank is None else f"{fn.__name__} rank {rank}"
            print(f"[device_check] {who}: {status} after {time.monotonic() - begin:.1f} s", flush=True)
            if status != "ok":  # the others are likely stuck waiting for this one: a short grace
                deadline = min(deadline, time.monotonic() + ERROR_GRACE_S)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                try:  # a last message may still be in the pipe
                    status, rank, res, err = results.get(timeout=2.0)
                    got[rank] = (status, res, err)
                    continue
                except queue.Empty:
                    break
    for r, p in zip(ranks, procs, strict=True):
        p.join(timeout=10.0 if r in got else 0.1)  # a reported rank may take a while to exit
        if p.is_alive():
            print(
                f"[device_check] killing rank {r} (pid {p.pid}): past its time limit",
                file=sys.stderr,
                flush=True,
            )
            p.kill()
            p.join(timeout=5.0)
        if r not in got:
            why = "time limit" if time.monotonic() >= deadline else f"exit code {p.exitcode}"
            got[r] = ("error", {}, f"no report ({why})")
    return got


def check_broadcast(
    *,
    shape: Shape,
    kind: str,
    backend: str,
    dtype: torch.dtype,
    buffer_mb: float,
    reps: int,
    timeout_s: float,
    ctx: Any,
) -> dict[str, Any]:
    """The collective pair, then the IPC pair; each within half of ``timeout_s``."""
    specs = state_specs(shape, dtype)
    buffer_bytes = int(buffer_mb * 2**20)
    half = timeout_s / 2
    store = torch.distributed.TCPStore(
        "127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=half)
    )
    common = dict(specs=specs, buffer_bytes=buffer_bytes, reps=reps, kind=kind, timeout_s=half)
    start = time.monotonic()
    coll = run_processes(
        broadcast_rank, [0, 1], {**common, "port": store.port, "backend": backend}, half, ctx
    )
    out: dict[str, Any] = {
        "params": sum(math.prod(s[1]) for s in specs),
        "tensors": len(specs),
        "dtype": str(dtype).removeprefix("torch."),
        "buffer_mb": buffer_mb,
        "memcpy_floor": coll[0][1].get("memcpy_floor"),
    }
    if all(status == "ok" for status, _, _ in coll.values()):
        send, recv = coll[0][1], coll[1][1]
        out["collective"] = {
            **{k: v for k, v in send.items() if k != "memcpy_floor"},
            "receiver_seconds": recv["seconds"],
            "gb_per_s": recv["gb_per_s"],  # the receiver's clock: bytes landed
            "sender_gb_per_s": send["gb_per_s"],
            "received_bytes": recv["received_bytes"],
            "checksum_received": recv["checksum"],
            "checksum_match": send["checksum"] == recv["checksum"]
            and send["sent_bytes"] == recv["received_bytes"],
        }
        out["ran"] = backend
    else:
        errors = {r: e for r, (status, _, e) in coll.items() if status != "ok"}
        out["collective"] = {"backend": backend, "error": errors}
        print(
            "\n"
            + "!" * 100
            + f"\n!!! {backend.upper()} BROADCAST BETWEEN TWO PROCESSES ON ONE DEVICE FAILED: "
            f"{errors}\n!!! falling back to the memcpy floor + {'CUDA IPC' if kind == 'cuda' else 'shm'}\n"
            + "!" * 100
            + "\n",
            flush=True,
        )
    chan, ack = ctx.Queue(), ctx.Queue()
    left = max(10.0, timeout_s - (time.monotonic() - start))
    kw = {**common, "timeout_s": left, "chan": chan, "ack": ack, "floor": out["memcpy_floor"] is None}
    ipc = run_processes(ipc_rank, [0, 1], kw, left, ctx)
    out["memcpy_floor"] = out["memcpy_floor"] or ipc[0][1].get("memcpy_floor")
    if all(status == "ok" for status, _, _ in ipc.values()):
        send, recv = ipc[0][1], ipc[1][1]
        out["ipc"] = {
            **recv,
            "checksum_sent": send["checksum"],
            "sent_bytes": send["sent_bytes"],
            "checksum_match": send["checksum"] == recv["checksum"]
            and send["sent_bytes"] == recv["received_bytes"],
        }
        out.setdefault("ran", out["ipc"]["method"])
    else:
        out["ipc"] = {"error": {r: e for r, (status, _, e) in ipc.items() if status != "ok"}}
    problems = [] if "ran" in out else ["neither the collective nor the IPC pair ran"]
    problems += [
        f"{name}: the received bytes differ from the sent ones"
        for name in ("collective", "ipc")
        if out[name].get("checksum_match") is False
    ]
    if problems:
        out["error"] = "; ".join(problems)  # main() fails the part, keeping its figures
    floor = out["memcpy_floor"]
    print(
        f"[broadcast] {out['params'] / 1e9:.3f} B params, ran: {out['ran']}; "
        + "; ".join(
            f"{k} {out[k]['gb_per_s']:.1f} GB/s" for k in ("collective", "ipc") if "gb_per_s" in out[k]
        )
        + (f"; memcpy floor {floor['gb_per_s']:.1f} GB/s" if floor else "; no memcpy floor"),
        flush=True,
    )
    return out


# ------------------------------------------------------------------------------------------ main
def _nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a version string is not worth a failed run
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def main(argv: list[str] | None = None) -> int:
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
        "--parts", default="equality,learner,broadcast", help="comma-separated: equality, learner, broadcast"
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
    parser.add_argument("--broadcast-timeout-s", type=float, default=150.0, help="both pairs together")
    parser.add_argument("--budget-s", type=float, default=450.0, help="whole run (parts are cut to fit)")
    args = parser.parse_args(argv)

    begin = time.monotonic()
    smoke = args.cpu_smoke
    kind = "cuda" if not smoke and torch.cuda.is_available() else "cpu"
    if not smoke and kind == "cpu":
        print("[device_check] no CUDA device: use --cpu-smoke for the CPU logic check", file=sys.stderr)
        return 2
    shape = SMOKE_SHAPE if smoke else GPU_SHAPE
    if args.micro_batch is not None:
        shape = dataclasses.replace(shape, micro_batch=args.micro_batch)
    dtype = args.dtype
    backend = (
        args.collective_backend if args.collective_backend != "auto" else "nccl" if kind == "cuda" else "gloo"
    )
    if kind == "cuda":
        os.environ.setdefault("NCCL_DEBUG", "WARN")  # NCCL's own reason, should it refuse
    warm = args.warm if args.warm is not None else (1 if smoke else 2)
    timed = args.timed if args.timed is not None else (2 if smoke else 4)
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
        timeouts = {"learner": args.learner_timeout_s, "equality": args.equality_timeout_s}
        limit = min(timeouts.get(part, args.broadcast_timeout_s), remaining())
        try:
            if limit < 10:
                raise TimeoutError(f"only {limit:.0f} s of the budget left")
            if part == "equality":
                kw = dict(
                    shape=SMOKE_SHAPE if smoke else GPU_EQ_SHAPE, device="cuda:0" if kind == "cuda" else "cpu"
                )
                kw["deadline"] = time.monotonic() + limit - 20  # the child skips cells past it
                got = run_processes(check_equality, [None], kw, limit, ctx)[None]
                if got[0] != "ok":
                    raise RuntimeError(got[2])
                report["parts"][part] = got[1]
                if not got[1]["all_ok"]:
                    raise RuntimeError("a cell is out of tolerance or did not run (see parts.equality.cells)")
            elif part == "learner":
                kw = dict(
                    shape=shape,
                    device="cuda:0" if kind == "cuda" else "cpu",
                    dtype=dtype,
                    warm=warm,
                    timed=timed,
                    checkpointing=not args.no_checkpointing,
                    peak_flops=args.peak_tflops * 1e12,
                    zero_stage=args.zero_stage,
                )
                # the child stops timing at its deadline; the kill comes 20 s later
                kw["deadline"] = time.monotonic() + limit - 20
                got = run_processes(check_learner, [None], kw, limit, ctx)[None]
                if got[0] != "ok":
                    raise RuntimeError(got[2])
                report["parts"][part] = got[1]
            elif part == "broadcast":
                result = check_broadcast(
                    shape=shape,
                    kind=kind,
                    backend=backend,
                    dtype=getattr(torch, dtype),
                    buffer_mb=args.buffer_mb if not smoke else 0.05,
                    reps=args.reps,
                    timeout_s=limit,
                    ctx=ctx,
                )
                report["parts"][part] = result
                if "error" in result:
                    raise RuntimeError(result["error"])
            else:
                raise ValueError(f"unknown part {part!r}")
        except Exception as exc:  # noqa: BLE001 - one part's failure must not stop the others
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
