"""The ExGRPO experience pool: question statistics, difficulty buckets, retirement and stored trajectories.

Pure (numpy + pyarrow); the sampling weights and the allocation over buckets and shards are
`exgrpo/core/selection.py`'s, the pool draws inside a bucket. Invariants: a question is sampleable only in a bucket
1..K-1 with at least one stored trajectory; a retired question (K/K) is never sampled again and its later groups
are ignored (unless `retire=False`); stored trajectories are correct, deduplicated and capped per question. The
rules: docs/architecture.md ("The algorithm"); tests: tests/buffers/test_experience.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from buffers.pool_state import (
    SNAPSHOT_FORMAT,
    SNAPSHOT_SCHEMA,
    QuestionState,
    SnapshotRow,
    SortedQids,
    StoredTrajectory,
    compact,
)
from buffers.records import GroupRows, ListColumn, list_array
from exgrpo.core.records import Group, Trajectory
from exgrpo.core.selection import check_rollouts


class ExperiencePool:
    """Question statistics and stored correct trajectories of one replay shard (or all of them)."""

    def __init__(
        self, k_rollouts: int, max_trajectories_per_question: int = 8, *, retire: bool = True
    ) -> None:
        check_rollouts(k_rollouts)
        if max_trajectories_per_question < 1:
            raise ValueError(f"max_trajectories_per_question={max_trajectories_per_question} must be >= 1")
        self.k_rollouts = k_rollouts
        self.max_trajectories_per_question = max_trajectories_per_question
        self.retire = retire  # False: a K/K group only takes the question out of its bucket (never retired)
        self._questions: dict[str, QuestionState] = {}
        self._buckets = {k: SortedQids() for k in range(1, k_rollouts)}  # sampleable qids
        self._retired: set[str] = set()
        self._num_trajectories = 0

    # -- updates ---------------------------------------------------------------------------------

    def record(self, group: Group, *, collect: bool) -> None:
        """Update the statistics of `group.qid` with k = group.num_correct (see the module doc);
        with `collect`, also store the group's correct, non-replayed trajectories."""
        for t in group.trajectories:
            if t.qid != group.qid:
                raise ValueError(f"trajectory of {t.qid!r} in the group of {group.qid!r}")
        keep = (compact(t) for t in group.trajectories if t.correct and not t.replayed)
        prompt = lambda: np.asarray(group.prompt_ids, dtype=np.int32)  # noqa: E731
        self._update(group.qid, group.num_correct, group.group_size, prompt, keep if collect else ())

    def record_rows(self, rows: GroupRows, j: int, *, collect: bool) -> None:
        """`record` of group j of a table of groups (`buffers/records.py`), read from its columns: a shard
        records a push without building its `Group`s."""
        keep = (
            StoredTrajectory(rows.responses.array(i, np.int32), rows.logprobs.array(i, np.float32),
                             rows.reward[i], rows.policy_version[i], rows.text[i] or "",
                             rows.traj_group_id[i] or "")
            for i in rows.kept(j)
        )  # fmt: skip
        prompt = lambda: rows.prompts.array(int(rows.starts[j]), np.int32)  # noqa: E731
        self._update(rows.qids[j], rows.num_correct[j], rows.sizes[j], prompt, keep if collect else ())

    def _update(
        self, qid: str, k: int, size: int, prompt: Callable[[], np.ndarray], keep: Iterable[StoredTrajectory]
    ) -> None:
        if size != self.k_rollouts:
            raise ValueError(
                f"group {qid!r} has {size} rollouts (replay slot included); this pool is for K={self.k_rollouts}"
            )
        if qid in self._retired:
            return
        if k == self.k_rollouts:
            if self.retire:
                self._retire(qid)
            elif (solved := self._questions.get(qid)) is not None:
                solved.bucket = None
                self._reindex(qid, solved)
            return
        if k == 0:
            return  # a group with no correct rollout has nothing to collect either
        q = self._questions.get(qid)
        if q is None:
            q = self._questions[qid] = QuestionState(prompt())
        q.bucket = k
        for s in keep:
            self._store(q, s)
        self._reindex(qid, q)

    def _retire(self, qid: str) -> None:
        self._retired.add(qid)
        q = self._questions.pop(qid, None)
        if q is not None:
            self._num_trajectories -= len(q.stored)
            if q.indexed is not None:
                self._buckets[q.indexed].remove(qid)

    def _store(self, q: QuestionState, s: StoredTrajectory) -> None:
        n = len(s.response_ids)
        for old in q.stored:  # the length first: most stored responses differ in it, and it costs nothing
            if len(old.response_ids) == n and np.array_equal(old.response_ids, s.response_ids):
                return  # duplicate token ids: keep the first copy
        q.stored.append(s)
        self._num_trajectories += 1
        if len(q.stored) > self.max_trajectories_per_question:
            del q.stored[0]
            self._num_trajectories -= 1

    def _reindex(self, qid: str, q: QuestionState) -> None:
        target = q.bucket if q.stored else None
        if target != q.indexed:
            if q.indexed is not None:
                self._buckets[q.indexed].remove(qid)
            if target is not None:
                self._buckets[target].add(qid)
            q.indexed = target

    # -- sampling --------------------------------------------------------------------------------

    def sample_from_buckets(
        self, counts: Mapping[int, int], *, rng: np.random.Generator, exclude: frozenset[str] = frozenset()
    ) -> list[str]:
        """Up to counts[k] distinct sampleable qids from each bucket k (ascending k), uniformly without
        replacement, never one in `exclude`. A bucket smaller than its count gives all it has (the
        caller redistributes the shortfall): bucket sizes read earlier may be stale under concurrent
        pushes, and a draw must never fail because of it. Buckets are kept in qid order (`SortedQids`), so
        the draw does not depend on the order pushes arrived in. Cost O(size of the buckets drawn from)."""
        out: list[str] = []
        for k in sorted(counts):
            c = counts[k]
            if c < 0:
                raise ValueError(f"cannot draw {c} questions from bucket {k}")
            members = self._buckets.get(k)
            if not c or members is None or not len(members):
                continue
            pool = [q for q in members.items if q not in exclude] if exclude else members.items
            out.extend(pool[i] for i in rng.choice(len(pool), size=min(c, len(pool)), replace=False))
        return out

    # -- queries ---------------------------------------------------------------------------------

    def candidates(self, qid: str) -> list[Trajectory]:
        """Stored trajectories of `qid`, oldest first ([] for unknown or retired qids)."""
        q = self._questions.get(qid)
        return [] if q is None else [s.to_trajectory(qid) for s in q.stored]

    def prompt_ids(self, qid: str) -> tuple[int, ...]:
        """Prompt token ids of a tracked question (KeyError if unknown or retired)."""
        q = self._questions.get(qid)
        if q is None:
            raise KeyError(f"question {qid!r} is not in the pool")
        return tuple(q.prompt_ids.tolist())

    def bucket_of(self, qid: str) -> int | None:
        """The statistical bucket of `qid`, sampleable or not (None if none or retired)."""
        q = self._questions.get(qid)
        return None if q is None else q.bucket

    def is_retired(self, qid: str) -> bool:
        return qid in self._retired

    def retired(self) -> frozenset[str]:
        return frozenset(self._retired)

    def num_retired(self) -> int:
        """len(retired()) without copying the set (every `take` reports it)."""
        return len(self._retired)

    def bucket_sizes(self, exclude: frozenset[str] = frozenset()) -> dict[int, int]:
        """Number of sampleable questions per non-empty bucket, not counting `exclude` (empty buckets absent)."""
        sizes = {k: len(b) - sum(q in b for q in exclude) for k, b in self._buckets.items()}
        return {k: n for k, n in sizes.items() if n > 0}

    def __len__(self) -> int:
        """Number of sampleable questions."""
        return sum(len(b) for b in self._buckets.values())

    def num_trajectories(self) -> int:
        return self._num_trajectories

    def __eq__(self, other: object) -> bool:
        """Same settings, retired set, and per question: bucket, prompt, trajectories in order."""
        if not isinstance(other, ExperiencePool):
            return NotImplemented
        return self._state() == other._state()

    def _state(self) -> tuple:
        settings = (self.k_rollouts, self.max_trajectories_per_question)
        questions = {
            qid: (q.bucket, q.indexed, q.prompt_ids.tobytes(), [s.key() for s in q.stored])
            for qid, q in self._questions.items()
        }
        return settings, self._retired, questions

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"ExperiencePool(K={self.k_rollouts}, sampleable={len(self)}, buckets={self.bucket_sizes()}, "
            f"trajectories={self._num_trajectories}, retired={len(self._retired)})"
        )

    # -- snapshots -------------------------------------------------------------------------------

    def to_arrow(self) -> pa.Table:
        """The whole pool as one table, schema `SNAPSHOT_SCHEMA`, rows in this order:
        per question a "question" row (qid, bucket, prompt_ids) followed by its "trajectory" rows
        oldest first (qid, response_ids, logprobs, reward, policy_version, text, group_id);
        sampleable questions come first in bucket-index order, so a restored pool draws the same
        questions from the same RNG state; then one "retired" row per retired qid (sorted)."""
        return self._table(self._snapshot_order(), sorted(self._retired))

    def iter_arrow(self, *, questions_per_table: int = 8192) -> Iterator[pa.Table]:
        """`to_arrow()` in consecutive pieces of at most `questions_per_table` questions (or retired qids),
        always with list<...> columns: a snapshot writes them one by one (a parquet row group each) instead
        of holding a second copy of the whole pool as one table (8192 questions: ~75 MB at ~290 tokens per
        trajectory; smaller pieces cost parquet size, each row group carrying its own dictionaries: 2048 gave
        +27% bytes at 16-48 tokens, 8192 +6%, none at 64-512). At least one table, possibly empty."""
        order, retired = self._snapshot_order(), sorted(self._retired)
        if not order and not retired:
            yield self._table([], [])
        for i in range(0, len(order), questions_per_table):
            yield self._table(order[i : i + questions_per_table], [])
        for i in range(0, len(retired), questions_per_table):
            yield self._table([], retired[i : i + questions_per_table])

    def _snapshot_order(self) -> list[str]:
        order = [qid for b in self._buckets.values() for qid in b.items]
        return order + [qid for qid, q in self._questions.items() if q.indexed is None]

    def _table(self, order: Sequence[str], retired: Sequence[str]) -> pa.Table:
        rows: list[SnapshotRow] = []
        for qid in order:
            q = self._questions[qid]
            rows.append(SnapshotRow("question", qid, bucket=q.bucket, prompt_ids=q.prompt_ids))
            rows += [SnapshotRow("trajectory", qid, **s.fields()) for s in q.stored]
        rows += [SnapshotRow("retired", qid) for qid in retired]
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(SNAPSHOT_SCHEMA)
        arrays = [
            list_array(values, f.type.value_type) if pa.types.is_list(f.type) else pa.array(values, f.type)
            for f, values in zip(SNAPSHOT_SCHEMA, columns, strict=True)
        ]
        return pa.Table.from_arrays(arrays, names=SNAPSHOT_SCHEMA.names, metadata=self._metadata())

    def snapshot_schema(self) -> pa.Schema:
        """The schema (with metadata) of the `iter_arrow()` tables."""
        return SNAPSHOT_SCHEMA.with_metadata(self._metadata())

    def _metadata(self) -> dict[str, str]:
        return {"exgrpo.format": SNAPSHOT_FORMAT, "exgrpo.k_rollouts": str(self.k_rollouts)}

    @classmethod
    def from_arrow(
        cls,
        table: pa.Table | Iterable[pa.Table],
        *,
        k_rollouts: int,
        max_trajectories_per_question: int = 8,
    ) -> ExperiencePool:
        """Rebuild a pool from `to_arrow()` output (e.g. read back from parquet), or from its consecutive
        pieces (`iter_arrow()`, a parquet file's row groups: the whole table is then never in memory at once).
        The cap applies while loading (a smaller cap keeps the newest trajectories)."""
        pool = cls(k_rollouts, max_trajectories_per_question)
        first = 0
        for part in [table] if isinstance(table, pa.Table) else table:
            pool._load_rows(part, first)
            first += part.num_rows
        both = pool._retired & pool._questions.keys()
        if both:
            raise ValueError(f"questions {sorted(both)} are both retired and in the pool")
        for qid, q in pool._questions.items():
            pool._reindex(qid, q)
        return pool

    def _load_rows(self, table: pa.Table, first: int) -> None:
        k_rollouts = self.k_rollouts
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        if meta.get("exgrpo.format", SNAPSHOT_FORMAT) != SNAPSHOT_FORMAT:
            raise ValueError(f"not an experience pool snapshot: format {meta['exgrpo.format']!r}")
        if meta.get("exgrpo.k_rollouts", str(k_rollouts)) != str(k_rollouts):
            raise ValueError(f"snapshot was taken with K={meta['exgrpo.k_rollouts']}, not K={k_rollouts}")
        col = {name: table.column(name).to_pylist() for name in ("row", "qid", "bucket", "reward")}
        col |= {name: table.column(name).to_pylist() for name in ("policy_version", "text", "group_id")}
        prompts = ListColumn(table.column("prompt_ids"))
        responses = ListColumn(table.column("response_ids"))
        logprobs = ListColumn(table.column("logprobs"))
        for i, (kind, qid) in enumerate(zip(col["row"], col["qid"], strict=True)):
            if kind == "question":
                bucket = col["bucket"][i]
                if bucket is not None and not 0 < bucket < k_rollouts:
                    raise ValueError(
                        f"row {first + i}: bucket {bucket} of {qid!r} is outside 1..{k_rollouts - 1}"
                    )
                self._questions[qid] = QuestionState(prompts.array(i, np.int32), bucket)
            elif kind == "trajectory":
                if qid not in self._questions:
                    raise ValueError(f"row {first + i}: trajectory of {qid!r} before its question row")
                ids, lps = responses.array(i, np.int32), logprobs.array(i, np.float32)
                if len(ids) != len(lps):
                    raise ValueError(f"row {first + i}: {len(ids)} response ids but {len(lps)} log-probs")
                s = StoredTrajectory(ids, lps, col["reward"][i], col["policy_version"][i],
                                     col["text"][i] or "", col["group_id"][i] or "")  # fmt: skip
                self._store(self._questions[qid], s)
            elif kind == "retired":
                self._retired.add(qid)
            else:
                raise ValueError(f"row {first + i}: unknown row kind {kind!r}")
