"""Groups <-> Arrow tables (the push and take payloads, the shards' write-ahead log frames, their queues of
finished groups).

One row per trajectory or stored candidate (one "empty" row for a group with neither), with the group's
scalar fields repeated and its prompt on its first row only (null on the others); a group's rows are
contiguous. Token ids as list<int32>, log-probs as list<float64> so a resumed run sees bit-identical
records; a trajectory's `version_spans` as two lists (`span_starts`, `span_versions`; empty when one version
sampled it all; `conform` adds them, empty, to tables written before the field existed). No pickle.

Both directions are columnar, because a replay shard handles thousands of groups a second: `groups_to_arrow`
builds each column from flat numpy arrays (no per-row dicts), `GroupRows` reads a table's groups (request id,
qid, kind, row range, k, rollouts) with numpy without building a `Group`, which is what a shard records, and
`groups_from_arrow` builds the `Group`s (the client does, after a take). `encode_payload` / `decode_payload`
are the Arrow IPC bytes a sampler's client sends to a shard in one call and the shard logs as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exgrpo.core.records import CORRECT_ABOVE, Group, PulledBatch, ReplayStats, Trajectory

SCHEMA = pa.schema(
    [
        ("request_id", pa.int64()),
        ("qid", pa.string()),
        ("kind", pa.string()),
        ("gold", pa.string()),
        ("group_id", pa.string()),
        ("group_policy_version", pa.int64()),
        ("admitted_version", pa.int64()),
        ("prompt_ids", pa.list_(pa.int32())),  # the group's first row (older tables: every row)
        ("role", pa.string()),  # "trajectory" | "candidate" | "empty"
        ("response_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float64())),
        ("reward", pa.float64()),
        ("policy_version", pa.int64()),
        ("replayed", pa.bool_()),
        ("text", pa.string()),
        ("traj_group_id", pa.string()),
        ("span_starts", pa.list_(pa.int32())),  # Trajectory.version_spans: first token of each range
        ("span_versions", pa.list_(pa.int64())),  # ... and the version that sampled it
    ]
)
SPAN_COLUMNS = ("span_starts", "span_versions")
OP = b"exgrpo.op"  # schema metadata naming the call a log frame records
PUSH = {OP: b"push"}


def _lists(rows: Sequence[Sequence | None], dtype: type, value_type: pa.DataType) -> pa.Array:
    """A list<value_type> column from per-row sequences (None: a null row) through one flat numpy array."""
    lengths = np.fromiter((0 if r is None else len(r) for r in rows), np.int32, len(rows))
    offsets = np.zeros(len(rows) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat: np.ndarray = np.fromiter(chain.from_iterable(r for r in rows if r), dtype, int(offsets[-1]))
    mask = None if all(r is not None for r in rows) else pa.array([r is None for r in rows])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, value_type), mask=mask)


def _num_rows(g: Group) -> int:
    """A group's rows: one per trajectory and candidate, one "empty" row for a group with neither."""
    return max(len(g.trajectories) + len(g.candidates), 1)


def groups_to_arrow(groups: Sequence[Group]) -> pa.Table:
    """The groups' rows, in order (see the module doc)."""
    head: list[list] = [[] for _ in range(6)]  # request_id, qid, kind, gold, group_id, group_policy_version
    admitted: list[int] = []
    prompts: list[Sequence[int] | None] = []
    roles: list[str] = []
    items: list[Trajectory | None] = []
    for g in groups:
        rows = [("trajectory", t) for t in g.trajectories] + [("candidate", c) for c in g.candidates]
        for t in (t for _, t in rows):
            if t.qid != g.qid:
                raise ValueError(f"trajectory of {t.qid!r} in the group of {g.qid!r}")
        n = _num_rows(g)
        for col, v in zip(
            head, (g.request_id, g.qid, g.kind, g.gold, g.group_id, g.policy_version), strict=True
        ):
            col += [v] * n
        admitted += [g.admitted_version] * n
        prompts += [g.prompt_ids] + [None] * (n - 1)
        roles += [r for r, _ in rows] or ["empty"]
        items += [t for _, t in rows] or [None]
    ts = [t for t in items if t is not None]

    def per_row(values: list, dtype: pa.DataType) -> pa.Array:  # trajectory fields, null on empty rows
        if len(ts) == len(items):
            return pa.array(values, dtype)
        it = iter(values)
        return pa.array([None if t is None else next(it) for t in items], dtype)

    columns = [
        pa.array(np.array(head[0], np.int64)),
        *(pa.array(c, pa.string()) for c in head[1:5]),
        pa.array(np.array(head[5], np.int64)),
        pa.array(np.array(admitted, np.int64)),
        _lists(prompts, np.int32, pa.int32()),
        pa.array(roles, pa.string()),
        _lists([None if t is None else t.response_ids for t in items], np.int32, pa.int32()),
        _lists([None if t is None else t.logprobs for t in items], np.float64, pa.float64()),
        per_row([t.reward for t in ts], pa.float64()),
        per_row([t.policy_version for t in ts], pa.int64()),
        per_row([t.replayed for t in ts], pa.bool_()),
        per_row([t.text for t in ts], pa.string()),
        per_row([t.group_id for t in ts], pa.string()),
        _lists([None if t is None else [a for a, _ in t.version_spans] for t in items], np.int32, pa.int32()),
        _lists([None if t is None else [v for _, v in t.version_spans] for t in items], np.int64, pa.int64()),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def conform(table: pa.Table) -> pa.Table:
    """A table of `SCHEMA` rows, also one written before `version_spans` existed (its spans added, empty:
    one version sampled each trajectory); any other schema is refused."""
    if not any(n in table.schema.names for n in SPAN_COLUMNS):
        empty = pa.ListArray.from_arrays(
            pa.array(np.zeros(table.num_rows + 1, np.int32)), pa.array([], pa.int32())
        )
        table = table.append_column("span_starts", empty)
        table = table.append_column("span_versions", empty.cast(pa.list_(pa.int64())))
    if not table.schema.equals(SCHEMA, check_metadata=False):
        raise ValueError(f"not a table of groups (buffers/records.py SCHEMA): {table.schema}")
    return table


def encode_payload(table: pa.Table) -> bytes:
    """A table as one Arrow IPC stream (a push call's argument, a log frame's payload)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def push_payload(groups: Sequence[Group]) -> bytes:
    """What a client sends a shard for `push`: the groups' rows, marked as a push (the shard logs it as is)."""
    return push_payloads([groups])[0]


def push_payloads(parts: Sequence[Sequence[Group]]) -> list[bytes]:
    """`push_payload` of each part (the groups of one shard), all built as one table: a sampler call's groups
    go to every shard, and building a table has a fixed cost that one table pays once, not once per shard.
    Each part's payload holds only its own rows (IPC writes a slice's buffers truncated)."""
    table = groups_to_arrow([g for part in parts for g in part]).replace_schema_metadata(PUSH)
    out, start = [], 0
    for part in parts:
        rows = sum(_num_rows(g) for g in part)
        out.append(encode_payload(table.slice(start, rows)))
        start += rows
    return out


def decode_payload(payload: bytes) -> pa.Table:
    """The table of `encode_payload` (zero-copy over the bytes); a table of another schema is refused."""
    return conform(pa.ipc.open_stream(pa.py_buffer(payload)).read_all())


class ListColumn:
    """Row i of an Arrow list column without a Python object per element: `items(i)` as a tuple of
    Python numbers, `array(i, dtype)` as an owned numpy array (both empty for a null row)."""

    def __init__(self, column: pa.ChunkedArray | pa.Array) -> None:
        arr = column if isinstance(column, pa.Array) else column.combine_chunks()
        self.offsets = arr.offsets.to_numpy()
        self.values = arr.values.to_numpy(zero_copy_only=False)
        if self.offsets[0] or len(self.values) != self.offsets[-1]:  # a slice: only its own values
            self.values = self.values[self.offsets[0] : self.offsets[-1]]
            self.offsets = self.offsets - self.offsets[0]

    def items(self, i: int) -> tuple:
        return tuple(self.values[self.offsets[i] : self.offsets[i + 1]].tolist())

    def array(self, i: int, dtype: type) -> np.ndarray:
        return np.array(self.values[self.offsets[i] : self.offsets[i + 1]], dtype=dtype, copy=True)


class GroupRows:
    """The groups of a table of `SCHEMA` rows, read with numpy: group j spans rows `starts[j]:stops[j]` and
    has `request_ids[j]`, `qids[j]`, `kinds[j]`, `num_correct[j]` (k: a replay slot counts) and `sizes[j]`
    (rollouts, the replay slot included), as `Group.num_correct` / `Group.group_size` define them."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        rid = table.column("request_id").to_numpy()
        new = np.ones(len(rid), bool)
        new[1:] = rid[1:] != rid[:-1]
        self.starts = np.flatnonzero(new)
        self.stops = np.append(self.starts[1:], len(rid)).astype(np.int64)
        self.request_ids = rid[self.starts].tolist()
        starts = self.starts.tolist()
        qids, kinds = table.column("qid").to_pylist(), table.column("kind").to_pylist()
        self.qids, self.kinds = [qids[i] for i in starts], [kinds[i] for i in starts]
        role = table.column("role").to_numpy(zero_copy_only=False)
        self.traj, self.cand = role == "trajectory", role == "candidate"
        reward = table.column("reward").to_numpy(zero_copy_only=False).astype(np.float64)  # null: NaN
        self.correct = self.traj & (reward > CORRECT_ABOVE)
        replayed = table.column("replayed")
        if replayed.null_count:
            replayed = pc.fill_null(replayed, False)
        self.replayed = self.traj & replayed.to_numpy(zero_copy_only=False).astype(bool)
        if len(rid):
            k, n, has_replayed, self.num_candidates = (
                np.add.reduceat(x.astype(np.int64), self.starts)
                for x in (self.correct, self.traj, self.replayed, self.cand)
            )
            slot = (np.array(self.kinds) == "replay") & (has_replayed == 0)
            self.num_correct, self.sizes = (k + slot).tolist(), (n + slot).tolist()
        else:
            self.num_correct, self.sizes, self.num_candidates = [], [], np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.starts)

    def kept(self, j: int) -> list[int]:
        """The rows of group j that a pool stores when collecting: correct, non-replayed trajectories."""
        rows, lo, hi = self._kept
        return rows[lo[j] : hi[j]]

    @cached_property
    def _kept(self) -> tuple[list[int], list[int], list[int]]:
        """Every group's kept rows in row order (one pass over the whole table), and where each group's begin
        and end in that list."""
        rows = np.flatnonzero(self.correct & ~self.replayed)
        return (
            rows.tolist(),
            np.searchsorted(rows, self.starts).tolist(),
            np.searchsorted(rows, self.stops).tolist(),
        )

    @cached_property
    def prompts(self) -> ListColumn:
        return ListColumn(self.table.column("prompt_ids"))

    @cached_property
    def responses(self) -> ListColumn:
        return ListColumn(self.table.column("response_ids"))

    @cached_property
    def logprobs(self) -> ListColumn:
        return ListColumn(self.table.column("logprobs"))

    @cached_property
    def reward(self) -> list:
        return self.table.column("reward").to_pylist()

    @cached_property
    def policy_version(self) -> list:
        return self.table.column("policy_version").to_pylist()

    @cached_property
    def text(self) -> list:
        return self.table.column("text").to_pylist()

    @cached_property
    def traj_group_id(self) -> list:
        return self.table.column("traj_group_id").to_pylist()

    def select(self, groups: Sequence[int]) -> pa.Table:
        """The rows of the named groups, in that order."""
        idx: np.ndarray | list[int] = (
            np.concatenate([np.arange(self.starts[j], self.stops[j]) for j in groups]) if groups else []
        )
        return self.table.take(pa.array(idx, pa.int64()))


@dataclass(frozen=True)
class Taken:
    """A take's answer as a shard sends it: the taken groups' rows, the dropped request ids, the stats.
    It crosses Ray as one Arrow IPC stream (`__reduce__`): Ray's own pickling of a table cost more than the
    take."""

    rows: pa.Table
    dropped: tuple[int, ...]
    stats: ReplayStats

    def batch(self) -> PulledBatch:
        return PulledBatch(groups=tuple(groups_from_arrow(self.rows)), dropped=self.dropped, stats=self.stats)

    def __reduce__(self) -> tuple:
        return _taken, (encode_payload(self.rows), self.dropped, self.stats)


def _taken(payload: bytes, dropped: tuple[int, ...], stats: ReplayStats) -> Taken:
    return Taken(rows=decode_payload(payload), dropped=dropped, stats=stats)


def groups_from_arrow(table: pa.Table) -> list[Group]:
    """The groups of a table of `SCHEMA` rows, in row order (a group's prompt read from its first row)."""
    if table.num_rows == 0:
        return []
    table = conform(table)
    col = {f.name: table.column(f.name).to_pylist() for f in SCHEMA if not pa.types.is_list(f.type)}
    lists = {}  # each list column as (offsets, values), both Python lists: a row is one list slice
    for name in ("prompt_ids", "response_ids", "logprobs", *SPAN_COLUMNS):
        c = ListColumn(table.column(name))
        lists[name] = (c.offsets.tolist(), c.values.tolist())
    (po, pv), (ro, rv), (lo, lv), (so, sv), (vo, vv) = lists.values()
    by_id: dict[int, tuple[int, list[Trajectory], list[Trajectory]]] = {}
    for i, (rid, role) in enumerate(zip(col["request_id"], col["role"], strict=True)):
        entry = by_id.get(rid)
        if entry is None:
            entry = by_id[rid] = (i, [], [])
        if role == "empty":
            continue
        t = Trajectory(
            qid=col["qid"][i],
            response_ids=tuple(rv[ro[i] : ro[i + 1]]),
            logprobs=tuple(lv[lo[i] : lo[i + 1]]),
            reward=col["reward"][i],
            policy_version=col["policy_version"][i],
            replayed=col["replayed"][i],
            text=col["text"][i],
            group_id=col["traj_group_id"][i],
            version_spans=tuple(zip(sv[so[i] : so[i + 1]], vv[vo[i] : vo[i + 1]], strict=True)),
        )
        (entry[1] if role == "trajectory" else entry[2]).append(t)
    return [
        Group(
            qid=col["qid"][i],
            prompt_ids=tuple(pv[po[i] : po[i + 1]]),
            trajectories=tuple(trajs),
            kind=col["kind"][i],
            gold=col["gold"][i],
            group_id=col["group_id"][i],
            request_id=rid,
            policy_version=col["group_policy_version"][i],
            admitted_version=col["admitted_version"][i],
            candidates=tuple(cands),
        )
        for rid, (i, trajs, cands) in by_id.items()
    ]


def list_array(parts: Sequence[np.ndarray | None], value_type: pa.DataType) -> pa.Array:
    """A list<value_type> column from per-row numpy arrays (None = null row), without Python lists;
    64-bit offsets (large_list) only when the column holds more than 2^31 - 1 values."""
    dtype = value_type.to_pandas_dtype()
    lengths = np.fromiter((0 if p is None else len(p) for p in parts), dtype=np.int64, count=len(parts))
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    present = [p for p in parts if p is not None]
    values = pa.array(np.concatenate(present).astype(dtype, copy=False) if present else np.empty(0, dtype))
    mask = pa.array(np.fromiter((p is None for p in parts), dtype=bool, count=len(parts)))
    if offsets[-1] > np.iinfo(np.int32).max:
        return pa.LargeListArray.from_arrays(pa.array(offsets), values, mask=mask)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values, mask=mask)


class Ready(NamedTuple):
    """A finished group in the ready queue: its question, kind and rows `start:stop` of its push's table."""

    qid: str
    kind: str
    table: pa.Table
    start: int
    stop: int

    @classmethod
    def of(cls, rows: GroupRows, j: int) -> Ready:
        return cls(rows.qids[j], rows.kinds[j], rows.table, int(rows.starts[j]), int(rows.stops[j]))


def gather(groups: Sequence[Ready]) -> pa.Table:
    """The rows of these ready groups, in this order, as one table: one `take` over the push tables they
    came from (slicing each group out cost more than the rest of its push)."""
    tables: dict[int, tuple[pa.Table, int]] = {}  # id(table) -> (table, its first row in the concatenation)
    rows = 0
    for g in groups:
        if id(g.table) not in tables:
            tables[id(g.table)] = (g.table, rows)
            rows += g.table.num_rows
    if not tables:
        return groups_to_arrow([])
    index = np.concatenate([np.arange(g.start, g.stop) + tables[id(g.table)][1] for g in groups])
    return pa.concat_tables([t for t, _ in tables.values()]).take(pa.array(index, pa.int64()))
