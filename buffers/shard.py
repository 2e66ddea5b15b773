"""One replay shard: an ExperiencePool plus the queue of finished groups waiting for the learner.

A plain class; `exgrpo/runtime/assembly.py` makes it the Ray actor `exgrpo-replay-<i>`, tests use it in-process.
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
- `take` is idempotent by `take_id`: a retried take (its reply was lost when the shard died) returns
  the groups the first attempt removed, so a group is handed out once.
- With `wal_dir`, every state-changing call (`push` of new groups, `take`, `set_collect`) is logged and
  fsync'd before it is applied and answered (`buffers/wal.py`); a shard restarted by Ray replays its
  own last snapshot plus the log and is in the state of its last acknowledged call. The shard snapshots
  itself (and truncates the log) when the log passes both `compact_bytes` and `compact_growth` times the size
  of its last self-snapshot, and at every `snapshot`/`restore`. The second bound keeps compaction amortised:
  with a fixed threshold a large shard rewrote its whole pool every `compact_bytes` of pushes, which made
  filling it quadratic (at 1M questions over 8 shards, ~60 full rewrites per shard); the log, and so the
  replay after a restart, stays within max(compact_bytes, compact_growth x the snapshot).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from buffers.experience import ExperiencePool
from buffers.records import groups_from_arrow, groups_to_arrow
from buffers.wal import WriteAheadLog
from exgrpo.core.faults import fault_point
from exgrpo.core.fileio import atomic_write
from exgrpo.core.records import Group, PulledBatch, ReplayPick, ReplayStats

OP = b"exgrpo.op"
TAKE_ID = b"exgrpo.take_id"


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
    ) -> None:
        self.k_rollouts = k_rollouts
        self.max_trajectories_per_question = max_trajectories_per_question
        self.pool = ExperiencePool(k_rollouts, max_trajectories_per_question)
        self.collect = False  # switched on for good at the delayed start
        self._ready: dict[int, Group] = {}
        self._seen: set[int] = set()  # request ids pushed so far (idempotent push)
        self._retirers: set[int] = set()  # request ids whose own group retired its question
        self._last_take: tuple[str, PulledBatch] | None = None  # (take_id, its answer): a retry gets it again
        self.compact_bytes = compact_bytes
        self.compact_growth = compact_growth
        self._snapshot_bytes = 0  # size of the shard's last self-snapshot (its log directory's snap-<gen>)
        self.wal = WriteAheadLog(wal_dir) if wal_dir else None
        self.recovery: dict[str, Any] = {"snapshot": False, "frames": 0, "seconds": 0.0}
        if self.wal is not None:
            t0 = time.perf_counter()
            snap, frames = self.wal.open()
            if snap is not None:
                self._load(snap / "pool.parquet")
                self._load_extra(snap)
                self._snapshot_bytes = _dir_bytes(snap)
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

    def recovered(self) -> dict[str, Any]:
        """What this process restored at start: snapshot?, log frames replayed, seconds, and the stats then."""
        return dict(self.recovery)

    def set_collect(self, *, on: bool) -> None:
        """Start (or stop) storing correct trajectories; the driver flips it at the delayed start."""
        self._log(pa.table({"on": [on]}), op="collect")
        self.collect = on

    def push(self, *, groups: Sequence[Group]) -> int:
        """Record finished groups and queue them for the learner; returns how many were new.

        All groups are checked before any is applied; the new ones are logged (fsync'd) first."""
        new: dict[int, Group] = {}
        for group in groups:
            if group.request_id in self._seen or group.request_id in new:
                continue  # a re-issued request's second copy
            if group.kind == "replay" and not group.candidates:
                raise ValueError(
                    f"replay group of request {group.request_id} ({group.qid!r}) carries no "
                    "candidates; a replay request must carry those pinned when its question was sampled"
                )
            if group.group_size != self.k_rollouts:
                raise ValueError(
                    f"group of request {group.request_id} has {group.group_size} rollouts "
                    f"(replay slot included); this replay service is for K={self.k_rollouts}"
                )
            new[group.request_id] = group
        if new:
            fault_point("shard.push.before_log")
            if (
                self.wal is not None
            ):  # encoding the frame costs more than recording the groups: only with a log
                self._log(groups_to_arrow(list(new.values())), op="push")
            fault_point("shard.push.logged")
            self._apply_push(new.values())
            self._maybe_compact()
        return len(new)

    def _apply_push(self, groups: Any) -> None:
        for group in groups:
            retired_before = self.pool.is_retired(group.qid)
            self.pool.record(group, collect=self.collect)
            if not retired_before and self.pool.is_retired(group.qid):
                self._retirers.add(group.request_id)
            self._seen.add(group.request_id)
            self._ready[group.request_id] = group

    def take(self, *, request_ids: Sequence[int], take_id: str | None = None) -> PulledBatch:
        """Remove and return those of `request_ids` finished here (ids of other shards are ignored).

        A replay group whose question another group retired since it was sampled is removed too and
        reported in `dropped` instead: a retired question is never replayed. A second call with the
        same `take_id` (a retry) returns the first call's answer again.
        """
        if take_id is not None and self._last_take is not None and self._last_take[0] == take_id:
            return self._last_take[1]
        ids = [int(r) for r in request_ids]
        fault_point("shard.take.before_log")
        self._log(pa.table({"request_id": pa.array(ids, pa.int64())}), op="take", take_id=take_id)
        fault_point("shard.take.logged")
        return self._apply_take(ids, take_id)

    def _apply_take(self, request_ids: Sequence[int], take_id: str | None) -> PulledBatch:
        groups, dropped = [], []
        for rid in request_ids:
            g = self._ready.pop(rid, None)
            if g is None:
                continue
            if g.kind == "replay" and self.pool.is_retired(g.qid) and rid not in self._retirers:
                dropped.append(rid)
            else:
                groups.append(g)
        out = PulledBatch(groups=tuple(groups), dropped=tuple(dropped), stats=self.stats())
        if take_id is not None:
            self._last_take = (take_id, out)
        return out

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

    def bucket_sizes(self) -> dict[int, int]:
        return self.pool.bucket_sizes()

    def retired(self) -> frozenset[str]:
        return self.pool.retired()

    def stats(self) -> ReplayStats:
        return ReplayStats(
            bucket_sizes=self.pool.bucket_sizes(),
            active=len(self.pool),
            retired=self.pool.num_retired(),
            trajectories=self.pool.num_trajectories(),
            ready=len(self._ready),
        )

    # -- the write-ahead log -----------------------------------------------------------------------
    def _log(self, table: pa.Table, *, op: str, take_id: str | None = None) -> None:
        if self.wal is None:
            return
        meta = {OP: op.encode()} | ({TAKE_ID: take_id.encode()} if take_id is not None else {})
        self.wal.append(table.replace_schema_metadata(meta))

    def _replay(self, table: pa.Table) -> None:
        meta = table.schema.metadata or {}
        op = meta.get(OP, b"").decode()
        if op == "push":
            self._apply_push(groups_from_arrow(table))
        elif op == "take":
            tid = meta.get(TAKE_ID)
            self._apply_take(
                table.column("request_id").to_pylist(), tid.decode() if tid is not None else None
            )
        elif op == "collect":
            self.collect = bool(table.column("on")[0].as_py())
        else:
            raise ValueError(f"unknown write-ahead log record {op!r} in {self.wal.dir if self.wal else '?'}")

    def _maybe_compact(self) -> None:
        if self.wal is None:
            return
        if self.wal.bytes > max(self.compact_bytes, self.compact_growth * self._snapshot_bytes):
            self.compact()

    def compact(self) -> None:
        """Snapshot this shard into its log directory and start an empty log (no-op without a log)."""
        self._rotate(self._write_local)

    def _rotate(self, write: Any) -> None:
        if self.wal is not None:
            self.wal.rotate(write)
            self._snapshot_bytes = _dir_bytes(self.wal.snap_dir(self.wal.gen))

    def _write_local(self, directory: Path, *, files_of: str | None = None) -> None:
        """The shard's own snapshot. With `files_of`, the state is what the `snapshot_files` at that path hold
        (just written or just restored): they are linked (or copied) in, not serialised a second time."""
        if files_of is None:
            self.snapshot_files(path=str(directory / "pool.parquet"))
        else:
            for suffix in ("", ".ready", ".seen"):
                if Path(f"{files_of}{suffix}").exists():
                    _link_or_copy(Path(f"{files_of}{suffix}"), directory / f"pool.parquet{suffix}")
        state: dict[str, Any] = {"collect": self.collect, "take_id": None}
        if self._last_take is not None:
            tid, batch = self._last_take
            state |= {"take_id": tid, "dropped": list(batch.dropped), "stats": batch.stats.__dict__}
            pq.write_table(groups_to_arrow(list(batch.groups)), directory / "taken.parquet")
        (directory / "state.json").write_text(json.dumps(state))

    def _load_extra(self, directory: Path) -> None:
        state = json.loads((directory / "state.json").read_text())
        self.collect = bool(state["collect"])
        self._last_take = None
        if state["take_id"] is not None:
            groups = groups_from_arrow(pq.read_table(directory / "taken.parquet"))
            st = state["stats"]
            stats = ReplayStats(**{**st, "bucket_sizes": {int(k): v for k, v in st["bucket_sizes"].items()}})
            self._last_take = (
                state["take_id"],
                PulledBatch(groups=tuple(groups), dropped=tuple(state["dropped"]), stats=stats),
            )

    # -- snapshots ---------------------------------------------------------------------------------
    def snapshot(self, *, path: str) -> int:
        """Write the pool to `<path>`, the finished groups to `<path>.ready` and the pushed request ids
        (and whether each retired its question) to `<path>.seen` (parquet, each written atomically).
        Returns the bytes written. With a log, the shard also snapshots itself (sharing those files) and
        truncates the log."""
        written = self.snapshot_files(path=path)
        self._rotate(lambda d: self._write_local(d, files_of=path))
        return written

    def snapshot_files(self, *, path: str) -> int:
        ids = sorted(self._seen)
        seen = pa.table(
            {
                "request_id": pa.array(ids, pa.int64()),
                "retired_its_question": pa.array([r in self._retirers for r in ids], pa.bool_()),
            }
        )

        def write_pool(tmp: Path) -> None:  # a row group per piece: never a second copy of the whole pool
            with pq.ParquetWriter(tmp, self.pool.snapshot_schema()) as writer:
                for table in self.pool.iter_arrow():
                    writer.write_table(table)

        written = 0
        for write, target in (
            (write_pool, Path(path)),
            (_writer(groups_to_arrow(list(self._ready.values()))), Path(f"{path}.ready")),
            (_writer(seen), Path(f"{path}.seen")),
        ):
            atomic_write(target, write)
            written += target.stat().st_size
        _release_arrow_memory()
        return written

    def restore(self, *, path: str) -> None:
        """Load what `snapshot` wrote (and, with a log, make it the state a restart recovers)."""
        self._load(path)
        self._last_take = None
        # loading is deterministic, so those files are this state: the log directory shares them
        self._rotate(lambda d: self._write_local(d, files_of=path))

    def _load(self, path: str | Path) -> None:
        with pq.ParquetFile(path) as parquet:  # piece by piece: the whole table is never in memory at once
            pieces = (
                pa.Table.from_batches([b], schema=parquet.schema_arrow)
                for b in parquet.iter_batches(batch_size=16384)
            )
            self.pool = ExperiencePool.from_arrow(
                pieces if parquet.metadata.num_rows else parquet.read(),
                k_rollouts=self.k_rollouts,
                max_trajectories_per_question=self.max_trajectories_per_question,
            )
        ready, seen = Path(f"{path}.ready"), Path(f"{path}.seen")
        self._ready = (
            {g.request_id: g for g in groups_from_arrow(pq.read_table(ready))} if ready.exists() else {}
        )
        self._seen, self._retirers = set(), set()
        if seen.exists():
            table = pq.read_table(seen).to_pydict()
            self._seen = set(table["request_id"])
            self._retirers = {
                r for r, x in zip(table["request_id"], table["retired_its_question"], strict=True) if x
            }
        self._seen |= self._ready.keys()
        _release_arrow_memory()


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link where the filesystem allows (snapshot files are only ever replaced by rename, never
    rewritten in place, so sharing one is safe), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _release_arrow_memory() -> None:
    """Hand the Arrow buffers of a snapshot just written or read back to the OS: pyarrow's allocator
    (mimalloc) keeps freed memory cached, which otherwise left a shard's RSS ~60% above its pool's after a
    snapshot or restore."""
    pa.default_memory_pool().release_unused()


def _dir_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.iterdir() if f.is_file())


def _writer(table: pa.Table) -> Any:
    return lambda tmp: pq.write_table(table, tmp)
