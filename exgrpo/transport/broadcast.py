"""Weight transports from the learner group to the samplers, whole (docs/architecture.md, "Weights").

``ObjectStoreTransport`` (any engine; the CPU default: one packed buffer per version, mapped zero-copy by every
sampler) and ``VLLMTransport`` (``async.weight_sync=collective``: vLLM's weight-transfer API from learner rank 0,
``exgrpo/transport/vllm_api.py``) implement ``exgrpo.core.roles.WeightTransport``. Invariants: a sampler the pool
adds gets the current weights (``catch_up``) before its first request; a failed or timed-out collective broadcast
sends that version through the object store and rebuilds the world next time. Failures: docs/failures.md
("Weight transfer"); tests: tests/integration/test_transports.py, tests/exgrpo/transport/test_transport_prepare.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import ray

from exgrpo.core import metric_names as M

__all__ = ["ObjectStoreTransport", "VLLMTransport", "WeightSyncFailed", "make_transport"]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------- transports
TransportKind = Literal["object_store", "collective"]


class SamplerMembers(Protocol):
    """What a transport needs from the sampler pool (``actors.pool.SamplerPool``)."""

    def members(self) -> dict[str, Any]:
        """Live samplers that take requests: stable id -> actor handle, in a stable order."""
        ...


class WeightProvider(Protocol):
    """What a transport needs from the learner group (``learners.group.LearnerGroup``)."""

    def get_weights_ref(self) -> Any: ...

    def start_push_weights(
        self, *, version: int, members: Mapping[str, Any], timeout_s: float | None = None
    ) -> Any: ...  # a Pending of rank 0's report

    def version(self) -> int: ...


class WeightSyncFailed(RuntimeError):
    """Weight loads or updates failed `max_failures` times in a row: the run stops with the last cause."""


class _Loads:
    """Sampler weight loads in flight (each returns its seconds); ``take`` collects the finished ones.

    A load that raised leaves its sampler refusing to generate (``actors.sampler.Sampler.weights_failed``),
    so the pool replaces it; a newer load that succeeds restores it. Failures are counted in a row across
    every sampler (a success resets the count); at ``max_failures`` in a row ``take`` raises
    `WeightSyncFailed` with the last cause, instead of a run that keeps sampling from old weights."""

    def __init__(self, *, max_failures: int = 3) -> None:
        self._refs: list[Any] = []
        self._names: dict[Any, str] = {}  # ref -> the sampler it loads
        self.max_failures = max_failures
        self.failed_in_a_row = 0
        self.failures = 0  # every failed load or update of this run

    def add(self, refs: Sequence[Any], names: Sequence[str] | None = None) -> None:
        self._refs.extend(refs)
        self._names.update(zip(refs, names or ["a sampler"] * len(refs), strict=True))

    def take(self) -> list[float]:
        if not self._refs:
            return []
        ready, self._refs = ray.wait(self._refs, num_returns=len(self._refs), timeout=0, fetch_local=True)
        out = []
        for ref in ready:
            name = self._names.pop(ref, "a sampler")
            try:
                out.append(float(ray.get(ref)))
            except (
                ray.exceptions.RayActorError
            ) as e:  # a dead sampler: the pool replaces it, not a load failure
                log.warning("%s died before its weight load finished: %s", name, e)
                continue
            except Exception as e:  # noqa: BLE001 - counted; the sampler refuses requests until it loads
                self.failed(f"{name}'s weight load failed: {_cause(e)}")
                continue
            self.failed_in_a_row = 0
        return out

    def failed(self, cause: str) -> None:
        """Count one failed load or update; raise once `max_failures` happened in a row."""
        self.failures += 1
        self.failed_in_a_row += 1
        log.error("%s (%d in a row)", cause, self.failed_in_a_row)
        if self.failed_in_a_row >= self.max_failures:
            raise WeightSyncFailed(
                f"{self.failed_in_a_row} weight loads/updates failed in a row (async.max_weight_failures="
                f"{self.max_failures}); the samplers cannot take the learner's weights. Last cause: {cause}"
            )


def _cause(err: BaseException) -> str:
    """One line for an error raised in an actor: the original exception, not Ray's traceback around it."""
    cause = getattr(err, "cause", None) or err
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[-1] if lines else ''}"


def _metrics(start: float, loads: Sequence[float]) -> dict[str, float]:
    return {
        M.SYNC_TIME: time.perf_counter() - start,
        M.WEIGHT_LOAD: sum(loads) / len(loads) if loads else 0.0,
    }


class ObjectStoreTransport:
    """Rank 0's packed weights, put in the object store once per version, loaded by every sampler."""

    def __init__(self, *, learners: WeightProvider, samplers: SamplerMembers, max_failures: int = 3) -> None:
        self._learners, self._samplers = learners, samplers
        self._published: tuple[Any, int] | None = None  # (object ref, version) of the last broadcast
        self._prepared: dict[int, Any] = {}  # version -> the export queued behind the update that makes it
        self._loads = _Loads(max_failures=max_failures)

    def prepare(self, *, version: int) -> None:
        """Queue rank 0's export behind the update that makes `version` (it runs before any later update)."""
        self._prepared[version] = self._learners.get_weights_ref()

    def broadcast(self, *, version: int) -> dict[str, float]:
        """Wait for the export (`prepare`'s, else a new one), then queue a load on every sampler (no wait).
        The loads are queued only now: a sampler's later calls would wait behind a load whose weights are
        not there yet."""
        start = time.perf_counter()
        ref = self._prepared.pop(version, None)
        self._prepared = {v: r for v, r in self._prepared.items() if v > version}
        if ref is None:
            ref = self._learners.get_weights_ref()
        ray.wait([ref], fetch_local=False)
        self._published = (ref, version)
        members = self._samplers.members()
        loads = [h.load_weights.remote(weights=ref, version=version) for h in members.values()]
        self._loads.add(loads, list(members))
        return _metrics(start, self._loads.take())

    def catch_up(self, handle: Any) -> None:
        """Queue the last broadcast's weights on a new sampler (before the pool sends it any request)."""
        if self._published is not None:
            ref, version = self._published
            self._loads.add([handle.load_weights.remote(weights=ref, version=version)])


class VLLMTransport:
    """Learner rank 0 drives vLLM's weight-transfer API to every vLLM sampler; newcomers catch up by object store."""

    def __init__(
        self,
        *,
        learners: WeightProvider,
        samplers: SamplerMembers,
        timeout_s: float = 300.0,
        max_failures: int = 3,
    ) -> None:
        self._learners, self._samplers = learners, samplers
        self.timeout_s = (
            timeout_s  # async.weight_timeout_s: bound on one version's update, rendezvous included
        )
        self._broadcast_once = False
        self._export: tuple[Any, int] | None = None  # catch-up weights exported since the last broadcast
        self._loads = _Loads(max_failures=max_failures)
        self.fallbacks = 0  # versions that went through the object store because a broadcast failed
        self.last: dict[
            str, Any
        ] = {}  # the learner's report of the last broadcast (send_s, apply_s, rebuilt)
        self._prepared: dict[int, tuple[Mapping[str, Any], Any]] = {}  # version -> (members, queued push)

    def prepare(self, *, version: int) -> None:
        """Queue rank 0's push of `version` behind the update that makes it (before any later update)."""
        members = self._samplers.members()
        push = (
            self._learners.start_push_weights(version=version, members=members, timeout_s=self.timeout_s)
            if members
            else None
        )
        self._prepared[version] = (members, push)

    def broadcast(self, *, version: int) -> dict[str, float]:
        """One update of every live sampler through vLLM's API (blocks until all applied it)."""
        start = time.perf_counter()
        prepared = self._prepared.pop(version, None)
        self._prepared = {v: p for v, p in self._prepared.items() if v > version}
        if prepared is not None:
            members, push = prepared
        else:
            members = self._samplers.members()
            push = (
                self._learners.start_push_weights(version=version, members=members, timeout_s=self.timeout_s)
                if members
                else None
            )
        self._broadcast_once, self._export = True, None
        if push is None:
            return _metrics(start, self._loads.take())
        applied: list[float] = []
        try:
            self.last = push.result()
            applied = list(self.last.get("apply_s", []))
            self._loads.failed_in_a_row = 0
        except ray.exceptions.RayError as e:
            log.warning(
                "weight transfer of version %d failed (%s); sending it through the object store", version, e
            )
            self.fallbacks += 1
            self._loads.failed(f"the weight transfer of version {version} failed: {_cause(e)}")
            # rank 0 runs calls in order: an update started since holds newer weights, tagged as what they are
            ref, current = self._learners.get_weights_ref(), self._learners.version()
            loads = [h.load_weights.remote(weights=ref, version=current) for h in members.values()]
            self._loads.add(loads, list(members))
        return _metrics(start, applied + self._loads.take())

    def catch_up(self, handle: Any) -> None:
        """Load the learner's current weights (tagged with its version) on a new sampler via the object store."""
        if not self._broadcast_once:
            return
        if self._export is None:  # rank 0 runs calls in order: this export and this version match
            self._export = (self._learners.get_weights_ref(), self._learners.version())
        ref, version = self._export
        self._loads.add([handle.load_weights.remote(weights=ref, version=version)])


def make_transport(
    kind: TransportKind,
    *,
    learners: WeightProvider,
    samplers: SamplerMembers,
    timeout_s: float = 300.0,
    max_failures: int = 3,
) -> ObjectStoreTransport | VLLMTransport:
    """The transport named by the config value ``async.weight_sync``."""
    if kind == "object_store":
        return ObjectStoreTransport(learners=learners, samplers=samplers, max_failures=max_failures)
    if kind == "collective":
        return VLLMTransport(
            learners=learners, samplers=samplers, timeout_s=timeout_s, max_failures=max_failures
        )
    raise ValueError(f"unknown weight transport {kind!r}; choose 'object_store' or 'collective'")
