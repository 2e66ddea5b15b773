"""The device check's export part: the learner's weights through vLLM 0.32's own packed-broadcast code.

``check_export`` runs the learner (ZeRO-2 or ZeRO-3, 7B layer shapes) into vLLM's packed producer, with no peer
(seconds per push and extra peak memory) and with vLLM's consumer in a second thread (the received bytes against
the state dict). How: docs/benchmarks.md, "GPU device check".
"""

from __future__ import annotations

import queue
import tempfile
import threading
import time
from functools import partial
from typing import Any

import torch

from bench.common import synchronize
from bench.learner.carry_vllm import ensure_vllm
from bench.learner.device_shapes import (
    Sizes,
    allocated,
    gib,
    peak,
    recipe_config,
    reset_peak,
    save_model,
    setup_device,
    start_learner,
    timed,
)

HANDOFF_TIMEOUT_S = 120.0  # one chunk's handover between the producer and consumer threads


class _NoStream:
    def synchronize(self) -> None:
        pass


def cpu_streams(pt: Any) -> None:
    """Let vLLM's producer and consumer run on a CPU build (this process only): no-op streams."""
    pt._get_streams = lambda idx, n: tuple(_NoStream() for _ in range(n))
    torch.accelerator.current_device_index = lambda: 0


class _Sink:
    """A ``group`` whose broadcast returns at once: the producer's own cost and memory."""

    def __init__(self) -> None:
        self.chunks, self.bytes = 0, 0

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        self.chunks += 1
        self.bytes += tensor.numel() * tensor.element_size()


class _Loopback:
    """Two ``group`` ends on one device: the producer's broadcast hands its packed buffer over and waits
    until the consumer's broadcast has copied it into the receive buffer."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.chunks: queue.Queue[torch.Tensor] = queue.Queue(maxsize=1)
        self.done: queue.Queue[bool] = queue.Queue(maxsize=1)
        self.sent_chunks, self.sent_bytes = 0, 0

    def end(self, role: str) -> Any:
        outer = self

        class End:
            def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
                if role == "producer":
                    synchronize(outer.device)  # the pack is complete (NCCL orders it on the stream)
                    outer.chunks.put(tensor, timeout=HANDOFF_TIMEOUT_S)
                    outer.done.get(timeout=HANDOFF_TIMEOUT_S)
                    outer.sent_chunks += 1
                    outer.sent_bytes += tensor.numel()
                else:
                    tensor.copy_(outer.chunks.get(timeout=HANDOFF_TIMEOUT_S))
                    synchronize(outer.device)
                    outer.done.put(True)

        return End()


def push_packed(pt: Any, source: Any, group: Any, buffer_bytes: int, num_buffers: int) -> None:
    """One push, as vLLM's NCCL trainer engine makes it (``_broadcast`` with ``packed=True``)."""
    source.new_round()
    pt.packed_nccl_broadcast_producer(
        iterator=iter(source),
        group=group,
        src=0,
        post_iter_func=lambda item: item[1],
        buffer_size_bytes=buffer_bytes,
        num_buffers=num_buffers,
    )


def _loopback_push(
    pt: Any, source: Any, dev: torch.device, buffer_bytes: int, num_buffers: int
) -> tuple[float, dict[str, torch.Tensor], _Loopback]:
    """Producer here, vLLM's consumer in a thread: seconds, the receiver's tensors, the loopback."""
    meta = source.metadata()
    received = {m.name: torch.empty(m.shape, dtype=m.dtype, device=dev) for m in meta}
    loop = _Loopback(dev)
    errors: list[BaseException] = []

    def load(pairs: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in pairs:
            received[name].copy_(t)

    def consume() -> None:
        try:
            pt.packed_nccl_broadcast_consumer(
                iterator=iter([(m.name, (list(m.shape), m.dtype)) for m in meta]),
                group=loop.end("consumer"),
                src=0,
                post_unpack_func=load,
                buffer_size_bytes=buffer_bytes,
                num_buffers=num_buffers,
                device=dev,
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised in the producer's thread
            errors.append(exc)

    thread = threading.Thread(target=consume, name="vllm-consumer", daemon=True)
    synchronize(dev)
    t0 = time.perf_counter()
    thread.start()
    push_packed(pt, source, loop.end("producer"), buffer_bytes, num_buffers)
    thread.join(timeout=HANDOFF_TIMEOUT_S)
    synchronize(dev)
    seconds = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"vLLM's consumer failed: {errors[0]!r}")
    if thread.is_alive():
        raise TimeoutError("vLLM's consumer did not finish")
    return seconds, received, loop


def _compare(learner: Any, received: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The receiver's tensors against the learner's state dict (full under ZeRO-3), byte for byte."""
    with learner._full_params():
        state = {k: v.detach() for k, v in learner.served().items()}
        differ = [
            n
            for n in sorted(set(state) & set(received))
            if state[n].shape != received[n].shape
            or state[n].dtype != received[n].dtype
            or not torch.equal(
                state[n].contiguous().view(-1).view(torch.uint8),
                received[n].contiguous().view(-1).view(torch.uint8),
            )
        ]
        state_bytes = sum(v.numel() * v.element_size() for v in state.values())
    return {
        "state_dict_tensors": len(state),
        "state_dict_bytes": state_bytes,
        "missing": sorted(set(state) - set(received)),
        "unexpected": sorted(set(received) - set(state)),
        "differing": differ,
    }


def check_export(
    *,
    sizes: Sizes,
    stages: tuple[int, ...],
    device: str,
    buffer_bytes: int,
    num_buffers: int,
    reps: int,
    deadline: float,
    prefer_carry: bool = False,
) -> dict[str, Any]:
    """Each ZeRO stage of ``stages`` in turn, in this process: ``{"zero<stage>": figures}``."""
    dev = setup_device(device)
    pt = ensure_vllm(prefer_carry=prefer_carry)
    if dev.type == "cpu":
        cpu_streams(pt)
    kw = dict(sizes=sizes, dev=dev, buffer_bytes=buffer_bytes, num_buffers=num_buffers, reps=reps)
    return {f"zero{z}": _export_stage(pt, zero_stage=z, deadline=deadline, **kw) for z in stages}


def _export_stage(
    pt: Any,
    *,
    sizes: Sizes,
    zero_stage: int,
    dev: torch.device,
    buffer_bytes: int,
    num_buffers: int,
    reps: int,
    deadline: float,
) -> dict[str, Any]:
    """One ZeRO stage: ``reps`` producer-only pushes (seconds, extra peak), then one loopback push, compared."""
    from exgrpo.transport.vllm_api import LearnerSource

    cfg = recipe_config(sizes, cuda=dev.type == "cuda", zero_stage=zero_stage)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="exgrpo-device-export-") as model_dir:
        params = save_model(sizes, model_dir, dtype=cfg.model.dtype, device=dev)
        learner = start_learner(cfg, model_dir, max_response_len=sizes.max_response_len)
    setup_s = time.perf_counter() - t0
    source = LearnerSource(learner.engine.module, zero3=zero_stage == 3)
    out: dict[str, Any] = {
        "zero_stage": zero_stage,
        "vllm_packed_tensor": str(pt.__file__),
        "params": params,
        "layers": sizes.layers,
        "buffer_bytes": buffer_bytes,
        "num_buffers": num_buffers,
        "setup_s": setup_s,
        "push_s": [],
        "extra_peak_bytes": [],
    }
    print(f"[export] ZeRO-{zero_stage}: {params / 1e9:.3f} B params, setup {setup_s:.1f} s", flush=True)
    sink = _Sink()
    for _ in range(reps):
        if out["push_s"] and time.monotonic() > deadline:
            break
        base = allocated(dev)
        reset_peak(dev)
        sink = _Sink()
        out["push_s"].append(timed(partial(push_packed, pt, source, sink, buffer_bytes, num_buffers), dev))
        out["extra_peak_bytes"].append(peak(dev) - base)
    out.update(chunks=sink.chunks, pushed_bytes=sink.bytes)
    loop_s, received, loop = _loopback_push(pt, source, dev, buffer_bytes, num_buffers)
    cmp = _compare(learner, received)
    out.update(loopback_s=loop_s, loopback_chunks=loop.sent_chunks, received_bytes=loop.sent_bytes, **cmp)
    out["bytes_equal"] = (
        not cmp["missing"]
        and not cmp["unexpected"]
        and not cmp["differing"]
        and loop.sent_bytes == cmp["state_dict_bytes"] == sink.bytes
    )
    extra = max(out["extra_peak_bytes"]) if dev.type == "cuda" else None
    out["extra_peak_gib"] = gib(extra)
    best = min(out["push_s"])
    print(
        f"[export] ZeRO-{zero_stage}: {out['pushed_bytes'] / 1e9:.2f} GB in {out['chunks']} chunks, "
        f"push {best:.3f} s (producer only; {out['pushed_bytes'] / best / 1e9:.1f} GB/s), loopback "
        f"{loop_s:.3f} s, extra peak {'n/a (CPU)' if extra is None else format(extra / 2**30, '.2f') + ' GiB'}, "
        f"bytes equal to the state dict: {out['bytes_equal']}",
        flush=True,
    )
    return out  # the caller fails the part when bytes_equal is False, keeping the figures
