"""Groups <-> Arrow tables (for checkpointing the shards' queues of finished groups).

One row per trajectory or stored candidate, with the group's fields repeated; token ids as
list<int32>, log-probs as list<float64> so a resumed run sees bit-identical records. No pickle.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from exgrpo.types import Group, Trajectory

SCHEMA = pa.schema([
    ("request_id", pa.int64()), ("qid", pa.string()), ("kind", pa.string()), ("gold", pa.string()),
    ("group_id", pa.string()), ("group_policy_version", pa.int64()), ("admitted_version", pa.int64()),
    ("prompt_ids", pa.list_(pa.int32())), ("role", pa.string()),  # "trajectory" | "candidate" | "empty"
    ("response_ids", pa.list_(pa.int32())), ("logprobs", pa.list_(pa.float64())), ("reward", pa.float64()),
    ("policy_version", pa.int64()), ("replayed", pa.bool_()), ("text", pa.string()), ("traj_group_id", pa.string()),
])


def groups_to_arrow(groups: Sequence[Group]) -> pa.Table:
    rows: list[dict] = []
    for g in groups:
        head = {"request_id": g.request_id, "qid": g.qid, "kind": g.kind, "gold": g.gold, "group_id": g.group_id,
                "group_policy_version": g.policy_version, "admitted_version": g.admitted_version,
                "prompt_ids": list(g.prompt_ids)}
        items = [("trajectory", t) for t in g.trajectories] + [("candidate", c) for c in g.candidates]
        if not items:
            rows.append({**head, "role": "empty"})
        for role, t in items:
            rows.append({**head, "role": role, "response_ids": list(t.response_ids), "logprobs": list(t.logprobs),
                         "reward": t.reward, "policy_version": t.policy_version, "replayed": t.replayed,
                         "text": t.text, "traj_group_id": t.group_id})
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def groups_from_arrow(table: pa.Table) -> list[Group]:
    by_id: dict[int, dict] = {}
    for row in table.to_pylist():
        g = by_id.setdefault(row["request_id"], {"row": row, "trajectory": [], "candidate": []})
        if row["role"] == "empty":
            continue
        g[row["role"]].append(Trajectory(
            qid=row["qid"], response_ids=tuple(row["response_ids"]), logprobs=tuple(row["logprobs"]),
            reward=row["reward"], policy_version=row["policy_version"], replayed=row["replayed"], text=row["text"],
            group_id=row["traj_group_id"]))
    out = []
    for rid, g in by_id.items():
        r = g["row"]
        out.append(Group(qid=r["qid"], prompt_ids=tuple(r["prompt_ids"]), trajectories=tuple(g["trajectory"]),
                         kind=r["kind"], gold=r["gold"], group_id=r["group_id"], request_id=rid,
                         policy_version=r["group_policy_version"], admitted_version=r["admitted_version"],
                         candidates=tuple(g["candidate"])))
    return out
