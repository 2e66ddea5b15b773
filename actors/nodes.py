"""An elastic sampler fleet's nodes: its hooks (`ElasticHooks`) and `NodeBook`, where each sampler of an
`actors.pool.SamplerPool` runs and what the hooks say of those nodes (drained for preemption, gone). The
pool holds a book, tells it of every sampler that joins or leaves, and asks it which samplers a lost or
drained node takes; what happens to them (replaced, drained, their requests re-queued) stays the pool's.
Tests: tests/actors/test_nodes.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ElasticHooks:
    """A fleet that grows, shrinks and loses nodes (`exgrpo.runtime.elastic.pool_hooks`; none: a fixed fleet)."""

    on_scale: Callable[[int], None] | None = None  # hears every new count (asks the autoscaler for n)
    node_of: Callable[[Any], str | None] | None = None  # a joined sampler's node
    # the nodes being drained (Ray's drain API: a spot notice) -> their deadlines (wall clock, s), read <= 1/s;
    # a sampler on one takes no new request, and hands back what it holds `preempt_grace_s` before the deadline
    drains: Callable[[], dict[str, float]] | None = None
    node_gone: Callable[[str], bool] | None = None  # a node's raylet is gone (its sampler is a preemption)
    # of these nodes, those found gone by a probe in the background (`close()` ends it); never blocks
    probe: Any = None
    preempt_grace_s: float = 5.0


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


class NodeBook:
    """Samplers (the pool's manager ids) -> their nodes (`hooks.node_of`; without it every node is unknown, so
    no loss takes a neighbour), and the hand-back deadlines of those on drained nodes (`hooks.drains`)."""

    def __init__(self, hooks: ElasticHooks) -> None:
        self.hooks = hooks
        self._where: dict[int, str | None] = {}  # sampler -> its node (None: unknown)
        self._deadlines: dict[
            int, float
        ] = {}  # sampler on a drained node -> its node's deadline (wall clock)
        self._drains_at = 0.0  # when `drains` may be read again

    def join(self, aid: int, handle: Any) -> None:
        """Sampler `aid` (actor `handle`) joined: note its node."""
        self._where[aid] = self.hooks.node_of(handle) if self.hooks.node_of is not None else None

    def forget(self, aid: int) -> None:
        """Sampler `aid` left the pool."""
        self._where.pop(aid, None)
        self._deadlines.pop(aid, None)

    def node(self, aid: int) -> str | None:
        """Sampler `aid`'s node (None: unknown, or not a sampler of the pool)."""
        return self._where.get(aid)

    def lost(self, aid: int, err: Any) -> bool:
        """Whether sampler `aid`'s failure `err` is its node's loss (`node_lost`), its raylet asked only when
        the error leaves it open."""
        node, check = self._where.get(aid), self.hooks.node_gone
        return node_lost(err, None if node is None or check is None else lambda: check(node))

    def gone_with(self, lost: set[int], ids: Iterable[int]) -> set[int]:
        """The samplers of `ids` on the nodes that `lost` went with: a vanished node takes every sampler on
        it, and one whose call has not failed yet would hold its requests until Ray declares the node dead
        (seconds in which a step waits for them)."""
        nodes = {self._where.get(aid) for aid in lost} - {None}
        return {aid for aid in ids if aid not in lost and self._where.get(aid) in nodes}

    def probed_lost(self, ids: Collection[int]) -> set[int]:
        """The samplers of `ids` on nodes that the probe found gone: seen before any call to them fails
        (which, for a host that vanished, waits until Ray declares the node dead)."""
        if self.hooks.probe is None:
            return set()
        gone = self.hooks.probe(
            {node for aid, node in self._where.items() if node is not None and aid in ids}
        )
        return {aid for aid in ids if self._where.get(aid) in gone}

    def drained(self, ids: Collection[int]) -> dict[int, float]:
        """The samplers of `ids` on drained nodes, not marked yet (`mark`) -> their nodes' deadlines; `drains`
        is read at most once a second (nothing in between)."""
        now = time.time()
        if self.hooks.drains is None or now < self._drains_at:
            return {}
        self._drains_at = now + 1.0
        out: dict[int, float] = {}
        for node, deadline in self.hooks.drains().items():
            for aid, where in self._where.items():
                if where == node and aid not in self._deadlines and aid in ids:
                    out[aid] = deadline
        return out

    def mark(self, aid: int, *, deadline: float) -> None:
        """Sampler `aid`'s node goes away at `deadline` (wall clock, s; 0: none given)."""
        self._deadlines[aid] = deadline if deadline > 0 else float("inf")

    def due(self) -> list[int]:
        """The marked samplers whose node's deadline is `preempt_grace_s` or less away: they hand back now."""
        now = time.time()
        return [
            aid for aid, deadline in self._deadlines.items() if now >= deadline - self.hooks.preempt_grace_s
        ]

    def close(self) -> None:
        """End the probe (its background thread), if any."""
        if self.hooks.probe is not None:
            self.hooks.probe.close()
