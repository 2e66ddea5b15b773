"""The update off the driver's path (`async.overlap_update`, exgrpo/loop/pipeline.py): updates queue behind each
other, the learners pick slot 0, timings, the order of reports, and checkpoint steps land their update first.

The loop on in-process fakes (tests/exgrpo/loop/loop_harness.py): no Ray, no model, a few seconds.
"""

from __future__ import annotations

import math
import time

import pytest
from loop_harness import (
    build,
    check_batches,
    config,
    qnum,
    summary,
)

from exgrpo.core import metric_names as M
from exgrpo.loop.observer import Observer


class Events(Observer):
    def __init__(self, events: list) -> None:
        self.events = events

    def on_step(self, *, record) -> None:
        self.events.append(("record", record[M.STEP]))


def overlap_run(eta: int, overlap: bool, observer=Events, **extra):
    events: list[tuple[str, int]] = []
    cfg = config(
        f"async.max_staleness={eta}",
        f"async.overlap_update={str(overlap).lower()}",
        "replay.start_solve_ratio=0.0",
        "trainer.steps=6",
        *extra.pop("overrides", ()),
    )
    driver, rollouts, learners, _ = build(
        cfg,
        lambda r, i, v: float(i < 1 + qnum(r) % 2),
        version_at="submit",
        lag=3,  # every learner call finishes at its third wait
        events=events,
        observer=observer(events),
        **extra,
    )
    records = driver.train()
    return driver, rollouts, learners, records, events


@pytest.mark.parametrize("eta", [1, 2])
def test_with_overlap_the_next_update_queues_behind_the_running_one(eta):
    _, _, learners, records, events = overlap_run(eta, overlap=True)
    check_batches(records, learners)
    at = {e: i for i, e in enumerate(events)}
    for t in range(6):
        # update t finishes, then version t + 1 is broadcast, then step t is recorded, in step order
        assert at[("updated", t)] < at[("broadcast", t + 1)] < at[("record", t)]
        if t:
            assert at[("update", t - 1)] < at[("update", t)] and at[("record", t - 1)] < at[("record", t)]
    # update t + 1 is started (queued on the learners) before update t finished ...
    assert any(at[("update", t)] < at[("updated", t - 1)] for t in range(1, 6))
    # ... but never more than eta + 1 updates are in flight: a step is admitted only eta versions ahead
    in_flight = 0
    for e in events:
        in_flight += {"update": 1, "updated": -1}.get(e[0], 0)
        assert in_flight <= eta + 1
    # each export is queued right behind the update that makes it, before any later learner call
    learner_calls = [e for e in events if e[0] in ("update", "prepare")]
    for t in range(6):
        i = learner_calls.index(("update", t))
        assert learner_calls[i + 1] == ("prepare", t + 1)
    # the learners score the candidates inside the update (under the weights of the updates queued before)
    assert learners.scored
    assert sum(r[M.N_REPLAY] for r in records) > 0  # replay actually ran
    assert all(r[M.UPDATE_TIME] > 0 and r[M.IDLE_TIME] >= 0 for r in records)


class Trained(Events):
    def on_batch(self, *, batch) -> None:
        self.events.append(("batch", batch))


@pytest.mark.parametrize("mode", ["lowest_entropy", "random"])
def test_the_driver_reports_the_batch_the_learners_trained_from_their_picks(mode):
    # the learners pick (by score, or at random by request id); the driver rebuilds each batch from the picks
    # in the update's result, with no scoring of its own
    runs = [
        overlap_run(1, overlap=True, observer=Trained, overrides=(f"replay.trajectory_selection={mode}",))
        for _ in range(2)
    ]
    _, _, learners, records, events = runs[0]
    reported = [e[1] for e in events if e[0] == "batch"]
    assert [b.groups for b in reported] == [b.groups for b in learners.batches]
    assert sum(r[M.N_REPLAY] for r in records) > 0
    scored = sum(len(step) for step in learners.scored)
    assert (scored > 0) if mode == "lowest_entropy" else (scored == 0)  # "random" scores nothing
    # the same seed picks the same trajectories
    assert [b.groups for b in runs[1][2].batches] == [b.groups for b in learners.batches]


HOLD_S = 0.05


def slow_trace_check(prompt, text) -> bool:
    """A trace check that takes HOLD_S per candidate (a slow driver between the scores and the update)."""
    time.sleep(HOLD_S)
    return True


def test_with_overlap_the_update_gap_counts_from_when_the_update_finished():
    # the trace check runs once the update finished, and an update queued before its predecessor finished has
    # no gap
    _, _, _, records, events = overlap_run(1, overlap=True, trace_check=slow_trace_check)
    at = {e: i for i, e in enumerate(events)}
    queued = [t for t in range(1, 6) if at[("update", t)] < at[("updated", t - 1)]]
    assert queued and all(records[t][M.UPDATE_GAP] == 0.0 for t in queued)
    assert math.isnan(records[0][M.UPDATE_GAP])


class Batches(Events):
    def on_batch(self, *, batch) -> None:
        self.events.append(("batch", batch.version))


def test_each_batch_is_reported_as_trained_right_before_its_record():
    _, _, learners, _, events = overlap_run(1, overlap=True, observer=Batches)
    reported = [e for e in events if e[0] in ("batch", "record")]
    assert reported == [x for t in range(6) for x in (("batch", t), ("record", t))]


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_overlap_changes_when_the_driver_works_not_how_steps_are_admitted_and_mixed(eta):
    runs = [overlap_run(eta, overlap=o) for o in (True, False)]
    (_, roll_on, l_on, rec_on, ev_on), (_, roll_off, l_off, rec_off, ev_off) = runs

    def shape(learners, records):  # which replay questions are drawn may differ: see below
        return [
            (b.version, b.clip, sorted((g.kind, b.version - g.policy_version) for g in b.groups), counts(r))
            for b, r in zip(learners.batches, records, strict=True)
        ]

    def counts(r):
        return {k: r[k] for k in (M.N_REPLAY, M.N_FRESH, M.REPLACED, M.REPLAY_STARTED, M.STALENESS_MAX)}

    assert shape(l_on, rec_on) == shape(l_off, rec_off)
    if eta == 0:  # nothing overlaps: the very same run
        assert summary(l_on, rec_on) == summary(l_off, rec_off)
    # With eta > 0 a step admitted once update t - 1 lands may be drawn after step t's pull (the serial loop
    # draws it before), so the replay questions it draws can differ; the submissions are the same.
    assert [(s.version, [r.request_id for r in s.requests]) for s in roll_on.submissions] == [
        (s.version, [r.request_id for r in s.requests]) for s in roll_off.submissions
    ]
    serial = [e for e in ev_off if e[0] in ("update", "broadcast")]
    assert serial == [x for t in range(6) for x in (("update", t), ("broadcast", t + 1))]
    if eta == 0:  # on-policy: the next step waits for the broadcast anyway, so nothing overlaps
        assert [e for e in ev_on if e[0] in ("update", "broadcast")] == serial


def test_checkpoint_steps_finish_their_update_before_the_checkpoint(tmp_path):
    seen: list[tuple[int, int, bool]] = []

    def checkpointer(d):
        seen.append((d.step, d.version, not d.pipeline.in_flight))

    overlap_run(1, overlap=True, checkpointer=checkpointer, overrides=("trainer.checkpoint_every=2",))
    assert seen == [(2, 2, True), (4, 4, True), (6, 6, True)]
