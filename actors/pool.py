"""SamplerPool: the sampler actors, their in-flight requests and their number (`exgrpo.core.roles.Rollouts`).

Over RLlib's `FaultTolerantActorManager`. Invariants: a request stays the pool's until a sampler reports it
done (a failed sampler's go back to the front of the queue, and it is replaced); a sampler it adds is *starting*
until it answers a `ping` (no request, not in `members()`, never blocks a step), then goes to `on_new` (the
weights' `catch_up`) before its first request; a scale-down removes starting samplers first, then drains the
newest live ones. Elastic fleets: `ElasticHooks`, and the samplers' nodes in an `actors.nodes.NodeBook`.
More: docs/architecture.md ("Scaling and faults"); tests/integration/test_pool.py and test_pending_sampler.py.
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

from actors.nodes import ElasticHooks, NodeBook
from exgrpo.core.names import sampler_name
from exgrpo.core.records import GenerationRequest, Prompt, RolloutResult

log = logging.getLogger(__name__)
TAG = "generate"


class SamplerPool:
    """Samplers spawned by `spawn(index)`; requests go out `requests_per_call` at a time."""

    def __init__(
        self,
        *,
        spawn: Callable[[int], Any],
        num: int,
        requests_per_call: int,
        max_in_flight_per_sampler: int = 2,
        on_new: Callable[[Any], None] | None = None,
        on_removed: Callable[[Any], None] | None = None,
        elastic: ElasticHooks | None = None,
    ) -> None:
        if num < 0 or requests_per_call < 1 or max_in_flight_per_sampler < 1:
            raise ValueError(
                "SamplerPool needs num >= 0, requests_per_call >= 1, max_in_flight_per_sampler >= 1"
            )
        self._spawn = spawn  # index -> actor handle (named exgrpo-sampler-<index>)
        self.on_new = on_new  # called with every new sampler's handle before its first request
        self.on_removed = on_removed  # called with every removed sampler's handle after it is killed
        self.requests_per_call = requests_per_call
        self.max_in_flight = max_in_flight_per_sampler
        self.manager = FaultTolerantActorManager(
            max_remote_requests_in_flight_per_actor=max_in_flight_per_sampler
        )
        self._next_index = 0
        self._index: dict[int, int] = {}  # manager actor id -> sampler index
        self._handles: dict[int, Any] = {}  # manager actor id -> actor handle
        self._in_flight: dict[int, list[tuple[GenerationRequest, ...]]] = {}
        self._draining: set[int] = set()
        self._pending: deque[GenerationRequest] = deque()
        self._starting: dict[int, tuple[Any, Any]] = {}  # sampler index -> (handle, its ping's ref)
        self.restarts = 0  # samplers replaced after a failure
        self.preemptions = 0  # samplers lost to a drained or vanished node (replaced, not failures)
        e = elastic or ElasticHooks()
        self.on_scale = e.on_scale
        self._nodes = NodeBook(e)  # manager actor id -> its node; drained nodes' deadlines
        self.lost_at: list[float] = []  # monotonic time each sampler was seen lost with its node
        self._idle_s = 0.0  # sampler-seconds with nothing queued or in flight, up to `_idle_since`
        self._idle_since: float | None = None  # since when the pool is idle (None: busy)
        self._add(num)
        self._start_initial()

    # -- membership ----------------------------------------------------------------------------------
    def _live(self) -> list[int]:
        """Manager ids of the started, healthy, not draining samplers, oldest (lowest index) first."""
        live = [a for a in self.manager.healthy_actor_ids() if a not in self._draining]
        return sorted(live, key=lambda a: self._index[a])

    def members(self) -> dict[str, Any]:
        """Live samplers that take new requests: stable id -> handle, oldest first."""
        return {sampler_name(self._index[a]): self._handles[a] for a in self._live()}

    def nodes(self) -> dict[str, str | None]:
        """The live samplers' nodes: `members()`'s ids -> node id (None: unknown, e.g. a fixed fleet)."""
        return {sampler_name(self._index[a]): self._nodes.node(a) for a in self._live()}

    def size(self) -> int:
        """Samplers that count towards the desired number: live ones and starting ones (not draining)."""
        return len(self._live()) + len(self._starting)

    def num_starting(self) -> int:
        """Samplers added but not yet answering (being placed by Ray, or building their engine)."""
        return len(self._starting)

    def _add(self, n: int) -> None:
        """Start `n` samplers; each joins (`_join`) once its ping answers."""
        for _ in range(n):
            handle = self._spawn(self._next_index)
            self._starting[self._next_index] = (handle, handle.ping.remote())
            self._next_index += 1

    def _start_initial(self) -> None:
        """Wait for the constructor's samplers; a start that fails raises (a config error, not a crash)."""
        for index, (_, ref) in list(self._starting.items()):
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as err:
                self.shutdown()
                raise RuntimeError(f"sampler {sampler_name(index)} failed to start: {err}") from err
        self._promote(timeout_s=0)

    def _promote(self, *, timeout_s: float) -> None:
        """Join the starting samplers whose ping has answered (waiting up to `timeout_s` for the first);
        one that died while starting is replaced."""
        if not self._starting:
            return
        refs = {ref: index for index, (_, ref) in self._starting.items()}
        if timeout_s > 0 and not ray.wait(list(refs), num_returns=1, timeout=timeout_s)[0]:
            return
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            index = refs[ref]
            handle, _ = self._starting.pop(index)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as err:
                log.error("sampler %s died while starting: %s", sampler_name(index), err)
                self._kill(handle)
                self.restarts += 1
                self._add(1)
                continue
            self._join(index, handle)

    def wait_started(self, *, timeout_s: float = 600.0) -> None:
        """Block until every starting sampler has joined (for callers that want new samplers serving now,
        e.g. tests); raises TimeoutError naming how many are still starting (can Ray place them?)."""
        deadline = time.monotonic() + timeout_s
        while self._starting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{len(self._starting)} sampler(s) still starting after {timeout_s:.0f} s: Ray may have no "
                    "room to place them (they stay PENDING_CREATION)"
                )
            self._promote(timeout_s=min(left, 1.0))

    def _join(self, index: int, handle: Any) -> None:
        # before any request reaches it, with the weights of now (Ray runs one caller's calls on an actor in
        # submission order, so what `on_new` submits is applied before the first generate)
        if self.on_new is not None:
            self.on_new(handle)
        self.manager.add_actors([handle])
        aid = max(self.manager.actor_ids())
        self._index[aid] = index
        self._handles[aid] = handle
        self._in_flight[aid] = []
        self._nodes.join(aid, handle)

    def scale(self, *, num: int) -> None:
        """Grow to `num` samplers, or shrink: starting samplers are removed first (newest first; this
        cancels a creation Ray could not place), then the newest live ones are drained (they finish their
        requests, then stop)."""
        if num < 1:
            raise ValueError("a run needs at least one sampler")
        self._promote(timeout_s=0)
        current = self._live()
        if num > self.size():
            self._add(num - self.size())
        for index in sorted(self._starting, reverse=True)[: max(0, self.size() - num)]:
            handle, _ = self._starting.pop(index)
            log.info("sampler %s removed before it started", sampler_name(index))
            self._kill(handle)
        for aid in current[::-1][: max(0, len(current) - num)]:
            self._draining.add(aid)
        self._reap_drained()
        self._dispatch()
        if self.on_scale is not None:  # e.g. ask Ray's autoscaler for `num` sampler bundles
            self.on_scale(num)

    def _reap_drained(self) -> None:
        for aid in list(self._draining):
            if not self._in_flight.get(aid):
                self._remove(aid)

    def _replace(self, failed: set[int], lost: set[int] | None = None) -> None:
        """Remove failed samplers (their requests go back to the front of the queue) and start one new
        sampler for each that was not draining anyway; one whose node went (`lost`) is a preemption."""
        for aid in failed:
            if aid in self.manager.actor_ids():
                draining = aid in self._draining
                self._remove(aid, close=False)
                if not draining:
                    if lost and aid in lost:
                        self.preemptions += 1
                    else:
                        self.restarts += 1
                    self._add(1)

    def _remove(self, aid: int, *, close: bool = True) -> None:
        """Forget a sampler, put its requests back at the front of the queue and kill it; `close` first asks it
        to release its engine (not for a failed one: a call to a sampler whose node vanished waits until Ray
        declares the node dead, seconds in which the step would stall)."""
        handle = self.manager.remove_actor(aid)
        self._draining.discard(aid)
        self._nodes.forget(aid)
        for chunk in reversed(self._in_flight.pop(aid, [])):  # back to the front of the queue
            self._pending.extendleft(reversed(chunk))
        self._index.pop(aid, None)
        self._handles.pop(aid, None)
        if close:
            with contextlib.suppress(Exception):  # a dead actor cannot close
                ray.get(handle.close.remote(), timeout=10)
        self._kill(handle)

    def _kill(self, handle: Any) -> None:
        ray.kill(handle)
        if self.on_removed is not None:  # e.g. release a tensor-parallel sampler's placement group
            self.on_removed(handle)

    # -- nodes and idle time ---------------------------------------------------------------------------
    def preempt(self, aid: int, *, deadline: float) -> None:
        """The sampler `aid`'s node is going away at `deadline` (wall clock, s; 0: none given): drain it, start
        a replacement now."""
        draining = aid in self._draining
        self._nodes.mark(aid, deadline=deadline)
        self._draining.add(aid)
        log.warning("sampler %s: its node is drained (preemption); draining it", self._index.get(aid))
        if not draining:  # it counted towards the target: replace it
            self.preemptions += 1
            self._add(1)

    def _watch_drains(self) -> None:
        """Samplers on drained nodes take no new request; past deadline - grace, they hand back their own."""
        for aid, deadline in self._nodes.drained(self.manager.actor_ids()).items():
            self.preempt(aid, deadline=deadline)
        for aid in self._nodes.due():
            if aid in self._in_flight:
                log.warning("sampler %s hands back its requests before its node's deadline", self._index[aid])
                self._remove(aid)

    def idle_seconds(self) -> float:
        """Sampler-seconds so far with nothing queued or in flight (the driver admitted nothing more): the
        autoscale policy's signal (`exgrpo/loop/autoscale.py`)."""
        since = self._idle_since
        return self._idle_s + (len(self._live()) * (time.monotonic() - since) if since is not None else 0.0)

    def _account(self, *, end: bool) -> None:
        """At a verb's start, add the idle time since the last one; at its end, note whether it left the pool
        idle."""
        if not end:
            self._idle_s = self.idle_seconds()
            self._idle_since = None
        elif not self.num_pending():
            self._idle_since = time.monotonic()

    # -- requests ------------------------------------------------------------------------------------
    def submit(self, *, requests: Sequence[GenerationRequest]) -> None:
        """Queue requests; each is reported by `poll` exactly once."""
        self._account(end=False)
        self._pending.extend(requests)
        self._dispatch()
        self._account(end=True)

    def num_pending(self) -> int:
        """Requests queued or in flight."""
        return len(self._pending) + sum(len(c) for chunks in self._in_flight.values() for c in chunks)

    def _dispatch(self) -> None:
        while self._pending:
            free = [a for a in self._live() if len(self._in_flight[a]) < self.max_in_flight]
            if not free:
                return
            aid = min(free, key=lambda a: len(self._in_flight[a]))
            chunk = tuple(
                self._pending.popleft() for _ in range(min(self.requests_per_call, len(self._pending)))
            )
            fired = self.manager.foreach_actor_async(
                "generate", tag=TAG, kwargs={"requests": chunk}, remote_actor_ids=[aid]
            )
            if fired != 1:  # the manager refused (busy); put it back and stop for now
                self._pending.extendleft(reversed(chunk))
                return
            self._in_flight[aid].append(chunk)

    def poll(self, *, timeout_s: float) -> list[RolloutResult]:
        """Results finished since the last call; failed samplers are replaced and their requests re-queued;
        started samplers join. With nothing in flight it waits (up to `timeout_s`) for a starting sampler."""
        self._account(end=False)
        self._watch_drains()
        idle = not any(self._in_flight.values())
        self._promote(timeout_s=timeout_s if idle else 0)
        self._dispatch()
        results = self.manager.fetch_ready_async_reqs(tags=TAG, timeout_seconds=timeout_s)
        done, failed, lost = [], set(), set()
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
                err = r.get()
                log.error("sampler %s failed: %s", self._index.get(r.actor_id), err)
                failed.add(r.actor_id)
                if self._nodes.lost(r.actor_id, err):
                    lost.add(r.actor_id)
        ids = set(self.manager.actor_ids())
        for aid in self._nodes.gone_with(lost, ids) | (self._nodes.probed_lost(ids) - failed):
            log.warning("sampler %s: its node went", self._index.get(aid))
            failed.add(aid)
            lost.add(aid)
        self.lost_at += [time.monotonic()] * len(lost)
        self._replace(failed, lost)
        self._reap_drained()
        self._dispatch()
        self._account(end=True)
        return done

    def wait_idle(self, *, timeout_s: float = 600.0) -> list[RolloutResult]:
        """Finish every queued request (used at shutdown and in tests); returns their results."""
        out, deadline = [], time.monotonic() + timeout_s
        while self.num_pending() and time.monotonic() < deadline:
            out += self.poll(timeout_s=0.5)
        return out

    # -- evaluation ----------------------------------------------------------------------------------
    def evaluate(
        self, *, prompts: Sequence[Prompt], n: int, max_attempts: int = 3, start_timeout_s: float = 600.0
    ) -> list[tuple[float, ...]]:
        """n rewards per prompt, in prompt order: contiguous slices of the prompts, one per live sampler.

        Each sampler evaluates after the requests already sent to it (and with the weights they left). A
        sampler that dies meanwhile is replaced, as in generation, and its slice is evaluated again on the
        live samplers (at most `max_attempts` rounds; an error raised inside `evaluate` is not retried).
        With no live sampler (the only one died), it waits up to `start_timeout_s` for a starting one.
        """
        if not prompts:
            return []
        scores: dict[int, list[tuple[float, ...]]] = {}  # slice start -> its scores
        todo = [(0, list(prompts))]
        for _ in range(max_attempts):
            live = self._live()
            deadline = time.monotonic() + start_timeout_s
            while (
                not live and self._starting and time.monotonic() < deadline
            ):  # e.g. the only one was replaced
                self._promote(timeout_s=1.0)
                live = self._live()
            if not live:
                raise RuntimeError("no live sampler to evaluate on")
            calls = []
            for start, part in todo:  # each slice over every live sampler, contiguous, the first ones larger
                per, extra = divmod(len(part), len(live))
                lo = 0
                for j, aid in enumerate(live):
                    hi = lo + per + (j < extra)
                    if hi > lo:
                        ref = self._handles[aid].evaluate.remote(prompts=part[lo:hi], n=n)
                        calls.append((aid, start + lo, part[lo:hi], ref))
                    lo = hi
            todo, dead = [], set()
            for aid, start, sub, ref in calls:
                try:
                    scores[start] = [tuple(s) for s in ray.get(ref)]
                except ray.exceptions.RayActorError as err:
                    log.error("sampler %s died during evaluation: %s", self._index.get(aid), err)
                    dead.add(aid)
                    todo.append((start, sub))
            self._replace(dead)
            self._dispatch()
            if not todo:
                return [s for start in sorted(scores) for s in scores[start]]
        raise RuntimeError(f"held-out evaluation failed on {max_attempts} rounds of samplers")

    def shutdown(self) -> None:
        """Stop every sampler (queued and in-flight requests are dropped)."""
        for aid in list(self.manager.actor_ids()):
            self._in_flight[aid] = []
            self._remove(aid)
        for handle, _ in self._starting.values():
            self._kill(handle)
        self._starting.clear()
        self._pending.clear()
        if self.on_scale is not None:  # release the autoscaler request
            self.on_scale(0)
        self._nodes.close()
