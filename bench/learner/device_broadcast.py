"""The device check's broadcast part: a model's packed weights from one process to another on the one device
(torch NCCL, or CUDA IPC where NCCL refuses two ranks on one GPU), beside a memcpy floor; every chunk checksummed
on both sides. How it measures: docs/benchmarks.md, "GPU device check".
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch

from bench.common import synchronize
from bench.learner.device_procs import run_processes
from bench.learner.gpu_learner import Shape, build_model
from exgrpo.transport.packed import chunk_cuts

GB = 1e9


# ------------------------------------------------------------------------------------------ broadcast
Spec = tuple[str, tuple[int, ...], str]  # name, shape, torch dtype name


def state_specs(shape: Shape, dtype: torch.dtype) -> list[Spec]:
    """The ``shape`` model's parameters (meta device: no memory, no download), the tied embedding once."""
    model = build_model(shape, dtype=dtype, device=torch.device("meta"))
    return [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in model.named_parameters()]


def _nbytes(spec: Spec) -> int:
    return math.prod(spec[1]) * getattr(torch, spec[2]).itemsize


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
        synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
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
    plan = chunk_cuts([_nbytes(s) for s in specs], buffer_bytes)
    sizes = [sum(_nbytes(specs[i]) for i in c) for c in plan]
    nbytes = sum(sizes)
    out: dict[str, Any] = {"backend": backend, "chunks": len(plan), "bytes": nbytes}
    if rank == 0:
        out["memcpy_floor"] = memcpy_floor(nbytes, dev, reps)
        report(out)  # the floor survives a failure below
        tensors = _random_state(specs, dev)
        synchronize(dev)
        t0 = time.perf_counter()
        for c in plan:
            _pack(tensors, c)
        synchronize(dev)
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
        synchronize(dev)
        times = []
        for _ in range(reps):
            dist.all_reduce(torch.zeros(1, device=dev))  # start together
            synchronize(dev)
            t0 = time.perf_counter()
            for j, c in enumerate(plan):
                dist.broadcast(_pack(tensors, c) if rank == 0 else bufs[j], src=0)
            synchronize(dev)
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
    plan = chunk_cuts([_nbytes(s) for s in specs], buffer_bytes)
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
        synchronize(dev)
        chan.put(flats)
        ack.get(timeout=timeout_s)  # keep the memory alive until rank 1 is done with it
        return out
    t0 = time.perf_counter()
    src = chan.get(timeout=timeout_s)  # opens the IPC handles
    synchronize(dev)
    out["open_s"] = time.perf_counter() - t0
    dst = [torch.empty_like(s) for s in src]
    times = []
    for _ in range(reps):
        synchronize(dev)
        t0 = time.perf_counter()
        for d, s in zip(dst, src, strict=True):
            d.copy_(s)
        synchronize(dev)
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
