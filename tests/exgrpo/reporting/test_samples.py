"""samples.jsonl: which completions of a batch are shown (`choose`), the rows' format, when `SampleLog`
writes them, that a resume does not repeat a step, and their TensorBoard text."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from exgrpo.core.records import Group, TrainBatch, Trajectory
from exgrpo.reporting.samples import FIELDS, SampleLog, as_markdown, choose, last_steps, read_samples, rows


def traj(qid: str, i: int, reward: float, *, replayed: bool = False, version: int = 0) -> Trajectory:
    return Trajectory(
        qid=qid,
        response_ids=(1, 2),
        logprobs=(-0.1, -0.2),
        reward=reward,
        policy_version=version,
        replayed=replayed,
        text=f"{qid} answer {i}",
    )


def group(qid: str, rid: int, rewards: list[float], *, replay: bool = False) -> Group:
    """A group of len(rewards) rollouts; a replay group's first is the stored trajectory (version 0)."""
    ts = tuple(
        traj(qid, i, r, replayed=replay and i == 0, version=0 if replay and i == 0 else 3)
        for i, r in enumerate(rewards)
    )
    return Group(
        qid=qid, prompt_ids=(5,), trajectories=ts, kind="replay" if replay else "fresh", request_id=rid
    )


QUESTIONS = {q: f"what is {q}?" for q in ("a", "b", "c", "d")}


def mixed_batch() -> TrainBatch:
    """Shuffled: two fresh groups, two replay groups (slot 0 replayed)."""
    return TrainBatch(
        groups=(
            group("c", 3, [1.0, 0.0, 1.0, 0.0], replay=True),
            group("a", 1, [0.0, 1.0, 0.0, 0.0]),
            group("d", 4, [1.0, 1.0, 1.0, 0.0], replay=True),
            group("b", 2, [1.0, 1.0, 0.0, 0.0]),
        ),
        version=3,
    )


def picked(batch: TrainBatch, n: int) -> list[tuple[str, str]]:
    return [(g.qid, t.text) for g, t in choose(batch, n)]


def test_both_origins_half_each_in_request_order_one_per_group():
    assert picked(mixed_batch(), 4) == [
        ("c", "c answer 0"),  # replayed, request order (c before d), not the shuffled order
        ("d", "d answer 0"),
        ("a", "a answer 0"),  # fresh: one per group in request order, then the next slot
        ("b", "b answer 0"),
    ]
    assert picked(mixed_batch(), 7)[4:] == [("c", "c answer 1"), ("d", "d answer 1"), ("a", "a answer 1")]
    assert picked(mixed_batch(), 1) == [("c", "c answer 0")]  # one place: the replayed side keeps it
    assert picked(mixed_batch(), 4) == picked(mixed_batch(), 4)  # same batch, same rows


def test_a_short_side_leaves_its_places_to_the_other():
    fresh_only = TrainBatch(groups=(group("b", 2, [1.0, 0.0]), group("a", 1, [0.0, 0.0])), version=0)
    assert picked(fresh_only, 3) == [("a", "a answer 0"), ("b", "b answer 0"), ("a", "a answer 1")]
    one_replayed = TrainBatch(
        groups=(group("c", 3, [1.0, 0.0], replay=True), group("a", 1, [0.0])), version=0
    )
    assert picked(one_replayed, 4) == [("c", "c answer 0"), ("a", "a answer 0"), ("c", "c answer 1")]
    assert len(choose(one_replayed, 0)) == 0


def test_rows_carry_the_documented_fields():
    out = rows(mixed_batch(), step=7, questions=QUESTIONS, n=4)
    assert all(tuple(r) == FIELDS for r in out)
    by_qid = {r["qid"]: r for r in out}
    assert by_qid["c"] == {
        "step": 7,
        "qid": "c",
        "prompt": "what is c?",
        "completion": "c answer 0",
        "reward": 1.0,
        "bucket": "2/4",
        "origin": "replayed",
        "policy_version": 0,
    }
    assert (
        by_qid["d"]["bucket"] == "3/4" and by_qid["a"]["bucket"] == "1/4" and by_qid["b"]["bucket"] == "2/4"
    )
    assert [r["origin"] for r in out] == ["replayed", "replayed", "fresh", "fresh"]
    assert by_qid["a"]["policy_version"] == 3
    json.dumps(out)  # JSON-able as is


def test_sample_log_writes_every_nth_step_and_rewinds_on_resume(tmp_path):
    path = tmp_path / "samples.jsonl"
    sink: list[tuple[int, int]] = []
    log = SampleLog(
        path, questions=QUESTIONS, every=2, per_step=3, sink=lambda r, s: sink.append((s, len(r)))
    )
    log.on_train_start(system=None, driver=SimpleNamespace(step=0))
    for step in range(5):
        log.on_batch(batch=mixed_batch())
        log.on_step(record={"step": step})
    written = read_samples(path)
    assert [r["step"] for r in written] == [0] * 3 + [2] * 3 + [4] * 3
    assert sink == [(0, 3), (2, 3), (4, 3)]
    assert [r["step"] for r in last_steps(written, 2)] == [4] * 3 + [2] * 3

    # a run resumed from its step-3 checkpoint trains steps 3 and 4 again: their rows go first
    again = SampleLog(path, questions=QUESTIONS, every=2, per_step=3)
    again.on_train_start(system=None, driver=SimpleNamespace(step=3))
    assert [r["step"] for r in read_samples(path)] == [0] * 3 + [2] * 3
    again.on_batch(batch=mixed_batch())
    again.on_step(record={"step": 4})
    assert [r["step"] for r in read_samples(path)] == [0] * 3 + [2] * 3 + [4] * 3
    with pytest.raises(ValueError, match="every >= 1"):
        SampleLog(path, questions=QUESTIONS, every=0, per_step=3)


def test_markdown_keeps_model_output_verbatim():
    row = rows(mixed_batch(), step=0, questions=QUESTIONS, n=1)[0]
    text = as_markdown([{**row, "completion": "**not bold**\n| a | b |"}])
    assert "    **not bold**\n    | a | b |" in text  # indented: a code block, shown as written
    assert "**replayed** qid `c`, reward 1, bucket 2/4" in text
