"""Weights into vLLM samplers through vLLM's weight-transfer API, one code path on CPU and GPU.

vLLM 0.32 splits a weight update into a control plane and a data plane:

* control plane, on every inference engine: ``init_weight_transfer_engine`` once per world, then per
  version ``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` (the engine's
  ``WeightTransferEngine`` runs vLLM's layerwise reload around the chunks it receives);
* data plane, a trainer engine from ``WeightTransferTrainerFactory``: ``trainer_init`` rendezvouses with
  the workers, ``send_weights`` drives one version through the control plane while it broadcasts.

On GPU the backend is vLLM's own ``nccl`` engine (packed double buffers). CPU has no NCCL, so this
module registers a ``gloo`` backend in both factories: the same lifecycle, the same packing rule
(vLLM's ``pack_tensors`` / ``unpack_tensor``: a chunk closes once it exceeds the buffer size, so both
sides cut the stream at the same parameters from the same metadata), moved over a gloo world of its
own. CI therefore runs the very calls a GPU run makes; only the wire differs.

Pieces:

* ``SamplerClient``: vLLM's ``VLLMWeightSyncClient`` protocol over our sampler actors. Each sampler is
  its own one-worker vLLM engine, so each gets its own ``rank_offset`` (1 + its index); the policy
  version rides ``finish_weight_update(weight_version=...)``.
* ``LearnerSource``: vLLM's ``WeightSource`` over the learner's module. Under ZeRO-3 it gathers one
  decoder layer at a time (``deepspeed.zero.GatheredParameters``) and yields copies on the device,
  so the broadcast never holds a full copy of the model; every learner rank iterates it in lockstep.
* ``WeightPusher``: what learner rank 0 holds: the trainer engine of the current sampler world,
  rebuilt when the membership changes.
* ``GlooWeightTransferEngine`` / ``GlooTrainerWeightTransferEngine``: the CPU backend.

Why no ``pause_generation``: a sampler is a synchronous Ray actor around vLLM's offline ``LLM``; an
update is an actor call, so it runs between two ``generate`` calls, when nothing is in flight. The
async engine's ``pause_generation(mode="keep")`` is what an ``AsyncLLM`` sampler would need.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
    layerwise_groups,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.packed_tensor import pack_tensors, unpack_tensor

GLOO = "gloo"
DEFAULT_BUFFER_BYTES = 64 << 20  # one gloo broadcast per ~64 MiB chunk


def backend_for(device: str) -> str:
    """The weight-transfer backend for engines on `device`: vLLM's NCCL engine on CUDA, ours on CPU."""
    return "nccl" if device.startswith("cuda") else GLOO


def register_engines() -> None:
    """Register the gloo backend in vLLM's worker and trainer factories (idempotent; call in every process)."""
    if GLOO not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO, GlooWeightTransferEngine)
    if GLOO not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(GLOO, GlooTrainerWeightTransferEngine)


# ------------------------------------------------------------------------------------- the gloo wire
@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Worker side of a gloo world: where the trainer's TCPStore is and which rank this worker takes."""

    host: str
    port: int
    rank_offset: int
    world_size: int
    group_name: str
    buffer_size_bytes: int = DEFAULT_BUFFER_BYTES
    timeout_s: float = 300.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One version's parameter list (names, dtypes, shapes), in the order the trainer sends them."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"update info lists differ in length: {len(self.names)} names, "
                f"{len(self.dtype_names)} dtypes, {len(self.shapes)} shapes"
            )


def _gloo_group(store: dist.Store, *, name: str, rank: int, world_size: int, timeout_s: float) -> Any:
    return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, world_size, timedelta(seconds=timeout_s))


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


def chunk_plan(
    metas: Sequence[tuple[str, Sequence[int], torch.dtype]], buffer_size_bytes: int
) -> list[list[tuple[str, list[int], torch.dtype, int]]]:
    """The receiver's chunks: the same cut `pack_tensors` makes (close a chunk once it exceeds the buffer)."""
    chunks: list[list[tuple[str, list[int], torch.dtype, int]]] = [[]]
    size = 0
    for name, shape, dtype in metas:
        nbytes = int(torch.Size(shape).numel()) * dtype.itemsize
        chunks[-1].append((name, list(shape), dtype, nbytes))
        size += nbytes
        if size > buffer_size_bytes:
            chunks.append([])
            size = 0
    return [c for c in chunks if c]


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Worker side (inside the vLLM worker): receive packed chunks over gloo, load them layerwise."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._group: Any = None
        self._store: Any = None
        self._buffer_bytes = DEFAULT_BUFFER_BYTES

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        self.shutdown()  # a new world (the sampler membership changed) replaces the old one
        rank = init_info.rank_offset + self.parallel_config.rank
        self._store = dist.TCPStore(
            init_info.host, init_info.port, init_info.world_size, is_master=False,
            timeout=timedelta(seconds=init_info.timeout_s),
        )
        self._group = _gloo_group(self._store, name=init_info.group_name, rank=rank,
                                  world_size=init_info.world_size, timeout_s=init_info.timeout_s)
        self._buffer_bytes = init_info.buffer_size_bytes

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self._group is None:
            raise RuntimeError("gloo weight transfer is not initialised: call init_weight_transfer_engine first")
        metas = [(n, s, getattr(torch, d)) for n, d, s in
                 zip(update_info.names, update_info.dtype_names, update_info.shapes, strict=True)]
        for chunk in chunk_plan(metas, self._buffer_bytes):
            names, shapes, dtypes, sizes = (list(x) for x in zip(*chunk, strict=True))
            packed = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
            _broadcast(self._group, packed)
            self.model.load_weights(unpack_tensor(packed, names, shapes, dtypes, sizes))

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        self._group, self._store = None, None


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer side of a gloo world: the trainer (rank 0) hosts its TCPStore; workers are ranks 1..W-1."""

    backend: ClassVar[str] = GLOO

    world_size: int
    group_name: str
    host: str = "127.0.0.1"
    buffer_size_bytes: int = DEFAULT_BUFFER_BYTES
    timeout_s: float = 300.0


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side of the gloo backend: the same round trip as vLLM's NCCL trainer engine."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: Any, source: WeightSource | None, is_sender: bool, buffer_size_bytes: int) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.buffer_size_bytes = buffer_size_bytes
        self._group: Any = None
        self._store: Any = None

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: Any, source: WeightSource | None = None
                     ) -> GlooTrainerWeightTransferEngine:
        if source is None:
            raise ValueError("the gloo trainer engine sends a WeightSource; pass source=")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender,
                     buffer_size_bytes=init_info.buffer_size_bytes)
        if not engine.is_sender:
            return engine
        if init_info.world_size < 2:
            raise ValueError(f"a weight-transfer world needs the trainer and a worker, got world_size={init_info.world_size}")
        engine._store = dist.TCPStore(init_info.host, 0, init_info.world_size, is_master=True,
                                      timeout=timedelta(seconds=init_info.timeout_s), wait_for_workers=False)
        worker = GlooInitInfo(host=init_info.host, port=engine._store.port, rank_offset=1,
                              world_size=init_info.world_size, group_name=init_info.group_name,
                              buffer_size_bytes=init_info.buffer_size_bytes, timeout_s=init_info.timeout_s)
        # the workers block in init until every rank has joined: run their RPC beside our own join, and give
        # up at once if the RPC fails (a dead sampler never joins; its peers would wait out the timeout)
        pool = ThreadPoolExecutor(max_workers=2)
        try:
            joined = pool.submit(client.init_weight_transfer_engine, asdict(worker))
            group = pool.submit(_gloo_group, engine._store, name=init_info.group_name, rank=0,
                                world_size=init_info.world_size, timeout_s=init_info.timeout_s)
            wait([joined, group], return_when=FIRST_EXCEPTION)
            joined.result()
            engine._group = group.result()
        finally:
            pool.shutdown(wait=False)
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:  # stay in the trainer-side gathers (ZeRO-3)
                pass
            return
        update = GlooUpdateInfo(names=[m.name for m in meta], dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
                                shapes=[list(m.shape) for m in meta])
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            received = pool.submit(self.client.update_weights, asdict(update))
            pairs = _checked(iter(self.source), meta)
            while (chunk := pack_tensors(pairs, lambda item: item[1].detach().to("cpu"), self.buffer_size_bytes)):
                _broadcast(self._group, chunk.packed_tensor)
            received.result()
        finally:
            pool.shutdown(wait=False)  # never join a worker stuck in a broken collective
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self._group, self._store = None, None


def _checked(pairs: Iterator[tuple[str, torch.Tensor]], meta: Sequence[ParamMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    """The source's pairs, each checked against the metadata the workers cut their chunks from."""
    for i, ((name, tensor), m) in enumerate(zip(pairs, meta, strict=True)):
        if name != m.name or tensor.dtype != m.dtype or tuple(tensor.shape) != tuple(m.shape):
            raise ValueError(f"weight source entry {i} is {name!r} {tensor.dtype} {tuple(tensor.shape)}, "
                             f"but its metadata says {m.name!r} {m.dtype} {tuple(m.shape)}")
        yield name, tensor


# ------------------------------------------------------------------------------------- trainer side
class SamplerClient:
    """vLLM's `VLLMWeightSyncClient` over sampler actors: each call fans out and waits for all of them.

    `version` is set before each `send_weights`; `finish_weight_update` carries it to the samplers, which
    tag what they generate next with it. `apply_s` holds each sampler's seconds from start to finish.
    """

    def __init__(self, handles: Sequence[Any], *, timeout_s: float = 300.0) -> None:
        self.handles = list(handles)
        self.timeout_s = timeout_s
        self.version = 0
        self.apply_s: list[float] = []

    def _all(self, refs: list[Any]) -> list[Any]:
        import ray

        return ray.get(refs, timeout=self.timeout_s)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        base = int(init_info["rank_offset"])  # separate one-worker engines: one rank each
        self._all([h.init_weight_transfer_engine.remote(init_info={**init_info, "rank_offset": base + i})
                   for i, h in enumerate(self.handles)])

    def start_weight_update(self) -> None:
        self._all([h.start_weight_update.remote() for h in self.handles])

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._all([h.update_weights.remote(update_info=update_info) for h in self.handles])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = self.version if weight_version is None else int(weight_version)
        self.apply_s = [float(s) for s in self._all([h.finish_weight_update.remote(version=version)
                                                      for h in self.handles])]


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

    def __init__(self, *, module: torch.nn.Module, backend: str, host: str, zero3: bool = False,
                 is_sender: bool = True, buffer_size_bytes: int = DEFAULT_BUFFER_BYTES, timeout_s: float = 300.0) -> None:
        register_engines()
        self.source = LearnerSource(module, zero3=zero3)
        self.backend, self.host, self.is_sender = backend, host, is_sender
        self.buffer_size_bytes, self.timeout_s = buffer_size_bytes, timeout_s
        self._engine: TrainerWeightTransferEngine | None = None
        self._world: tuple[tuple[str, str], ...] = ()
        self.worlds = 0  # worlds built so far

    def push(self, *, version: int, members: Mapping[str, Any] | None) -> dict[str, Any]:
        """Send the current weights as `version` (members: sampler id -> handle; None on non-sender ranks)."""
        t0 = time.perf_counter()
        if not self.is_sender:
            if self._engine is None:
                self._engine = WeightTransferTrainerFactory.trainer_init(self._init_info(2), client=None, source=self.source)
            self._engine.send_weights()
            return {"send_s": time.perf_counter() - t0, "apply_s": []}
        assert members is not None
        self.source._pass = None
        try:
            if _world(members) != self._world or self._engine is None:
                self._rebuild(members)
            assert self._engine is not None
            self._engine.client.version = version
            self._engine.send_weights()
        except BaseException:
            self.source.finish_round()  # keep the other ranks' gathers from waiting forever
            raise
        return {"send_s": time.perf_counter() - t0, "apply_s": list(self._engine.client.apply_s), "rebuilt": self.worlds}

    def _init_info(self, world_size: int) -> TrainerInitInfo:
        if self.backend == GLOO:
            return GlooTrainerInitInfo(world_size=world_size, group_name=f"exgrpo-weights-{self.worlds}",
                                       host=self.host, buffer_size_bytes=self.buffer_size_bytes,
                                       timeout_s=self.timeout_s, rank=0 if self.is_sender else 1)
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(master_address=self.host, master_port=_free_port(self.host), world_size=world_size,
                                   rank=0 if self.is_sender else 1)

    def _rebuild(self, members: Mapping[str, Any]) -> None:
        import ray

        self.close()
        self.worlds += 1
        # a dead member fails here at once instead of leaving the others waiting in the rendezvous
        ray.get([h.ping.remote() for h in members.values()], timeout=self.timeout_s)
        client = SamplerClient(list(members.values()), timeout_s=self.timeout_s)
        self._engine = WeightTransferTrainerFactory.trainer_init(
            self._init_info(1 + len(members)), client=client, source=self.source)
        self._world = _world(members)

    def close(self) -> None:
        if self._engine is not None:
            with contextlib.suppress(Exception):
                self._engine.shutdown()
        self._engine, self._world = None, ()


def _world(members: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Who is in a world: sampler ids and their actors (a replaced actor under a reused id is a new member)."""
    return tuple((k, str(getattr(h, "_actor_id", id(h)))) for k, h in members.items())


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
