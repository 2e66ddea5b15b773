"""One replay shard: an ExperiencePool plus the queue of finished groups waiting for the learner.

A plain class; `run.py` turns it into the Ray actor `exgrpo-replay-<i>`. Questions are routed to
shards by a stable hash of their qid (see `buffers/sharded.py`), so every statistic of a question
lives in exactly one shard.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from buffers.experience import ExperiencePool
from buffers.records import groups_from_arrow, groups_to_arrow
from exgrpo.types import Group, Trajectory


@dataclass(frozen=True)
class ShardStats:
    """What one shard reports for metrics."""

    bucket_sizes: dict[int, int]  # sampleable questions per bucket k
    active: int  # sampleable questions
    retired: int  # questions solved K/K (never replayed again)
    trajectories: int  # stored correct trajectories
    ready: int  # finished groups waiting to be pulled


@dataclass(frozen=True)
class ReadyEntry:
    request_id: int
    kind: str


class ReplayShard:
    """An `ExperiencePool` and a ready queue of finished groups, keyed by request id."""

    def __init__(
        self,
        *,
        k_rollouts: int,
        max_trajectories_per_question: int = 8,
        mu: float | None = None,
        sigma: float = 1.0,
        uniform: bool = False,
        seed: int = 0,
    ) -> None:
        self._pool_kwargs = dict(
            max_trajectories_per_question=max_trajectories_per_question, mu=mu, sigma=sigma, uniform=uniform
        )
        self.k_rollouts = k_rollouts
        self.pool = ExperiencePool(k_rollouts, **self._pool_kwargs)
        self.collect = False  # switched on for good at the delayed start
        self._ready: dict[int, Group] = {}
        self._pinned: dict[str, deque[tuple[Trajectory, ...]]] = {}  # qid -> candidates at sampling time
        self._rng = np.random.default_rng(seed)

    def ping(self) -> str:
        return "pong"

    def set_collect(self, *, on: bool) -> None:
        """Start (or stop) storing correct trajectories; the driver flips it at the delayed start."""
        self.collect = on

    def push(self, *, groups: Sequence[Group]) -> int:
        """Record finished groups and queue them for the learner. Returns the number queued.

        A replay group gets the candidates pinned when its question was sampled (so stored before the
        group was sampled, and kept even if the question retires meanwhile); a replay group pushed
        without a sampling (tests, tools) gets the candidates stored now, before it is recorded.
        Either way they never include the group's own trajectories.
        """
        for group in groups:
            if group.kind == "replay":
                pinned = self._pinned.get(group.qid)
                cands = pinned.popleft() if pinned else tuple(self.pool.candidates(group.qid))
                if pinned is not None and not pinned:
                    del self._pinned[group.qid]
                # Without any candidate (only possible for an unsampled push) the K - 1 fresh
                # rollouts are trained as a fresh group rather than dropped.
                group = replace(group, candidates=cands) if cands else replace(group, kind="fresh")
            if group.group_size == self.k_rollouts:
                self.pool.record(group, collect=self.collect)
            self._ready[group.request_id] = group
        return len(groups)

    def ready(self) -> list[ReadyEntry]:
        return [ReadyEntry(rid, g.kind) for rid, g in self._ready.items()]

    def take(self, *, request_ids: Sequence[int]) -> list[Group]:
        """Remove and return the named finished groups (KeyError names a missing id)."""
        missing = [r for r in request_ids if r not in self._ready]
        if missing:
            raise KeyError(f"requests {missing} are not finished in this shard")
        return [self._ready.pop(r) for r in request_ids]

    def bucket_sizes(self) -> dict[int, int]:
        return self.pool.bucket_sizes()

    def sample_from_buckets(self, *, counts: Mapping[int, int], seed: int) -> list[str]:
        """Uniformly pick `counts[k]` distinct sampleable questions from each bucket k.

        Each picked question's current candidates are pinned for the replay group that will follow.
        """
        qids = self.pool.sample_from_buckets(counts, rng=np.random.default_rng(seed))
        for q in qids:
            self._pinned.setdefault(q, deque()).append(tuple(self.pool.candidates(q)))
        return qids

    def candidates(self, *, qid: str) -> list[Trajectory]:
        return self.pool.candidates(qid)

    def retired(self) -> frozenset[str]:
        return self.pool.retired()

    def stats(self) -> ShardStats:
        return ShardStats(
            bucket_sizes=self.pool.bucket_sizes(),
            active=len(self.pool),
            retired=len(self.pool.retired()),
            trajectories=self.pool.num_trajectories(),
            ready=len(self._ready),
        )

    def snapshot(self, *, path: str) -> int:
        """Write the pool to `<path>` and the queue of finished groups to `<path>.ready` (parquet).

        Each file is written under a temporary name and renamed. Returns the bytes written.
        """
        written = 0
        for table, target in ((self.pool.to_arrow(), Path(path)),
                              (groups_to_arrow(list(self._ready.values())), Path(f"{path}.ready"))):
            tmp = target.with_name(target.name + ".tmp")
            pq.write_table(table, tmp)
            tmp.replace(target)
            written += target.stat().st_size
        return written

    def restore(self, *, path: str) -> None:
        """Load what `snapshot` wrote (the pool, and the finished groups if that file exists)."""
        self.pool = ExperiencePool.from_arrow(pq.read_table(path), k_rollouts=self.k_rollouts, **self._pool_kwargs)
        ready = Path(f"{path}.ready")
        self._ready = {g.request_id: g for g in groups_from_arrow(pq.read_table(ready))} if ready.exists() else {}
