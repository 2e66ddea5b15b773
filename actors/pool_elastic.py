"""The elastic half of `actors.pool.SamplerPool`: samplers on drained (preempted) nodes, and the pool's idle
time, the autoscale policy's signal (`exgrpo/loop/autoscale.py`). See the pool's module docstring."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("actors.pool")


def node_lost(err: Any, node_gone: Callable[[], bool] | None = None) -> bool:
    """Whether a sampler's error says its node went: drained for preemption (`ActorDiedError.preempted`), its
    node marked dead, or its process unreachable (`ActorUnavailableError`, what a vanished raylet gives before
    the GCS marks the node dead) while `node_gone()` finds its raylet gone; a sampler's own crash, an OOM kill
    or a worker killed on a live node is a failure."""
    import ray

    if getattr(err, "preempted", False):
        return True
    if isinstance(err, ray.exceptions.ActorUnavailableError):
        return node_gone is not None and node_gone()
    text = str(err).lower()
    return "its node has died" in text or "node was terminated" in text


class ElasticPool:
    """Mixed into `SamplerPool`, whose state it reads (declared here for the type checker)."""

    manager: Any
    drains: Callable[[], dict[str, float]] | None
    node_gone: Callable[[str], bool] | None
    probe: Any
    preempt_grace_s: float
    preemptions: int
    _index: dict[int, int]
    _in_flight: dict[int, list[Any]]
    _draining: set[int]
    _nodes: dict[int, str | None]
    _deadlines: dict[int, float]
    _idle_s: float
    _idle_since: float | None
    _drains_at: float

    def _live(self) -> list[int]:
        raise NotImplementedError

    def num_pending(self) -> int:
        raise NotImplementedError

    def _remove(self, aid: int) -> None:
        raise NotImplementedError

    def _add(self, n: int) -> None:
        raise NotImplementedError

    def _gone(self, aid: int) -> Callable[[], bool] | None:
        """Whether sampler `aid`'s node is gone (its raylet unreachable), asked only when needed."""
        node, check = self._nodes.get(aid), self.node_gone
        if node is None or check is None:
            return None
        return lambda: check(node)

    def gone_with(self, lost: set[int]) -> set[int]:
        """The other samplers on the nodes that `lost` went with: a vanished node takes every sampler on it, and
        one whose call has not failed yet would hold its requests until Ray declares the node dead (seconds
        in which a step waits for them)."""
        nodes = {self._nodes.get(aid) for aid in lost} - {None}
        return {aid for aid in self.manager.actor_ids() if aid not in lost and self._nodes.get(aid) in nodes}

    def probed_lost(self) -> set[int]:
        """The samplers on nodes that the probe found gone: seen before any call to them fails (which, for a
        host that vanished, waits until Ray declares the node dead)."""
        if self.probe is None:
            return set()
        ids = set(self.manager.actor_ids())
        gone = self.probe({node for aid, node in self._nodes.items() if node is not None and aid in ids})
        return {aid for aid in ids if self._nodes.get(aid) in gone}

    def idle_seconds(self) -> float:
        """Sampler-seconds so far with nothing queued or in flight (the driver admitted nothing more)."""
        live = len(self._live())
        return self._idle_s + (live * (time.monotonic() - self._idle_since) if self._idle_since else 0.0)

    def _account(self, *, end: bool) -> None:
        """At a verb's start, add the idle time since the last one; at its end, note whether it left the pool
        idle."""
        now = time.monotonic()
        if not end:
            if self._idle_since is not None:
                self._idle_s += (now - self._idle_since) * len(self._live())
            self._idle_since = None
        elif not self.num_pending():
            self._idle_since = now

    def _watch_drains(self) -> None:
        """Samplers on drained nodes stop taking requests; past deadline - grace they hand back what they hold."""
        now = time.time()
        if self.drains is not None and now >= self._drains_at:
            self._drains_at = now + 1.0
            for node, deadline in self.drains().items():
                for aid, where in list(self._nodes.items()):
                    if where == node and aid not in self._deadlines and aid in self.manager.actor_ids():
                        self.preempt(aid, deadline=deadline)
        for aid, deadline in list(self._deadlines.items()):
            if aid in self._in_flight and now >= deadline - self.preempt_grace_s:
                log.warning("sampler %s hands back its requests before its node's deadline", self._index[aid])
                self._remove(aid)

    def preempt(self, aid: int, *, deadline: float) -> None:
        """The sampler `aid`'s node is going away at `deadline` (wall clock, s; 0: none given): drain it, start
        a replacement now."""
        draining = aid in self._draining
        self._deadlines[aid] = deadline if deadline > 0 else float("inf")
        self._draining.add(aid)
        log.warning("sampler %s: its node is drained (preemption); draining it", self._index.get(aid))
        if not draining:  # it counted towards the target: replace it
            self.preemptions += 1
            self._add(1)
