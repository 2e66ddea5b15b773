"""What the driver reports (observers, the evaluation before the first step, reward failures) and how it ends
when the data runs out.

The loop on in-process fakes (tests/exgrpo/loop/loop_harness.py): no Ray, no model, a few seconds.
"""

from __future__ import annotations

import pytest
from fakes import (
    FakeLearners,
    FakeRollouts,
    FakeWeights,
    Recorder,
    make_replay,
    prompts,
    score,
)
from loop_harness import (
    B,
    K,
    build,
    config,
)

from exgrpo.core import metric_names as M
from exgrpo.loop.driver import Driver, Roles
from exgrpo.loop.observer import Observer, Observers


def test_observers_see_every_batch_and_record_and_with_a_trace_check_every_candidate():
    def reward(r, i, v):
        return float(i < 2)  # k = 2 of 4 everywhere: every question stays replayable

    order = []

    class Order(Observer):
        def on_batch(self, *, batch):
            order.append(("batch", batch.version, len(learners.batches)))  # once trained

        def on_step(self, *, record):
            order.append(("step", record[M.STEP], len(learners.batches)))

    def valid(prompt, text):
        return text.endswith("/0")

    cfg = config("trainer.steps=4", "replay.trajectory_selection=random")
    a, b = Recorder(), Recorder()
    driver, _, learners, _ = build(cfg, reward, observer=Observers(a, None, b, Order()), trace_check=valid)
    records = driver.train()
    assert a.records == b.records == records
    assert a.batches == learners.batches and len(a.batches) == 4  # as trained (rebuilt from the picks)
    assert order == [e for t in range(4) for e in (("batch", t, t + 1), ("step", t, t + 1))]
    # random selection needs no entropies, but a trace check scores and reports every candidate
    scored = [c for call in learners.scored for c in call]
    rows = [row for _, step_rows in a.candidates for row in step_rows]
    assert len(rows) == len(scored) > 0 and a.candidates == b.candidates
    assert [t for t, _ in a.candidates] == [r[M.STEP] for r in records if r[M.N_REPLAY] > 0]
    # (the rows come by request id, the learners score in the batch's shuffled order)
    by_row = sorted(rows, key=lambda row: (row["qid"], row["entropy"]))
    for row, c in zip(by_row, sorted(scored, key=lambda c: (c.qid, score(c.trajectory))), strict=True):
        assert row["qid"] == c.qid and row["entropy"] == score(c.trajectory)
        assert row["valid"] == valid(None, c.trajectory.text)
    assert all(M.CHOSEN_VALID in r for r in records if r[M.N_REPLAY] > 0)

    for (step, step_rows), batch in zip(
        a.candidates, [b for b in a.batches if any(g.kind == "replay" for g in b.groups)], strict=True
    ):
        picks = [g.trajectories[0] for g in batch.groups if g.kind == "replay"]  # each group's one chosen row
        assert sum(r["chosen"] for r in step_rows) == len(picks) and all(r["step"] == step for r in step_rows)
        chosen = [r for r in step_rows if r["chosen"]]  # by request id, as the replay groups are
        replay = sorted((g for g in batch.groups if g.kind == "replay"), key=lambda g: g.request_id)
        for r, g in zip(
            chosen, replay, strict=True
        ):  # the row marked chosen is the trajectory trained in slot 0
            assert (r["request_id"], r["qid"]) == (g.request_id, g.qid)
            assert (r["tokens"], r["policy_version"]) == (
                len(g.trajectories[0].response_ids),
                g.trajectories[0].policy_version,
            )

    # without a trace check, random selection scores nothing; the candidates are still reported, unscored
    c = Recorder()
    driver, _, learners, _ = build(cfg, reward, observer=c)
    assert driver.train() == c.records
    assert learners.scored == [] and len(c.batches) == 4
    rows = [row for _, step_rows in c.candidates for row in step_rows]
    assert rows and all(r["entropy"] is None and r["valid"] is None for r in rows)
    assert [t for t, _ in c.candidates] == [r[M.STEP] for r in c.records if r[M.N_REPLAY] > 0]


def test_the_evaluation_before_the_first_step_is_a_record_of_its_own():
    cfg = config("trainer.steps=2", "trainer.eval_samples=2")
    replay, shards = make_replay(K, retire=cfg.replay.retires)  # as runtime/assembly.py builds them
    weights, learners, seen = FakeWeights(), FakeLearners(), Recorder()
    rollouts = FakeRollouts(replay=replay, shards=shards, weights=weights, reward=lambda r, i, v: 1.0)
    driver = Driver(
        cfg=cfg,
        roles=Roles(rollouts=rollouts, replay=replay, learners=learners, weights=weights),
        train=prompts(16),
        evaluation=prompts(3),
        observer=seen,
        stall_timeout_s=10.0,
    )
    records = driver.train()
    assert seen.evals == [{M.STEP: -1, M.EVAL_ACCURACY: 0.0, M.EVAL_PASS: 0.0, M.EVAL_VERSION: 0}]
    assert [r[M.STEP] for r in seen.records] == [0, 1] and records[-1][M.EVAL_VERSION] == 2
    assert len(driver.eval_history) == 2
    driver.train()  # nothing left to train: no second evaluation before a first step
    assert len(seen.evals) == 1


def test_reward_failures_are_counted_per_step_and_the_first_of_each_kind_logged_once(caplog):
    """Each sampler sends the first failure of each kind it saw; the driver logs a kind once per run and the
    step's record carries the count and its share of the step's rollouts."""

    def failures(request):
        notes = (
            (("raised", f"ValueError: bad row (qid {request.prompt.qid})"),) if request.request_id < 3 else ()
        )
        return 1, notes  # every request: one of its K rollouts failed

    driver, _, _, _ = build(
        config("trainer.steps=2", "replay.enabled=false"), lambda r, i, v: 0.0, failures=failures
    )
    with caplog.at_level("WARNING", logger="exgrpo.loop.scheduler"):
        records = driver.train()
    assert [r[M.REWARD_FAILURES] for r in records] == [B, B]
    assert [r[M.ROLLOUTS] for r in records] == [B * K, B * K]
    assert records[0][M.REWARD_FAILURE_SHARE] == pytest.approx(1 / K)
    (note,) = driver.reward_failure_notes.values()  # three requests sent a note; one is kept
    assert list(driver.reward_failure_notes) == ["raised"] and note.startswith("ValueError: bad row (qid q")
    logged = [r.getMessage() for r in caplog.records if "bad row" in r.getMessage()]
    assert logged == [f"reward raised on a rollout (fake-0): {note}; it scored 0"]


def test_running_out_of_questions_ends_training_cleanly_without_a_repeated_question():
    # 10 questions, B = 8, every rollout correct: step 0's 8 questions all retire (k = K). Step 1 needs 8
    # distinct questions and only 2 are left, so training ends after step 0 instead of crashing or
    # repeating a question inside one step. (ExGRPO before its delayed start: on-policy GRPO never retires.)
    driver, rollouts, learners, shards = build(
        config("replay.start_solve_ratio=1.0"), lambda r, i, v: 1.0, n_prompts=10
    )
    records = driver.train()
    assert [r[M.STEP] for r in records] == [0] and driver.step == 1
    assert driver.out_of_work == (
        "only 2 training questions are not retired; a step needs 8 distinct ones: training ends after 1 of 6 steps"
    )
    for batch in learners.batches:
        qids = [g.qid for g in batch.groups]
        assert len(set(qids)) == len(qids) == B
