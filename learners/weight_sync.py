"""Weight transports from the learner group to the samplers, whole (DESIGN.md section 5).

The protocol lives here; ``Learner`` and ``Sampler`` only expose thin entry points that delegate to the
endpoints of ``learners/gloo_sync.py`` (``get_weights`` / ``load_weights``; ``open_sync_group`` / ``connect_sync_group`` /
``broadcast_weights`` on the learner, ``join_sync_group`` / ``receive_weights`` on the sampler).

Both transports implement ``exgrpo.core.WeightTransport.broadcast(*, version)`` and ``catch_up(handle)``,
which brings a sampler the pool just added to the current weights before its first request (the pool
calls it through ``SamplerPool.on_new``; Ray runs one caller's calls on an actor in submission order, so a
load submitted before any generate is applied before it). They ask the pool for its live samplers
(``members()``: stable id -> handle) at every broadcast.

* ``ObjectStoreTransport``: rank 0 exports a numpy state dict (``to_numpy_state``) into Ray's object store
  once per version; every sampler reads it zero-copy (``load_weights``). Newcomers load the last one.
* ``CollectiveTransport``: learner rank 0 broadcasts to every sampler over a gloo world of its own (rank 0 =
  the learner, ranks 1..S = the samplers in ``members()`` order), rebuilt whenever the membership changed.
  A newcomer catches up through the object store (one export per version, only when someone needs it) and
  joins the world at the next broadcast. If a broadcast fails (a sampler died mid-way), that version is
  pushed through the object store instead and the world is rebuilt at the next broadcast.

At version 0 (before any broadcast) a sampler's engine holds the initial model from disk, so
``catch_up`` has nothing to do.

The wire (gloo endpoints, bucket plan, agreement check) is `learners/gloo_sync.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import ray

from exgrpo import metrics as M
from learners.gloo_sync import ParamSpec

__all__ = ["CollectiveTransport", "ObjectStoreTransport", "make_transport"]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ transports
TransportKind = Literal["object_store", "collective"]


class SamplerMembers(Protocol):
    """What a transport needs from the sampler pool (``actors.pool.SamplerPool``)."""

    def members(self) -> dict[str, Any]:
        """Live samplers that take requests: stable id -> actor handle, in a stable order."""
        ...


class WeightSource(Protocol):
    """What a transport needs from the learner group (``learners.group.LearnerGroup``)."""

    @property
    def rank0(self) -> Any: ...

    def get_weights_ref(self) -> Any: ...

    def version(self) -> int: ...


class _Loads:
    """Sampler weight loads in flight (each returns its seconds); ``take`` collects the finished ones."""

    def __init__(self) -> None:
        self._refs: list[Any] = []

    def add(self, refs: Sequence[Any]) -> None:
        self._refs.extend(refs)

    def take(self) -> list[float]:
        if not self._refs:
            return []
        ready, self._refs = ray.wait(self._refs, num_returns=len(self._refs), timeout=0, fetch_local=True)
        out = []
        for ref in ready:
            try:
                out.append(float(ray.get(ref)))
            except Exception as e:  # noqa: BLE001 - the pool notices a dead sampler on its next request
                log.warning("a sampler weight load failed: %s", e)
        return out


def _metrics(start: float, loads: Sequence[float]) -> dict[str, float]:
    return {M.SYNC_TIME: time.perf_counter() - start, M.WEIGHT_LOAD: sum(loads) / len(loads) if loads else 0.0}


class ObjectStoreTransport:
    """Rank 0's numpy state dict, put in the object store once per version, loaded by every sampler."""

    def __init__(self, *, learners: WeightSource, samplers: SamplerMembers) -> None:
        self._learners, self._samplers = learners, samplers
        self._published: tuple[Any, int] | None = None  # (object ref, version) of the last broadcast
        self._loads = _Loads()

    def broadcast(self, *, version: int) -> dict[str, float]:
        """Export the weights (waits for the export), then queue a load on every sampler (no wait)."""
        start = time.perf_counter()
        ref = self._learners.get_weights_ref()
        ray.wait([ref], fetch_local=False)
        self._published = (ref, version)
        handles = list(self._samplers.members().values())
        self._loads.add([h.load_weights.remote(weights=ref, version=version) for h in handles])
        return _metrics(start, self._loads.take())

    def catch_up(self, handle: Any) -> None:
        """Queue the last broadcast's weights on a new sampler (before the pool sends it any request)."""
        if self._published is not None:
            ref, version = self._published
            self._loads.add([handle.load_weights.remote(weights=ref, version=version)])


class CollectiveTransport:
    """Learner rank 0 broadcasts over its own gloo world with every sampler; newcomers catch up by object store."""

    def __init__(
        self, *, learners: WeightSource, samplers: SamplerMembers, bucket_mb: float = 32.0, timeout_s: float = 600.0
    ) -> None:
        self._learners, self._samplers = learners, samplers
        self.bucket_mb, self.timeout_s = bucket_mb, timeout_s
        self._world: tuple[str, ...] | None = None  # sampler ids of ranks 1..S of the current world
        self._specs: list[ParamSpec] | None = None
        self._broadcast_once = False
        self._export: tuple[Any, int] | None = None  # catch-up weights exported since the last broadcast
        self._loads = _Loads()
        self.rebuilds = 0  # sync worlds built so far (the name of the current one ends with this)

    @property
    def world(self) -> tuple[str, ...]:
        """Sampler ids in the current sync world, in rank order (ranks 1..S)."""
        return self._world or ()

    def broadcast(self, *, version: int) -> dict[str, float]:
        """One broadcast to every live sampler (blocks until all applied it); rebuilds the world if needed."""
        start = time.perf_counter()
        members = self._samplers.members()
        self._broadcast_once, self._export = True, None
        if not members:
            return _metrics(start, self._loads.take())
        received: list[float] = []
        try:
            if tuple(members) != self._world:
                self._rebuild(members)
            receives = [h.receive_weights.remote(version=version) for h in members.values()]
            ray.get([self._learners.rank0.broadcast_weights.remote(), *receives])
            received = [float(t) for t in ray.get(receives)]
        except ray.exceptions.RayError as e:
            log.warning("collective broadcast of version %d failed (%s); sending it through the object store", version, e)
            self._world = None
            ref = self._learners.get_weights_ref()
            self._loads.add([h.load_weights.remote(weights=ref, version=version) for h in members.values()])
        return _metrics(start, received + self._loads.take())

    def _rebuild(self, members: Mapping[str, Any]) -> None:
        rank0 = self._learners.rank0
        if self._specs is None:
            self._specs = ray.get(rank0.weight_specs.remote())
        self._world = None
        self.rebuilds += 1
        info = ray.get(rank0.open_sync_group.remote(world_size=1 + len(members), group_name=f"exgrpo-sync-{self.rebuilds}",
                                                    bucket_mb=self.bucket_mb, timeout_s=self.timeout_s))
        joins = [h.join_sync_group.remote(info=info, rank=i + 1, specs=self._specs, timeout_s=self.timeout_s)
                 for i, h in enumerate(members.values())]
        ray.get([rank0.connect_sync_group.remote(), *joins])
        self._world = tuple(members)

    def catch_up(self, handle: Any) -> None:
        """Load the learner's current weights (tagged with its version) on a new sampler via the object store."""
        if not self._broadcast_once:
            return
        if self._export is None:  # rank 0 runs calls in order: this export and this version match
            self._export = (self._learners.get_weights_ref(), self._learners.version())
        ref, version = self._export
        self._loads.add([handle.load_weights.remote(weights=ref, version=version)])


def make_transport(
    kind: TransportKind, *, learners: WeightSource, samplers: SamplerMembers
) -> ObjectStoreTransport | CollectiveTransport:
    """The transport named by the config value ``async.weight_sync``."""
    if kind == "object_store":
        return ObjectStoreTransport(learners=learners, samplers=samplers)
    if kind == "collective":
        return CollectiveTransport(learners=learners, samplers=samplers)
    raise ValueError(f"unknown weight transport {kind!r}; choose 'object_store' or 'collective'")
