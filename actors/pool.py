"""SamplerPool: the sampler actors, their in-flight requests, their weights and their number.

Health tracking and async request bookkeeping come from RLlib's `FaultTolerantActorManager` (the
way RLlib manages EnvRunners). On top of it the pool keeps every request it was given until a
sampler reports it done: a failed or removed sampler's requests go back to the queue, so none is
lost. A new sampler is sent the latest weights before its first request (Ray runs calls from one
caller on one actor in submission order).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.rllib.utils.actor_manager import FaultTolerantActorManager

from exgrpo.types import GenerationRequest

log = logging.getLogger(__name__)
TAG = "generate"


class SamplerPool:
    def __init__(self, *, spawn: Callable[[int], Any], num: int, requests_per_call: int,
                 max_in_flight_per_sampler: int = 2) -> None:
        self._spawn = spawn  # index -> actor handle (named exgrpo-sampler-<index>)
        self._next_index = 0
        self.requests_per_call = requests_per_call
        self.max_in_flight = max_in_flight_per_sampler
        self.manager = FaultTolerantActorManager(max_remote_requests_in_flight_per_actor=max_in_flight_per_sampler)
        self._index: dict[int, int] = {}  # manager actor id -> sampler index (its name)
        self._handles: dict[int, Any] = {}  # manager actor id -> actor handle
        self._in_flight: dict[int, list[tuple[GenerationRequest, ...]]] = {}
        self._draining: set[int] = set()
        self._pending: deque[GenerationRequest] = deque()
        self._weights: tuple[Any, int] | None = None  # (object ref of the latest weights, version)
        self._weights_source: tuple[Any, int] | None = None
        self._load_refs: list[Any] = []
        self.load_times: list[float] = []
        self.restarts = 0
        self.add(num)

    # -- membership ----------------------------------------------------------------------------------
    @property
    def actor_ids(self) -> list[int]:
        return [a for a in self.manager.healthy_actor_ids() if a not in self._draining]

    def handles(self) -> list[Any]:
        return [self._handles[a] for a in self.actor_ids]

    def size(self) -> int:
        return len(self.actor_ids)

    def add(self, n: int) -> None:
        for _ in range(n):
            handle = self._spawn(self._next_index)
            if self._weights_source is not None:  # collective mode: export once for the newcomer
                learners, version = self._weights_source
                self._weights, self._weights_source = (learners.get_weights_ref(), version), None
            if self._weights is not None:  # catch up before the first request
                ref, version = self._weights
                self._load_refs.append(handle.load_weights.remote(weights=ref, version=version))
            self.manager.add_actors([handle])
            aid = max(self.manager.actor_ids())
            self._index[aid] = self._next_index
            self._handles[aid] = handle
            self._in_flight[aid] = []
            self._next_index += 1

    def scale(self, n: int) -> None:
        """Grow to n samplers, or drain the newest ones (they finish their requests, then stop)."""
        if n < 1:
            raise ValueError("a run needs at least one sampler")
        current = self.actor_ids
        if n > len(current):
            self.add(n - len(current))
        for aid in sorted(current, reverse=True)[: max(0, len(current) - n)]:
            self._draining.add(aid)
        self._reap_drained()

    def _reap_drained(self) -> None:
        for aid in list(self._draining):
            if not self._in_flight.get(aid):
                self._remove(aid)

    def _remove(self, aid: int) -> None:
        handle = self.manager.remove_actor(aid)
        self._draining.discard(aid)
        for chunk in reversed(self._in_flight.pop(aid, [])):  # back to the front of the queue
            self._pending.extendleft(reversed(chunk))
        self._index.pop(aid, None)
        self._handles.pop(aid, None)
        with contextlib.suppress(Exception):  # a dead actor cannot close
            ray.get(handle.close.remote(), timeout=10)
        ray.kill(handle)

    # -- requests ------------------------------------------------------------------------------------
    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        self._pending.extend(requests)
        self._dispatch()

    def num_pending(self) -> int:
        return len(self._pending) + sum(len(c) for chunks in self._in_flight.values() for c in chunks)

    def _dispatch(self) -> None:
        while self._pending:
            free = [a for a in self.actor_ids if len(self._in_flight[a]) < self.max_in_flight]
            if not free:
                return
            aid = min(free, key=lambda a: len(self._in_flight[a]))
            chunk = tuple(self._pending.popleft() for _ in range(min(self.requests_per_call, len(self._pending))))
            fired = self.manager.foreach_actor_async("generate", tag=TAG, kwargs={"requests": chunk},
                                                     remote_actor_ids=[aid])
            if fired != 1:  # the manager refused (busy); put it back and stop for now
                self._pending.extendleft(reversed(chunk))
                return
            self._in_flight[aid].append(chunk)

    def poll(self, *, timeout_s: float = 0.1) -> list[Any]:
        """Finished GenerateResults; failed samplers are replaced and their requests re-queued."""
        self._dispatch()
        results = self.manager.fetch_ready_async_reqs(tags=TAG, timeout_seconds=timeout_s)
        done, failed = [], set()
        for r in results:
            if r.ok:
                res = r.get()
                chunks = self._in_flight.get(r.actor_id, [])
                ids = set(res.request_ids)
                for i, c in enumerate(chunks):
                    if {q.request_id for q in c} == ids:
                        del chunks[i]
                        break
                done.append(res)
            else:
                log.error("sampler %s failed: %s", self._index.get(r.actor_id), r.get())
                failed.add(r.actor_id)
        for aid in failed:
            if aid in self.manager.actor_ids():
                self._remove(aid)
                self.restarts += 1
                self.add(1)
        self._reap_drained()
        self._dispatch()
        return done

    # -- weights -------------------------------------------------------------------------------------
    def set_weights(self, *, ref: Any, version: int) -> None:
        """Object-store transport: every sampler applies `ref` before its next request."""
        self._weights, self._weights_source = (ref, version), None
        self._load_refs += [h.load_weights.remote(weights=ref, version=version) for h in self.handles()]

    def weight_load_times(self) -> list[float]:
        """Seconds each finished weight load took since the last call (non-blocking)."""
        ready, self._load_refs = ray.wait(self._load_refs, num_returns=len(self._load_refs), timeout=0)
        out = []
        for ref in ready:
            try:
                out.append(ray.get(ref))
            except Exception as e:  # noqa: BLE001 - the generate path notices dead samplers
                log.warning("weight load failed: %s", e)
        return out

    def wait_idle(self, *, timeout_s: float = 600.0) -> list[Any]:
        """Finish every queued request (used at shutdown and in tests)."""
        out, deadline = [], time.monotonic() + timeout_s
        while self.num_pending() and time.monotonic() < deadline:
            out += self.poll(timeout_s=0.5)
        return out

    def shutdown(self) -> None:
        for aid in list(self.manager.actor_ids()):
            self._in_flight[aid] = []
            self._remove(aid)

    def broadcast_collective(self, *, learners: Any, version: int) -> float:
        """Collective transport: learner rank 0 broadcasts over a gloo group of itself + samplers.

        The group is rebuilt whenever the set of samplers changed. A sampler added since the last
        broadcast already holds the object-store weights it caught up with, then joins the group.
        Returns seconds spent (blocks until every sampler has taken part).
        """
        t0 = time.perf_counter()
        members = tuple(self.actor_ids)
        rank0 = learners.rank0
        if getattr(self, "_sync_members", None) != members:
            self._sync_generation = getattr(self, "_sync_generation", 0) + 1
            specs = ray.get(rank0.weight_specs.remote())
            info = ray.get(rank0.open_sync_group.remote(world_size=1 + len(members),
                                                         group_name=f"exgrpo-sync-{self._sync_generation}"))
            joins = [self._handles[a].join_sync_group.remote(info=info, rank=i + 1, specs=specs)
                     for i, a in enumerate(members)]
            ray.get([rank0.connect_sync_group.remote(), *joins])
            self._sync_members = members
        receives = [self._handles[a].receive_weights.remote(version=version) for a in members]
        ray.get([rank0.broadcast_weights.remote(), *receives])
        self._weights_source = (learners, version)  # samplers added later fetch these lazily
        return time.perf_counter() - t0
