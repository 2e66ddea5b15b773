"""The device check's stream part: does the collective push wait for the optimiser step? (``check_stream``:
vLLM's producer over the transport's ``LearnerSource`` reads a weight right after a queued step, with and without
``WeightPusher.wait_for_step``.) How it decides: docs/benchmarks.md, "GPU device check".
"""

from __future__ import annotations

import time
from typing import Any

import torch

from bench.common import synchronize
from bench.learner.carry_vllm import ensure_vllm
from bench.learner.device_export import push_packed
from bench.learner.device_shapes import setup_device

MATMULS = 4  # the gradient's chain: 4 matmuls of size^3 multiply-adds (~75 ms at 8192 on an H100 in fp32)


class _Capture:
    """A ``group`` whose broadcast keeps a copy of each packed chunk, made on the caller's (the producer's)
    stream, as NCCL would read it there."""

    def __init__(self) -> None:
        self.chunks: list[torch.Tensor] = []

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        self.chunks.append(tensor.clone())


def _push(pt: Any, source: Any) -> torch.Tensor:
    """The producer as vLLM's NCCL trainer engine calls it (``_broadcast``, packed): the bytes it sent."""
    group = _Capture()
    push_packed(pt, source, group, 2**30, 2)
    return torch.cat(group.chunks)


def check_stream(*, device: str, size: int, reps: int, prefer_carry: bool = False) -> dict[str, Any]:
    """``reps`` steps per mode; ``{"modes": {mode: {"equal": [...], "seconds": [...]}}, "race_seen": ...}``."""
    dev = setup_device(device)
    pt = ensure_vllm(prefer_carry=prefer_carry)
    if dev.type == "cpu":
        from bench.learner.device_export import cpu_streams

        cpu_streams(pt)
    from exgrpo.transport.vllm_api import LearnerSource, WeightPusher

    gen = torch.Generator(device=dev).manual_seed(0)
    layer = torch.nn.Linear(size, size, bias=False, device=dev)
    a = torch.randn(size, size, device=dev, generator=gen)
    b = torch.randn(size, size, device=dev, generator=gen) / size**0.5  # keeps the chain's scale
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    source = LearnerSource(layer)
    out: dict[str, Any] = {"size": size, "matmuls": MATMULS, "modes": {}}
    for mode in ("no_wait", "wait"):
        rec: dict[str, list[Any]] = {"equal": [], "seconds": []}
        for _ in range(reps):
            with torch.no_grad():
                layer.weight.zero_()
            synchronize(dev)
            grad = a
            for _ in range(MATMULS):  # queued on the default stream; the CPU returns at once
                grad = grad @ b
            layer.weight.grad = grad
            t0 = time.perf_counter()
            optimizer.step()  # weight = -grad, still queued
            if mode == "wait":
                WeightPusher.wait_for_step(layer)
            sent = _push(pt, source)
            synchronize(dev)
            seconds = time.perf_counter() - t0
            want = layer.weight.detach().contiguous().view(-1).view(torch.uint8)
            rec["equal"].append(bool(torch.equal(sent, want)))
            rec["seconds"].append(seconds)
        out["modes"][mode] = rec
    out["race_seen"] = not all(out["modes"]["no_wait"]["equal"])
    out["wait_ok"] = all(out["modes"]["wait"]["equal"])
    print(
        f"[stream] {size}x{size} fp32, step behind {MATMULS} matmuls: push bytes equal to the stepped weight "
        f"with the wait {sum(out['modes']['wait']['equal'])}/{reps}, without it "
        f"{sum(out['modes']['no_wait']['equal'])}/{reps} (race seen: {out['race_seen']})",
        flush=True,
    )
    return out
