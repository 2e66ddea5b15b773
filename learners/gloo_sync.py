"""The gloo endpoints of the collective weight transport: sender, receivers and the bucket plan.

`learners/weight_sync.py::CollectiveTransport` decides who calls what and when; this module is the
wire. Collective protocol of the endpoints (both sides derive the same plan from the same ``ParamSpec`` list):

1. ``CollectiveSender`` (rank 0) hosts the world's ``TCPStore`` and publishes the bucket size in it;
   ``CollectiveReceiver``s read it when they connect. The world never touches torch.distributed's
   default group, which belongs to the learners' DeepSpeed world.
2. Each ``send``/``receive`` first all-reduces a fingerprint of the spec list and the bucket size
   (MAX of [f, -f]); any disagreement raises on every rank instead of hanging or corrupting weights.
3. Parameters are grouped by dtype (in order of first appearance) and packed in spec order into flat
   buckets of at most ``bucket_mb`` MiB (a larger tensor gets a bucket of its own); each bucket is one
   broadcast from rank 0. Never one call per parameter.

Only the CPU (gloo) backend is implemented. NCCL on GPU needs a communicator that does not join the
default group: vLLM's ``StatelessProcessGroup`` plus its ``PyNcclCommunicator`` (see ``_require_gloo``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

MiB = 1 << 20
Backend = Literal["gloo", "nccl"]


@dataclass(frozen=True)
class ParamSpec:
    """Name, shape and dtype of one state-dict entry (dtype: torch name without "torch.", e.g. "float32")."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"ParamSpec {self.name!r}: unknown dtype {self.dtype!r}")
        return dtype


@dataclass(frozen=True)
class SyncGroupInfo:
    """Where and how receivers join the sync world hosted by the sender (rank 0)."""

    host: str  # address of the sender's TCPStore
    port: int
    world_size: int  # 1 sender + the receivers
    group_name: str  # prefix of every key this world writes in the store


@dataclass(frozen=True)
class Bucket:
    """One broadcast: the spec indices packed (in order) into a flat tensor of one dtype."""

    dtype: str
    indices: tuple[int, ...]
    numel: int


def param_specs(weights: Mapping[str, Tensor]) -> list[ParamSpec]:
    """The spec list of a state dict, in its iteration order."""
    return [ParamSpec(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in weights.items()]


def plan_buckets(specs: Sequence[ParamSpec], *, bucket_bytes: int) -> list[Bucket]:
    """Pack specs into dtype-homogeneous buckets of at most ``bucket_bytes`` (one oversized tensor alone).

    Deterministic: sender and receivers compute the same plan from the same specs.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    by_dtype: dict[str, list[int]] = {}
    for i, s in enumerate(specs):
        by_dtype.setdefault(s.dtype, []).append(i)
    buckets: list[Bucket] = []
    for dtype, indices in by_dtype.items():
        item = torch.empty((), dtype=specs[indices[0]].torch_dtype).element_size()
        current: list[int] = []
        size = 0
        for i in indices:
            n = specs[i].numel
            if current and (size + n) * item > bucket_bytes:
                buckets.append(Bucket(dtype, tuple(current), size))
                current, size = [], 0
            current.append(i)
            size += n
        if current:
            buckets.append(Bucket(dtype, tuple(current), size))
    return buckets


def to_numpy_state(state_dict: Mapping[str, Tensor]) -> dict[str, np.ndarray]:
    """A snapshot of a state dict as numpy arrays (the object-store payload, read zero-copy by Ray).

    Every array is a copy (never a view of live parameters). numpy has no bfloat16, so bfloat16
    tensors become float32 arrays (exact); receivers cast back with ``load_state_dict``.
    """
    out: dict[str, np.ndarray] = {}
    for name, t in state_dict.items():
        t = t.detach().to("cpu", copy=True)
        if t.dtype == torch.bfloat16:
            t = t.float()
        out[name] = t.numpy()
    return out


def _fingerprint(specs: Sequence[ParamSpec], bucket_bytes: int) -> int:
    """A 62-bit hash of the spec list and bucket size (fits int64 with its negation)."""
    text = repr((bucket_bytes, [(s.name, s.shape, s.dtype) for s in specs]))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 2


def _require_gloo(backend: str) -> None:
    if backend != "gloo":
        raise NotImplementedError(
            f"collective weight sync over {backend!r} is not implemented: NCCL needs a communicator outside "
            "torch.distributed's default group, i.e. vLLM's StatelessProcessGroup.create(host, port, rank, "
            "world_size) wrapped in vllm.distributed.device_communicators.pynccl.PyNcclCommunicator on both "
            "the learner and every vLLM worker; use backend='gloo' (CPU) or the object_store transport"
        )


class _SyncEndpoint:
    """Shared machinery of sender and receivers: the gloo group, the agreement check, the bucket plan."""

    def __init__(self, *, info: SyncGroupInfo, rank: int, timeout_s: float) -> None:
        self.info = info
        self.rank = rank
        self.timeout = timedelta(seconds=timeout_s)
        self._store: dist.Store | None = None
        self._pg: dist.ProcessGroup | None = None
        self.bucket_bytes = 0
        self.last_num_buckets = 0

    def _join(self, store: dist.Store) -> None:
        prefixed = dist.PrefixStore(self.info.group_name, store)
        self._pg = dist.ProcessGroupGloo(prefixed, self.rank, self.info.world_size, self.timeout)

    @property
    def connected(self) -> bool:
        return self._pg is not None

    def _group(self) -> dist.ProcessGroup:
        if self._pg is None:
            raise RuntimeError("the sync group is not connected yet; call connect() on every rank first")
        return self._pg

    def _agree(self, specs: Sequence[ParamSpec]) -> None:
        """All-reduce MAX of [f, -f]: every rank learns whether all fingerprints are equal."""
        f = _fingerprint(specs, self.bucket_bytes)
        both = torch.tensor([f, -f], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        self._group().allreduce([both], opts).wait()
        if int(both[0]) != f or int(-both[1]) != f:
            raise RuntimeError(
                f"weight sync {self.info.group_name!r} rank {self.rank}: the ranks disagree on the parameter "
                "specs or the bucket size; every receiver needs the sender's Learner.weight_specs()"
            )

    def _broadcast(self, flat: Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self._group().broadcast([flat], opts).wait()

    def close(self) -> None:
        """Drop the group and the store connection (the sender's store stops serving)."""
        self._pg = None
        self._store = None


class CollectiveSender(_SyncEndpoint):
    """Rank 0 of a sync world: hosts its TCPStore and broadcasts weights in flat buckets.

    Usage: ``s = CollectiveSender(world_size=3, group_name="sync")``; hand ``s.info`` to the receivers;
    call ``s.connect()`` while they call theirs (it blocks until all have joined); then ``s.send(sd)``
    while each receiver calls ``receive()``.
    """

    def __init__(
        self,
        *,
        world_size: int,
        group_name: str,
        host: str = "127.0.0.1",
        bucket_mb: float = 32.0,
        timeout_s: float = 600.0,
        backend: Backend = "gloo",
    ) -> None:
        _require_gloo(backend)
        if world_size < 2:
            raise ValueError(
                f"a sync world needs the sender and at least one receiver, got world_size={world_size}"
            )
        store = dist.TCPStore(
            host, 0, world_size, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
        )
        info = SyncGroupInfo(host=host, port=store.port, world_size=world_size, group_name=group_name)
        super().__init__(info=info, rank=0, timeout_s=timeout_s)
        self._store = store
        self.bucket_bytes = max(1, int(bucket_mb * MiB))
        store.set(f"{group_name}/meta/bucket_bytes", str(self.bucket_bytes))

    def connect(self) -> None:
        """Join the gloo group (blocks until every receiver has connected)."""
        assert self._store is not None
        self._join(self._store)

    def send(self, weights: Mapping[str, Tensor]) -> float:
        """Broadcast ``weights`` (in iteration order) to all receivers; returns the seconds it took."""
        start = time.perf_counter()
        specs = param_specs(weights)
        self._agree(specs)
        tensors = list(weights.values())
        plan = plan_buckets(specs, bucket_bytes=self.bucket_bytes)
        for bucket in plan:
            dtype = specs[bucket.indices[0]].torch_dtype
            flat = torch.cat([tensors[i].detach().reshape(-1).to("cpu", dtype) for i in bucket.indices])
            self._broadcast(flat)
        self.last_num_buckets = len(plan)
        return time.perf_counter() - start


class CollectiveReceiver(_SyncEndpoint):
    """Rank ``rank`` (1..W-1) of a sync world: receives the sender's weights into fresh tensors."""

    def __init__(
        self,
        *,
        info: SyncGroupInfo,
        rank: int,
        specs: Sequence[ParamSpec],
        timeout_s: float = 600.0,
        backend: Backend = "gloo",
    ) -> None:
        _require_gloo(backend)
        if not 0 < rank < info.world_size:
            raise ValueError(f"receiver rank must lie in 1..{info.world_size - 1}, got {rank}")
        super().__init__(info=info, rank=rank, timeout_s=timeout_s)
        self.specs = list(specs)

    def connect(self) -> None:
        """Connect to the sender's store and join the gloo group (blocks until all ranks joined)."""
        store = dist.TCPStore(
            self.info.host, self.info.port, self.info.world_size, is_master=False, timeout=self.timeout
        )
        self._store = store
        self.bucket_bytes = int(store.get(f"{self.info.group_name}/meta/bucket_bytes").decode())
        self._join(store)

    def receive(self) -> dict[str, Tensor]:
        """Receive one ``send``: name -> tensor (views of freshly allocated flat buckets), in spec order."""
        self._agree(self.specs)
        out: dict[str, Tensor] = {}
        plan = plan_buckets(self.specs, bucket_bytes=self.bucket_bytes)
        for bucket in plan:
            flat = torch.empty(bucket.numel, dtype=self.specs[bucket.indices[0]].torch_dtype)
            self._broadcast(flat)
            offset = 0
            for i in bucket.indices:
                spec = self.specs[i]
                out[spec.name] = flat.narrow(0, offset, spec.numel).view(spec.shape)
                offset += spec.numel
        self.last_num_buckets = len(plan)
        return {s.name: out[s.name] for s in self.specs}
