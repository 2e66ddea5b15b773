"""One replay shard: an ExperiencePool plus the queue of finished groups waiting for the learner.

A plain class; `exgrpo/launch.py` makes it the Ray actor `exgrpo-replay-<i>`, tests use it in-process.
Questions are routed to shards by a stable hash of their qid (`buffers/sharded.py`), so every
statistic of a question lives in exactly one shard.

Guarantees:
- `push` is idempotent by request id: a request re-issued after a sampler failure may be pushed
  twice; the second copy is ignored (its k is recorded once; the first copy is the one trained).
- A replay group carries the candidates its request was given when its question was sampled; the
  shard keeps no per-question hidden state between `sample` and `push`.
- `take` never hands out a replay group whose question was retired by another group (a fresh group
  solved it K/K while the replay request was in flight): it reports its request id as dropped and the
  driver re-issues a fresh request in its place. A replay group whose own K - 1 rollouts completed the
  K/K is kept (it is the group that retired the question; all its advantages are 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from buffers.experience import ExperiencePool
from buffers.records import groups_from_arrow, groups_to_arrow
from exgrpo.fileio import atomic_write
from exgrpo.types import Group, PulledBatch, ReplayPick, ReplayStats


class ReplayShard:
    """An `ExperiencePool` and a ready queue of finished groups, keyed by request id."""

    def __init__(self, *, k_rollouts: int, max_trajectories_per_question: int = 8) -> None:
        self.k_rollouts = k_rollouts
        self.max_trajectories_per_question = max_trajectories_per_question
        self.pool = ExperiencePool(k_rollouts, max_trajectories_per_question)
        self.collect = False  # switched on for good at the delayed start
        self._ready: dict[int, Group] = {}
        self._seen: set[int] = set()  # request ids pushed so far (idempotent push)
        self._retirers: set[int] = set()  # request ids whose own group retired its question

    def ping(self) -> str:
        return "pong"

    def set_collect(self, *, on: bool) -> None:
        """Start (or stop) storing correct trajectories; the driver flips it at the delayed start."""
        self.collect = on

    def push(self, *, groups: Sequence[Group]) -> int:
        """Record finished groups and queue them for the learner; returns how many were new."""
        new = 0
        for group in groups:
            if group.request_id in self._seen:
                continue  # a re-issued request's second copy
            if group.kind == "replay" and not group.candidates:
                raise ValueError(f"replay group of request {group.request_id} ({group.qid!r}) carries no "
                                 "candidates; a replay request must carry those pinned when its question was sampled")
            if group.group_size != self.k_rollouts:
                raise ValueError(f"group of request {group.request_id} has {group.group_size} rollouts "
                                 f"(replay slot included); this replay service is for K={self.k_rollouts}")
            retired_before = self.pool.is_retired(group.qid)
            self.pool.record(group, collect=self.collect)
            if not retired_before and self.pool.is_retired(group.qid):
                self._retirers.add(group.request_id)
            self._seen.add(group.request_id)
            self._ready[group.request_id] = group
            new += 1
        return new

    def take(self, *, request_ids: Sequence[int]) -> PulledBatch:
        """Remove and return those of `request_ids` finished here (ids of other shards are ignored).

        A replay group whose question another group retired since it was sampled is removed too and
        reported in `dropped` instead: a retired question is never replayed.
        """
        groups, dropped = [], []
        for rid in request_ids:
            g = self._ready.pop(rid, None)
            if g is None:
                continue
            if g.kind == "replay" and self.pool.is_retired(g.qid) and rid not in self._retirers:
                dropped.append(rid)
            else:
                groups.append(g)
        return PulledBatch(groups=tuple(groups), dropped=tuple(dropped), stats=self.stats())

    def sample(self, *, counts: Mapping[int, int], seed: int,
               exclude: Sequence[str] = ()) -> tuple[list[ReplayPick], dict[int, int]]:
        """Up to `counts[k]` distinct sampleable questions from each bucket k, with their candidates.

        One atomic step of this shard: sizes may have changed since the caller planned `counts`, so a
        bucket gives what it has. Returns the picks and the bucket sizes left (`exclude` and the picks
        not counted), for the caller to redistribute any shortfall.
        """
        skip = frozenset(exclude)
        qids = self.pool.sample_from_buckets(counts, rng=np.random.default_rng(seed), exclude=skip)
        picks = [ReplayPick(qid=q, candidates=tuple(self.pool.candidates(q))) for q in qids]
        return picks, self.pool.bucket_sizes(exclude=skip | set(qids))

    def bucket_sizes(self) -> dict[int, int]:
        return self.pool.bucket_sizes()

    def retired(self) -> frozenset[str]:
        return self.pool.retired()

    def stats(self) -> ReplayStats:
        return ReplayStats(bucket_sizes=self.pool.bucket_sizes(), active=len(self.pool),
                           retired=len(self.pool.retired()), trajectories=self.pool.num_trajectories(),
                           ready=len(self._ready))

    # -- snapshots ---------------------------------------------------------------------------------
    def snapshot(self, *, path: str) -> int:
        """Write the pool to `<path>`, the finished groups to `<path>.ready` and the pushed request ids
        (and whether each retired its question) to `<path>.seen` (parquet, each written atomically).
        Returns the bytes written."""
        ids = sorted(self._seen)
        seen = pa.table({"request_id": pa.array(ids, pa.int64()),
                         "retired_its_question": pa.array([r in self._retirers for r in ids], pa.bool_())})
        written = 0
        for table, target in ((self.pool.to_arrow(), Path(path)),
                              (groups_to_arrow(list(self._ready.values())), Path(f"{path}.ready")),
                              (seen, Path(f"{path}.seen"))):
            atomic_write(target, lambda tmp, table=table: pq.write_table(table, tmp))
            written += target.stat().st_size
        return written

    def restore(self, *, path: str) -> None:
        """Load what `snapshot` wrote."""
        self.pool = ExperiencePool.from_arrow(pq.read_table(path), k_rollouts=self.k_rollouts,
                                              max_trajectories_per_question=self.max_trajectories_per_question)
        ready, seen = Path(f"{path}.ready"), Path(f"{path}.seen")
        self._ready = {g.request_id: g for g in groups_from_arrow(pq.read_table(ready))} if ready.exists() else {}
        self._seen, self._retirers = set(), set()
        if seen.exists():
            table = pq.read_table(seen).to_pydict()
            self._seen = set(table["request_id"])
            self._retirers = {r for r, x in zip(table["request_id"], table["retired_its_question"], strict=True) if x}
        self._seen |= self._ready.keys()
