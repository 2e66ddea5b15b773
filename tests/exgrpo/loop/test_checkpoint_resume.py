"""Checkpoint state and resume: a killed run resumed from its checkpoint, and a stop request that checkpoints at
the step boundary, both equal the uninterrupted run.

The loop on in-process fakes (tests/exgrpo/loop/loop_harness.py): no Ray, no model, a few seconds.
"""

from __future__ import annotations

import pytest
from fakes import (
    Recorder,
)
from loop_harness import (
    build,
    config,
    qnum,
    summary,
)

from exgrpo.core import metric_names as M
from exgrpo.loop.checkpoint import Checkpointer, latest_checkpoint, restore_checkpoint
from exgrpo.loop.observer import Observer


class Killed(Exception):
    pass


@pytest.mark.parametrize("eta", [0, 1])
def test_checkpoint_round_trip_continues_identically(tmp_path, eta):
    # k = (q + v) % 4 fresh rollouts correct at version v: the step-0 solve ratio is above 0.3, so the
    # delayed start fires after step 0's update (collection on from then). The fake samples a request
    # at the first poll after its submit, so:
    #   eta = 0: step 1 is admitted and sampled after the switch -> stored -> replay from step 2;
    #   eta = 1: steps 0, 1 are admitted at once and sampled in wait(0), before the switch; step 2 is
    #            sampled in wait(2) (wait(1) finds step 1 done, no poll), step 3 is admitted before that
    #            -> nothing to replay; replay from step 4.
    # Killed after the checkpoint at step 4 (with eta = 1 its drain samples step 4, admitted earlier).
    # Some replay groups solve 3 of 3 (+ slot = K) and are dropped and replaced.
    def reward(r, i, v):
        return float(i < (qnum(r) + v) % 4)

    cfg = config(
        f"async.max_staleness={eta}",
        "replay.start_solve_ratio=0.3",
        "trainer.checkpoint_every=4",
        "trainer.steps=8",
    )
    model = tmp_path / "base-model"
    model.mkdir()

    # A: uninterrupted (it writes the same checkpoints, so both runs drain at the same points)
    ckpt_a = Checkpointer(tmp_path / "a", model_path=str(model), keep=2)
    driver, _, learners_a, _ = build(cfg, reward, checkpointer=ckpt_a)
    records_a = driver.train()
    want = summary(learners_a, records_a)
    first = 2 if eta == 0 else 4
    assert [r[M.N_REPLAY] + r[M.REPLACED] > 0 for r in records_a] == [t >= first for t in range(8)]
    assert all(r[M.REPLAY_STARTED] for r in records_a)

    # B: killed right after the checkpoint at step 4, then resumed by fresh roles and a fresh driver
    ckpt_b = Checkpointer(tmp_path / "b", model_path=str(model), keep=2)

    def kill_after(d):
        ckpt_b(d)
        if d.step == 4:
            raise Killed

    seen = Recorder()
    driver, _, learners_b, _ = build(cfg, reward, checkpointer=kill_after, observer=seen)
    with pytest.raises(Killed):
        driver.train()
    records_b = seen.records
    assert len(records_b) == 4
    first_half = summary(learners_b, records_b)

    ckpt = latest_checkpoint(tmp_path / "b")
    assert ckpt is not None and ckpt.name == "step-000004"
    driver2, rollouts2, learners2, shards2 = build(cfg, reward, checkpointer=ckpt_b)
    restore_checkpoint(ckpt, driver=driver2)
    assert learners2.loaded == {"updates": 4} and driver2.weights.broadcasts == [4]
    assert driver2.step == 4 and driver2.version == 4
    assert set(driver2.scheduler.plans) == set(
        range(4, 4 + eta)
    )  # admitted steps come back (their groups wait in replay)
    assert driver2.scheduler.delayed_start.started and all(s.collect for s in shards2)
    records2 = driver2.train()
    assert [r[M.STEP] for r in records2] == [4, 5, 6, 7]
    got = first_half + summary(learners2, records2)
    assert got[:4] == want[:4]
    for t in range(4, 8):
        assert got[t] == want[t], f"step {t} differs after the resume"


class StopAfter(Observer):
    """Asks the driver to stop (as the recipe's SIGINT handler does) once step `at` is recorded."""

    def __init__(self, at: int) -> None:
        self.at, self.driver = at, None
        self.records: list[dict] = []

    def on_step(self, *, record):
        self.records.append(record)
        if record[M.STEP] == self.at and self.driver is not None:
            self.driver.stop_requested = "SIGINT"


@pytest.mark.parametrize("eta", [0, 1])
def test_a_stop_request_checkpoints_at_the_step_boundary_and_the_resume_loses_no_step(tmp_path, eta):
    """Ctrl-C after step 2 (no checkpoint due before step 4): before, the steps since the last checkpoint were
    lost. Now the driver finishes the step, checkpoints at step 3 and stops; the resume trains steps 3..7 and
    the whole run equals an uninterrupted one."""

    def reward(r, i, v):
        return float(i < (qnum(r) + v) % 4)

    cfg = config(f"async.max_staleness={eta}", "replay.start_solve_ratio=0.3", "trainer.checkpoint_every=4",
                 "trainer.steps=8")  # fmt: skip
    model = tmp_path / "base-model"
    model.mkdir()
    # the reference writes a checkpoint at step 3 too, so both runs drain at the same points
    ref_ckpt = Checkpointer(tmp_path / "a", model_path=str(model), keep=3)

    def ref_checkpointer(d):
        ref_ckpt(d)

    class AlsoAtThree(Observer):
        def on_step(self, *, record):
            if record[M.STEP] == 2:
                ref_ckpt(driver_a)

    driver_a, _, learners_a, _ = build(cfg, reward, checkpointer=ref_checkpointer, observer=AlsoAtThree())
    want = summary(learners_a, driver_a.train())

    ckpt_b = Checkpointer(tmp_path / "b", model_path=str(model), keep=3)
    stop = StopAfter(2)
    driver, _, learners_b, _ = build(cfg, reward, checkpointer=ckpt_b, observer=stop)
    stop.driver = driver
    records_b = driver.train()
    assert [r[M.STEP] for r in records_b] == [0, 1, 2] and driver.step == 3
    assert driver.stopped == "SIGINT: stopped after step 3 of 8"
    ckpt = latest_checkpoint(tmp_path / "b")
    assert ckpt is not None and ckpt.name == "step-000003"

    driver2, _, learners2, _ = build(cfg, reward, checkpointer=ckpt_b)
    restore_checkpoint(ckpt, driver=driver2)
    records2 = driver2.train()
    assert [r[M.STEP] for r in records2] == [3, 4, 5, 6, 7]  # no step lost, none twice
    got = summary(learners_b, records_b) + summary(learners2, records2)
    assert got == want
