"""One replay shard: an ExperiencePool plus the queue of finished groups waiting for the learner.

A plain class (`exgrpo/runtime/parts.py` makes it the Ray actor `exgrpo-replay-<i>`); groups arrive and leave as
Arrow rows (`buffers/records.py`), so the push and take path builds no `Group`. Invariants: `push` is idempotent by
request id and `take` by `take_id`, so each group is handed out once; `take` never hands out a replay group whose
question another group retired (it reports it dropped); with `wal_dir` every state-changing call is durable before
it is applied and answered, and a restarted shard is in the state of its last acknowledged call, its log bounded by
compaction. More: docs/failures.md ("Replay shard death"); tests: tests/buffers/test_shard.py, tests/buffers/test_wal.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from buffers import snapshots
from buffers.commit import CallOrder, alone, locked
from buffers.experience import ExperiencePool
from buffers.records import (
    OP,
    GroupRows,
    Ready,
    Taken,
    decode_payload,
    encode_payload,
    gather,
    groups_from_arrow,
    push_payload,
)
from buffers.wal import Ticket, WriteAheadLog
from exgrpo.core.faults import fault_point
from exgrpo.core.records import Group, PulledBatch, ReplayPick, ReplayStats

TAKE_ID = b"exgrpo.take_id"
_NONE = object()


class ReplayShard:
    """An `ExperiencePool` and a ready queue of finished groups, keyed by request id."""

    def __init__(
        self,
        *,
        k_rollouts: int,
        max_trajectories_per_question: int = 8,
        wal_dir: str | None = None,
        compact_bytes: int = 64 << 20,
        compact_growth: float = 1.0,
        retire: bool = True,
    ) -> None:
        self.k_rollouts = k_rollouts
        self.retire = retire  # False: the on-policy baseline (replay.retire), questions solved K/K stay
        self.max_trajectories_per_question = max_trajectories_per_question
        self.pool = ExperiencePool(k_rollouts, max_trajectories_per_question, retire=retire)
        self.collect = False  # switched on for good at the delayed start
        self._ready: dict[int, Ready] = {}
        self._seen: set[int] = set()  # request ids pushed so far (idempotent push)
        self._retirers: set[int] = set()  # request ids whose own group retired its question
        self._last_take: tuple[str, Taken] | None = None  # (take_id, its answer): a retry gets it again
        self.compact_bytes = compact_bytes
        self.compact_growth = compact_growth
        self._snapshot_bytes = 0  # size of the shard's last self-snapshot (its log directory's snap-<gen>)
        self.order = CallOrder()  # the lock, and the order of state-changing calls (buffers/commit.py)
        self._pending: dict[int, Ticket | None] = {}  # request id -> the frame of the push applying it next
        self.wal = WriteAheadLog(wal_dir, lock=self.order.lock) if wal_dir else None
        self.recovery: dict[str, Any] = {"snapshot": False, "frames": 0, "seconds": 0.0}
        if self.wal is not None:
            t0 = time.perf_counter()
            snap, frames = self.wal.open()
            if snap is not None:
                self._load(snap / "pool.parquet")
                self._load_extra(snap)
                self._snapshot_bytes = snapshots.dir_bytes(snap)
            for table in frames:
                self._replay(table)
            self.recovery = {
                "snapshot": snap is not None,
                "frames": len(frames),
                "generation": self.wal.gen,
                "seconds": time.perf_counter() - t0,
                **self.stats().__dict__,
            }

    def ping(self) -> str:
        return "pong"

    def pid(self) -> int:
        """The process id (the chaos tests SIGKILL it)."""
        return os.getpid()

    @locked
    def recovered(self) -> dict[str, Any]:
        """What this process restored at start: snapshot?, log frames replayed, seconds, and the stats then."""
        return dict(self.recovery)

    def set_collect(self, *, on: bool) -> None:
        """Start (or stop) storing correct trajectories; the driver flips it at the delayed start."""
        with self.order.lock:
            seq, ticket = self.order.begin(lambda: self._log(pa.table({"on": [on]}), op="collect"))
        self.order.finish(seq, ticket, self.wal, lambda: setattr(self, "collect", on))

    def push(self, *, groups: Sequence[Group]) -> int:
        """Record finished groups and queue them for the learner; returns how many were new."""
        return self.push_payload(payload=push_payload(groups))

    def push_payload(self, *, payload: bytes) -> int:
        """`push` of groups a client encoded (`buffers.records.push_payload`): what `ShardedReplay.push` sends,
        one call per shard for all the groups a sampler call finished. Returns how many were new.

        All groups are checked before any is applied; the new ones are logged first, in one frame (the payload
        itself when every group is new: the shard neither builds a `Group` nor encodes a frame), and applied
        once it is durable (with concurrent calls, one fdatasync for all: `buffers/commit.py`).
        """
        table = decode_payload(payload)
        if (table.schema.metadata or {}).get(OP) != b"push":
            raise ValueError(
                "push_payload takes the bytes of buffers.records.push_payload (marked as a push)"
            )
        rows = GroupRows(table.replace_schema_metadata(None))
        with self.order.lock:
            new = self._new_groups(rows)
            write: Callable[[], Ticket | None]
            if len(new) == len(rows) and self.wal is not None:
                write = partial(self.wal.write, payload)
            elif new:
                write = lambda: self._log(rows.select(new), op="push")  # noqa: E731
            else:  # nothing new, but a copy may still be syncing: answer once it is durable
                write = self.wal.barrier if self.wal is not None else lambda: None
            if new:
                fault_point("shard.push.before_log")
            seq, ticket = self.order.begin(write)
            for j in new:
                self._pending[rows.request_ids[j]] = ticket

        def apply() -> int:
            if new:
                fault_point("shard.push.logged")  # durable, not yet applied nor answered
            return self._apply_push(rows, new)

        try:
            n = self.order.finish(seq, ticket, self.wal, apply)
        finally:
            with self.order.lock:
                for j in new:
                    if self._pending.get(rows.request_ids[j], _NONE) is ticket:
                        del self._pending[rows.request_ids[j]]
        self._maybe_compact()
        return n

    def _new_groups(self, rows: GroupRows) -> list[int]:
        """The groups of `rows` not pushed before (nor by a call still syncing), each checked."""
        new: list[int] = []
        fresh: set[int] = set()
        for j, rid in enumerate(rows.request_ids):
            if rid in self._seen or rid in fresh or self._in_flight(rid):
                continue  # a re-issued request's second copy
            if rows.kinds[j] == "replay" and not rows.num_candidates[j]:
                raise ValueError(
                    f"replay group of request {rid} ({rows.qids[j]!r}) carries no "
                    "candidates; a replay request must carry those pinned when its question was sampled"
                )
            if rows.sizes[j] != self.k_rollouts:
                raise ValueError(
                    f"group of request {rid} has {rows.sizes[j]} rollouts "
                    f"(replay slot included); this replay service is for K={self.k_rollouts}"
                )
            new.append(j)
            fresh.add(rid)
        return new

    def _in_flight(self, rid: int) -> bool:
        """Pushed by a call whose frame is written and has not failed its sync (it is applied next)."""
        if rid not in self._pending:
            return False
        ticket = self._pending[rid]
        return ticket is None or ticket.error is None

    def _apply_push(self, rows: GroupRows, groups: Sequence[int]) -> int:
        for j in groups:
            rid, qid = rows.request_ids[j], rows.qids[j]
            retired_before = self.pool.is_retired(qid)
            self.pool.record_rows(rows, j, collect=self.collect)
            if not retired_before and self.pool.is_retired(qid):
                self._retirers.add(rid)
            self._seen.add(rid)
            self._ready[rid] = Ready.of(rows, j)
        return len(groups)

    def take(self, *, request_ids: Sequence[int], take_id: str | None = None) -> PulledBatch:
        """`take_rows`, its groups decoded."""
        return self.take_rows(request_ids=request_ids, take_id=take_id).batch()

    def take_rows(self, *, request_ids: Sequence[int], take_id: str | None = None) -> Taken:
        """Remove and return those of `request_ids` finished here (ids of other shards are ignored), as their
        rows: the client (`ShardedReplay.pull_batch`) builds the `Group`s, not the shard.

        A replay group whose question another group retired since it was sampled is removed too and
        reported in `dropped` instead: a retired question is never replayed. A second call with the
        same `take_id` (a retry) returns the first call's answer again.
        """
        ids = [int(r) for r in request_ids]
        with self.order.lock:
            if take_id is not None and self._last_take is not None and self._last_take[0] == take_id:
                return self._last_take[1]
            frame = pa.table({"request_id": pa.array(ids, pa.int64())})
            fault_point("shard.take.before_log")
            seq, ticket = self.order.begin(lambda: self._log(frame, op="take", take_id=take_id))

        def apply() -> Taken:
            fault_point("shard.take.logged")  # durable, not yet applied nor answered
            return self._apply_take(ids, take_id)

        return self.order.finish(seq, ticket, self.wal, apply)

    def _apply_take(self, request_ids: Sequence[int], take_id: str | None) -> Taken:
        parts, dropped = [], []
        for rid in request_ids:
            g = self._ready.pop(rid, None)
            if g is None:
                continue
            if g.kind == "replay" and self.pool.is_retired(g.qid) and rid not in self._retirers:
                dropped.append(rid)
            else:
                parts.append(g)
        out = Taken(rows=gather(parts), dropped=tuple(dropped), stats=self.stats())
        if take_id is not None:
            self._last_take = (take_id, out)
        return out

    @locked
    def ready_groups(self) -> list[Group]:
        """The finished groups waiting for the learner, in request-id order (for inspection and tests)."""
        return groups_from_arrow(gather([self._ready[r] for r in sorted(self._ready)]))

    @locked
    def sample(
        self, *, counts: Mapping[int, int], seed: int, exclude: Sequence[str] = ()
    ) -> tuple[list[ReplayPick], dict[int, int]]:
        """Up to `counts[k]` distinct sampleable questions from each bucket k, with their candidates.

        One atomic step of this shard: sizes may have changed since the caller planned `counts`, so a
        bucket gives what it has. Returns the picks and the bucket sizes left (`exclude` and the picks
        not counted), for the caller to redistribute any shortfall. Changes nothing (safe to retry).
        """
        skip = frozenset(exclude)
        qids = self.pool.sample_from_buckets(counts, rng=np.random.default_rng(seed), exclude=skip)
        picks = [ReplayPick(qid=q, candidates=tuple(self.pool.candidates(q))) for q in qids]
        return picks, self.pool.bucket_sizes(exclude=skip | set(qids))

    @locked
    def bucket_sizes(self) -> dict[int, int]:
        return self.pool.bucket_sizes()

    @locked
    def retired(self) -> frozenset[str]:
        return self.pool.retired()

    @locked
    def stats(self) -> ReplayStats:
        return ReplayStats(
            bucket_sizes=self.pool.bucket_sizes(),
            active=len(self.pool),
            retired=self.pool.num_retired(),
            trajectories=self.pool.num_trajectories(),
            ready=len(self._ready),
        )

    # -- the write-ahead log -----------------------------------------------------------------------
    def _log(self, table: pa.Table, *, op: str, take_id: str | None = None) -> Ticket | None:
        """Write the call's frame (under the lock; `CallOrder.finish` waits for its sync)."""
        if self.wal is None:
            return None
        meta = {OP: op.encode()} | ({TAKE_ID: take_id.encode()} if take_id is not None else {})
        return self.wal.write(encode_payload(table.replace_schema_metadata(meta)))

    def _replay(self, table: pa.Table) -> None:
        meta = table.schema.metadata or {}
        op = meta.get(OP, b"").decode()
        if op == "push":
            rows = GroupRows(table.replace_schema_metadata(None))
            self._apply_push(rows, range(len(rows)))
        elif op == "take":
            tid = meta.get(TAKE_ID)
            self._apply_take(
                table.column("request_id").to_pylist(), tid.decode() if tid is not None else None
            )
        elif op == "collect":
            self.collect = bool(table.column("on")[0].as_py())
        else:
            raise ValueError(f"unknown write-ahead log record {op!r} in {self.wal.dir if self.wal else '?'}")

    def _over_threshold(self) -> bool:
        return self.wal is not None and self.wal.bytes > max(
            self.compact_bytes, self.compact_growth * self._snapshot_bytes
        )

    def _maybe_compact(self) -> None:
        if self._over_threshold():
            self._compact_if_over()

    @alone
    def _compact_if_over(self) -> None:
        if self._over_threshold():  # a concurrent call may have compacted first
            self._rotate(self._write_local)

    @alone
    def compact(self) -> None:
        """Snapshot this shard into its log directory and start an empty log (no-op without a log)."""
        self._rotate(self._write_local)

    def _rotate(self, write: Any) -> None:
        if self.wal is not None:
            self.wal.rotate(write)
            self._snapshot_bytes = snapshots.dir_bytes(self.wal.snap_dir(self.wal.gen))

    def _write_local(self, directory: Path, *, files_of: str | None = None) -> None:
        """The shard's own snapshot. With `files_of`, the state is what the `snapshot_files` at that path hold
        (just written or just restored): they are linked (or copied) in, not serialised a second time."""
        if files_of is None:
            self.snapshot_files(path=str(directory / "pool.parquet"))
        else:
            snapshots.link_files(files_of, directory / "pool.parquet")
        snapshots.write_state(directory, collect=self.collect, last_take=self._last_take)

    def _load_extra(self, directory: Path) -> None:
        self.collect, self._last_take = snapshots.read_state(directory)

    # -- snapshots ---------------------------------------------------------------------------------
    @alone
    def snapshot(self, *, path: str) -> int:
        """Write the pool to `<path>`, the finished groups to `<path>.ready` and the pushed request ids
        (and whether each retired its question) to `<path>.seen` (parquet, each written atomically).
        Returns the bytes written. With a log, the shard also snapshots itself (sharing those files) and
        truncates the log."""
        written = self.snapshot_files(path=path)
        self._rotate(lambda d: self._write_local(d, files_of=path))
        return written

    @locked
    def snapshot_files(self, *, path: str) -> int:
        return snapshots.write_files(
            path, self.pool, gather(list(self._ready.values())), self._seen, self._retirers
        )

    @alone
    def restore(self, *, path: str) -> None:
        """Load what `snapshot` wrote (and, with a log, make it the state a restart recovers)."""
        self._load(path)
        self._last_take = None
        # loading is deterministic, so those files are this state: the log directory shares them
        self._rotate(lambda d: self._write_local(d, files_of=path))

    def _load(self, path: str | Path) -> None:
        self.pool, rows, self._seen, self._retirers = snapshots.read_files(
            path, k_rollouts=self.k_rollouts, max_trajectories_per_question=self.max_trajectories_per_question
        )
        self.pool.retire = self.retire  # a setting of the run, not of the snapshot
        self._ready = {} if rows is None else {r: Ready.of(rows, j) for j, r in enumerate(rows.request_ids)}
        self._seen |= self._ready.keys()
