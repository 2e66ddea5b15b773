"""Groups <-> Arrow tables (write-ahead log frames, ready queues): an exact round trip."""

from __future__ import annotations

import pyarrow as pa

from buffers.records import (
    SCHEMA,
    decode_payload,
    groups_from_arrow,
    groups_to_arrow,
    push_payload,
    push_payloads,
)
from exgrpo.core.records import Group, Trajectory


def _traj(qid, i, reward, **kw):
    return Trajectory(
        qid=qid,
        response_ids=(i, 50_000 + i, 7),
        logprobs=(-0.1 * i, -1 / 3, -(2.0**-40)),
        reward=reward,
        policy_version=i,
        group_id=f"g{i}",
        **kw,
    )


def test_round_trip_of_fresh_replay_and_empty_groups_in_push_order():
    groups = [
        Group(
            qid="b",
            prompt_ids=(3, 4, 5),
            trajectories=tuple(_traj("b", i, float(i % 2)) for i in range(4)),
            gold="12",
            group_id="g1",
            request_id=7,
            policy_version=2,
            admitted_version=1,
        ),
        Group(
            qid="a",
            prompt_ids=(1,),
            trajectories=tuple(_traj("a", i, 0.0, text="x\ny") for i in range(3)),
            kind="replay",
            request_id=3,
            candidates=(_traj("a", 9, 1.0), _traj("a", 8, 1.0, replayed=True)),
        ),
        Group(qid="e", prompt_ids=(), trajectories=(), request_id=5),
    ]
    table = groups_to_arrow(groups)
    assert table.schema.equals(SCHEMA) and table.num_rows == 4 + 5 + 1
    assert groups_from_arrow(table) == groups
    sink = pa.BufferOutputStream()  # through IPC, as a log frame, and in several chunks
    with pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=3):
            w.write_batch(batch)
    back = pa.ipc.open_stream(sink.getvalue()).read_all()
    assert back.column("response_ids").num_chunks > 1 and groups_from_arrow(back) == groups
    assert groups_from_arrow(groups_to_arrow([])) == []


def test_push_payloads_are_each_parts_own_rows_from_one_table():
    """A sampler call's groups become one table; each shard's bytes must still decode to exactly its groups
    (no rows of another part: a slice's buffers are written truncated), as `push_payload` of that part."""
    long = tuple(range(5_000))  # a long response in part 0 shows whether part 1's bytes carry part 0's values
    parts = [
        [
            Group(qid="a", prompt_ids=(1, 2), trajectories=(_traj("a", 1, 1.0), _traj("a", 2, 0.0)), request_id=1),
            Group(
                qid="b",
                prompt_ids=(3,),
                trajectories=(Trajectory("b", long, (-0.5,) * len(long), 1.0, 0),),
                request_id=2,
            ),
        ],
        [],
        [
            Group(qid="e", prompt_ids=(), trajectories=(), request_id=3),
            Group(qid="c", prompt_ids=(9,), trajectories=(_traj("c", 3, 1.0, text="t"),), request_id=4,
                  kind="replay", candidates=(_traj("c", 4, 1.0),)),
        ],
    ]  # fmt: skip
    payloads = push_payloads(parts)
    assert len(payloads) == 3
    for part, payload in zip(parts, payloads, strict=True):
        assert groups_from_arrow(decode_payload(payload)) == part
        assert decode_payload(payload).equals(decode_payload(push_payload(part)))
    assert len(payloads[2]) < len(payloads[0]) / 4  # part 0's 5,000-token response is not in part 2's bytes
