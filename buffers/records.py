"""Groups <-> Arrow tables (the shards' write-ahead log frames and their queues of finished groups).

One row per trajectory or stored candidate, with the group's fields repeated; token ids as
list<int32>, log-probs as list<float64> so a resumed run sees bit-identical records; a trajectory's
`version_spans` as two lists (`span_starts`, `span_versions`; empty when one version sampled it all, and
absent from tables written before the field existed). No pickle.
Read back column by column (list columns through their flat values and offsets), not through per-row
dicts: a restarted shard decodes every push in its log.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from exgrpo.core.records import Group, Trajectory

SCHEMA = pa.schema(
    [
        ("request_id", pa.int64()),
        ("qid", pa.string()),
        ("kind", pa.string()),
        ("gold", pa.string()),
        ("group_id", pa.string()),
        ("group_policy_version", pa.int64()),
        ("admitted_version", pa.int64()),
        ("prompt_ids", pa.list_(pa.int32())),
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


def groups_to_arrow(groups: Sequence[Group]) -> pa.Table:
    rows: list[dict] = []
    for g in groups:
        head = {
            "request_id": g.request_id,
            "qid": g.qid,
            "kind": g.kind,
            "gold": g.gold,
            "group_id": g.group_id,
            "group_policy_version": g.policy_version,
            "admitted_version": g.admitted_version,
            "prompt_ids": list(g.prompt_ids),
        }
        items = [("trajectory", t) for t in g.trajectories] + [("candidate", c) for c in g.candidates]
        if not items:
            rows.append({**head, "role": "empty"})
        for role, t in items:
            rows.append(
                {
                    **head,
                    "role": role,
                    "response_ids": list(t.response_ids),
                    "logprobs": list(t.logprobs),
                    "reward": t.reward,
                    "policy_version": t.policy_version,
                    "replayed": t.replayed,
                    "text": t.text,
                    "traj_group_id": t.group_id,
                    "span_starts": [start for start, _ in t.version_spans],
                    "span_versions": [v for _, v in t.version_spans],
                }
            )
    return pa.Table.from_pylist(rows, schema=SCHEMA)


class ListColumn:
    """Row i of an Arrow list column without a Python object per element: `items(i)` as a tuple of
    Python numbers, `array(i, dtype)` as an owned numpy array (both empty for a null row)."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        self.offsets = arr.offsets.to_numpy()
        self.values = arr.values.to_numpy(zero_copy_only=False)

    def items(self, i: int) -> tuple:
        return tuple(self.values[self.offsets[i] : self.offsets[i + 1]].tolist())

    def array(self, i: int, dtype: type) -> np.ndarray:
        return np.array(self.values[self.offsets[i] : self.offsets[i + 1]], dtype=dtype, copy=True)


def groups_from_arrow(table: pa.Table) -> list[Group]:
    if table.num_rows == 0:
        return []
    col = {f.name: table.column(f.name).to_pylist() for f in SCHEMA if not pa.types.is_list(f.type)}
    prompts, responses, logprobs = (
        ListColumn(table.column(n)) for n in ("prompt_ids", "response_ids", "logprobs")
    )
    spans = (
        (ListColumn(table.column("span_starts")), ListColumn(table.column("span_versions")))
        if "span_starts" in table.schema.names
        else None
    )
    by_id: dict[int, tuple[int, list[Trajectory], list[Trajectory]]] = {}
    for i, (rid, role) in enumerate(zip(col["request_id"], col["role"], strict=True)):
        entry = by_id.get(rid)
        if entry is None:
            entry = by_id[rid] = (i, [], [])
        if role == "empty":
            continue
        t = Trajectory(
            qid=col["qid"][i],
            response_ids=responses.items(i),
            logprobs=logprobs.items(i),
            reward=col["reward"][i],
            policy_version=col["policy_version"][i],
            replayed=col["replayed"][i],
            text=col["text"][i],
            group_id=col["traj_group_id"][i],
            version_spans=()
            if spans is None
            else tuple(zip(spans[0].items(i), spans[1].items(i), strict=True)),
        )
        entry[1 if role == "trajectory" else 2].append(t)
    return [
        Group(
            qid=col["qid"][i],
            prompt_ids=prompts.items(i),
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
