"""Weight transports from the learner group to the samplers, whole (docs/architecture.md, "Weights").

``ObjectStoreTransport`` (any engine; the CPU default: one packed buffer per version, mapped zero-copy by every
sampler) and ``VLLMTransport`` (``async.weight_sync=collective``: vLLM's weight-transfer API from learner rank 0,
``exgrpo/transport/vllm_api.py``) implement ``exgrpo.core.roles.WeightTransport``. Invariants: a sampler the pool
adds gets the current weights (``catch_up``) before its first request; a failed or timed-out collective broadcast
sends that version through the object store and rebuilds the world next time; `max_failures` failed broadcasts in
a row stop the run (``WeightSyncFailed``) or, with ``on_failure="object_store"``, move it to the object store for good. Failures: docs/failures.md
("Weight transfer"); tests: tests/integration/test_transports.py, tests/exgrpo/transport/test_transport_prepare.py.
"""

from __future__ import annotations

import logging
import math
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
            self.succeeded()
        return out

    def succeeded(self) -> None:
        """A load or update went through: the failures in a row start again from 0."""
        self.failed_in_a_row = 0

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

    def __init__(
        self,
        *,
        learners: WeightProvider,
        samplers: SamplerMembers,
        max_failures: int = 3,
        taken_over: tuple[_Loads, tuple[Any, int]] | None = None,
    ) -> None:
        """`taken_over`: from a collective transport that gives up on its path, its loads in flight (counted
        here from now on) and its last published (object ref, version)."""
        self._learners, self._samplers = learners, samplers
        self._loads, published = taken_over or (_Loads(max_failures=max_failures), None)
        self._published: tuple[Any, int] | None = published  # (object ref, version) of the last broadcast
        self._prepared: dict[int, Any] = {}  # version -> the export queued behind the update that makes it

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


CollectiveFallback = Literal["stop", "object_store"]

# a sampler still inside a weight-transfer call this long past the call's deadline is stuck (vLLM's receive has no
# timeout: a collective whose peer is gone never returns); the transport kills it and the pool replaces it
STUCK_GRACE_S = 5.0


class VLLMTransport:
    """Learner rank 0 drives vLLM's weight-transfer API to every vLLM sampler; newcomers catch up by object store.

    A failed broadcast sends its version through the object store; `max_failures` failed broadcasts in a row
    (the fallback loads succeeding or not) are a collective path that does not work: ``on_failure="stop"``
    raises `WeightSyncFailed`, ``"object_store"`` says so in an error line and sends every later version
    through the object store (``switched`` is then true)."""

    def __init__(
        self,
        *,
        learners: WeightProvider,
        samplers: SamplerMembers,
        timeout_s: float = 300.0,
        max_failures: int = 3,
        on_failure: CollectiveFallback = "stop",
    ) -> None:
        self._learners, self._samplers = learners, samplers
        self.on_failure = on_failure
        self.failed_in_a_row = 0  # broadcasts that failed since the last one that succeeded
        self._object_store: ObjectStoreTransport | None = None  # every version from now on, once switched
        self.timeout_s = (
            timeout_s  # async.weight_timeout_s: bound on one version's update, rendezvous included
        )
        self._broadcast_once = False
        self._export: tuple[Any, int] | None = None  # catch-up weights exported since the last broadcast
        self._loads = _Loads(max_failures=max_failures)
        self.fallbacks = 0  # versions that went through the object store because a broadcast failed
        self.killed: list[str] = []  # samplers killed because a weight-transfer call of theirs hung
        self._joined: tuple[tuple[str, str], ...] = ()  # the members that acknowledged the current world
        self.last: dict[
            str, Any
        ] = {}  # the learner's report of the last broadcast (send_s, apply_s, rebuilt)
        self._prepared: dict[int, tuple[Mapping[str, Any], Any]] = {}  # version -> (members, queued push)

    @property
    def switched(self) -> bool:
        """True once the run moved to the object store for good (``on_failure="object_store"``)."""
        return self._object_store is not None

    def prepare(self, *, version: int) -> None:
        """Queue rank 0's push of `version` behind the update that makes it (before any later update)."""
        if self._object_store is not None:
            return self._object_store.prepare(version=version)
        members = self._samplers.members()
        self._prepared[version] = (members, self._push(version, members))

    def broadcast(self, *, version: int) -> dict[str, float]:
        """One update of every live sampler through vLLM's API (blocks until all applied it)."""
        if self._object_store is not None:
            return self._object_store.broadcast(version=version)
        start = time.perf_counter()
        prepared = self._prepared.pop(version, None)
        self._prepared = {v: p for v, p in self._prepared.items() if v > version}
        if prepared is not None:
            members, push = prepared
        else:
            members = self._samplers.members()
            push = self._push(version, members)
        self._broadcast_once, self._export = True, None
        if push is None:
            return _metrics(start, self._loads.take())
        applied: list[float] = []
        try:
            self.last = push.result()
            applied = list(self.last.get("apply_s", []))
            self.failed_in_a_row = 0
            self._loads.succeeded()
        except ray.exceptions.RayError as e:
            log.warning(
                "weight transfer of version %d failed (%s); sending it through the object store", version, e
            )
            self.fallbacks += 1
            self._joined = ()  # rank 0 dropped the world: the next push opens a new one
            self._loads.failed(f"the weight transfer of version {version} failed: {_cause(e)}")
            members = self._kill_stuck(members, version)
            # rank 0 runs calls in order: an update started since holds newer weights, tagged as what they are
            ref, current = self._learners.get_weights_ref(), self._learners.version()
            loads = [h.load_weights.remote(weights=ref, version=current) for h in members.values()]
            self._loads.add(loads, list(members))
            self._failed(version, _cause(e), published=(ref, current))
        return _metrics(start, applied + self._loads.take())

    def _push(self, version: int, members: Mapping[str, Any]) -> Any:
        """Queue rank 0's push of `version` to `members` (every rank's, under ZeRO-3); None without members.

        Members that form a new world acknowledge it first, here (`join_world`: each answers once its engine
        is free and then holds it for the world): the learner ranks are asked to push only after that, so no
        rank waits in a collective (ZeRO-3's gathers, or under `async.overlap_update` the next update's
        all-reduce) while rank 0 waits for a sampler call to end. It blocks the driver for that call, on a
        membership change only."""
        if not members:
            return None
        world = tuple((name, str(getattr(h, "_actor_id", id(h)))) for name, h in members.items())
        if world != self._joined:
            deadline = time.time() + self.timeout_s
            try:
                ray.get(
                    [h.join_world.remote(deadline=deadline) for h in members.values()], timeout=self.timeout_s
                )
                self._joined = world
            except ray.exceptions.RayError as e:  # rank 0 asks again, within its own bound, and fails there
                log.warning("samplers did not acknowledge the new weight world: %s", _cause(e))
        return self._learners.start_push_weights(version=version, members=members, timeout_s=self.timeout_s)

    def _kill_stuck(self, members: Mapping[str, Any], version: int) -> dict[str, Any]:
        """After a failed broadcast: kill every member whose weight-transfer call is still running
        `STUCK_GRACE_S` past its deadline (waiting for the deadlines, at most `timeout_s`), or whose probe does
        not answer; returns the others. The pool replaces a killed sampler and it catches up."""
        alive, stuck = dict(members), {}
        until = time.monotonic() + self.timeout_s + STUCK_GRACE_S
        while alive and time.monotonic() < until:
            probes = {name: h.weight_call.remote() for name, h in alive.items()}
            ready, _ = ray.wait(list(probes.values()), num_returns=len(probes), timeout=STUCK_GRACE_S)
            wait = 0.0
            for name, ref in probes.items():
                try:
                    running = ray.get(ref, timeout=0) if ref in ready else ("a probe", math.inf)
                except ray.exceptions.RayError:
                    continue  # a dead sampler: the pool replaces it
                if running is not None and running[1] > STUCK_GRACE_S:
                    stuck[name] = running
                elif running is not None:
                    wait = max(wait, STUCK_GRACE_S - running[1])
            alive = {n: h for n, h in alive.items() if n not in stuck}
            if wait == 0.0:
                break
            time.sleep(min(wait + 0.1, max(until - time.monotonic(), 0.0)))
        for name, (what, late) in stuck.items():
            log.error(
                "%s: its %s call is still running %.0f s past its deadline (version %d); killed, the pool "
                "replaces it",
                name,
                what,
                late,
                version,
            )
            ray.kill(members[name])
            self.killed.append(name)
        return alive

    def _failed(self, version: int, cause: str, *, published: tuple[Any, int]) -> None:
        """Count a failed broadcast (the object-store fallback does not reset the count); at `max_failures` in
        a row stop the run, or move to the object store for good."""
        self.failed_in_a_row += 1
        if self.failed_in_a_row < self._loads.max_failures:
            return
        what = (
            f"the collective weight transfer failed {self.failed_in_a_row} versions in a row (up to version "
            f"{version}; async.max_weight_failures={self._loads.max_failures}); last cause: {cause}"
        )
        if self.on_failure == "stop":
            raise WeightSyncFailed(
                f"{what}. Each version went through the object store instead; to train on that way, set "
                "async.on_collective_failure=object_store (or async.weight_sync=object_store)"
            )
        log.error(
            "%s. Every later version goes through the object store (async.on_collective_failure=object_store); "
            "the collective transport is off for the rest of this run",
            what,
        )
        self._object_store = ObjectStoreTransport(
            learners=self._learners, samplers=self._samplers, taken_over=(self._loads, published)
        )

    def catch_up(self, handle: Any) -> None:
        """Load the learner's current weights (tagged with its version) on a new sampler via the object store."""
        if self._object_store is not None:
            return self._object_store.catch_up(handle)
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
    on_failure: CollectiveFallback = "stop",
) -> ObjectStoreTransport | VLLMTransport:
    """The transport named by the config value ``async.weight_sync`` (``on_failure``:
    ``async.on_collective_failure``)."""
    if kind == "object_store":
        return ObjectStoreTransport(learners=learners, samplers=samplers, max_failures=max_failures)
    if kind == "collective":
        return VLLMTransport(
            learners=learners,
            samplers=samplers,
            timeout_s=timeout_s,
            max_failures=max_failures,
            on_failure=on_failure,
        )
    raise ValueError(f"unknown weight transport {kind!r}; choose 'object_store' or 'collective'")
