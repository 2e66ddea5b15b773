"""The training loop (exgrpo/loop/driver.py) on in-process fakes: no Ray, no model, a few seconds.

Rollouts, learners and weights are the fakes of tests/exgrpo/fakes.py; replay is the real
ShardedReplay over two in-process ReplayShards. Rewards are scripted per (request, rollout, version),
so every expected count below is derived by hand from the script.
"""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest
from fakes import (
    FakeLearners,
    FakeRollouts,
    FakeWeights,
    Recorder,
    make_replay,
    prompts,
    sampleable,
    score,
)

from exgrpo.core import metric_names as M
from exgrpo.core.config_files import load_config
from exgrpo.loop.checkpoint import Checkpointer, latest_checkpoint, restore_checkpoint
from exgrpo.loop.driver import Driver
from exgrpo.loop.observer import Observer, Observers

B, K = 8, 4


def config(*extra: str):
    return load_config(
        None,
        [
            f"trainer.questions_per_step={B}",
            f"trainer.rollouts_per_question={K}",
            "trainer.steps=6",
            "replay.start_solve_ratio=0.0",
            "replay.rho=0.5",
            "trainer.eval_every=0",
            "trainer.checkpoint_every=0",
            "data.fresh_take=needed",  # the scenarios below were derived for a stream of B - n_replay per step
            "logging.progress=false",
            "async.max_staleness=0",
            *extra,
        ],
    )


def qnum(request) -> int:
    return int(request.prompt.qid[1:])


def build(
    cfg,
    reward,
    *,
    n_prompts=16,
    checkpointer=None,
    observer=None,
    trace_check=None,
    lag=0,
    events=None,
    **fake,
):
    replay, shards = make_replay(K, retire=cfg.replay.retires)  # as runtime/assembly.py builds them
    weights, learners = FakeWeights(events=events), FakeLearners(lag=lag, events=events)
    rollouts = FakeRollouts(replay=replay, shards=shards, weights=weights, reward=reward, **fake)
    driver = Driver(
        cfg=cfg,
        rollouts=rollouts,
        replay=replay,
        learners=learners,
        weights=weights,
        train=prompts(n_prompts),
        observer=observer,
        checkpointer=checkpointer,
        stall_timeout_s=10.0,
        trace_check=trace_check,
    )
    return driver, rollouts, learners, shards


def step_of_requests(learners) -> dict[int, int]:
    return {g.request_id: t for t, b in enumerate(learners.batches) for g in b.groups}


def first_submission_per_step(rollouts, learners):
    """step -> the submission that admitted it (the first one holding one of its request ids)."""
    owner = step_of_requests(learners)
    out = {}
    for s in rollouts.submissions:
        steps = {owner[r.request_id] for r in s.requests if r.request_id in owner}
        for t in steps:
            out.setdefault(t, s)
    return out


def check_batches(records, learners):
    """Every step trains exactly B distinct groups of K rollouts each."""
    assert len(learners.batches) == len(records)
    for t, (rec, batch) in enumerate(zip(records, learners.batches, strict=True)):
        assert rec[M.STEP] == t and batch.version == t
        assert len(batch.groups) == B == rec[M.N_FRESH] + rec[M.N_REPLAY]
        assert len({g.request_id for g in batch.groups}) == B
        assert all(len(g.trajectories) == K and not g.candidates for g in batch.groups)
        assert Counter(g.kind for g in batch.groups) == Counter(fresh=rec[M.N_FRESH], replay=rec[M.N_REPLAY])
        for g in batch.groups:
            assert [t.replayed for t in g.trajectories] == [g.kind == "replay"] + [False] * (K - 1)


# -- 1. admission ----------------------------------------------------------------------------------


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_admission_paces_requests_to_at_most_eta_versions_ahead(eta):
    # Rewards: question q has k_q = 1 + q % 2 correct fresh rollouts (a replay group: k_q of K - 1 plus
    # the slot, at most 3 < K), so nothing retires and nothing is replaced. Samplers use the weights of
    # the submit time (worst case) and hold every third request back for 2 polls.
    # Step t is admitted at the top of iteration max(0, t - eta), i.e. at version max(0, t - eta),
    # and trained at version t: staleness = min(t, eta) exactly, for every group of the step.
    cfg = config(f"async.max_staleness={eta}", "trainer.steps=7")
    driver, rollouts, learners, _ = build(
        cfg,
        lambda r, i, v: float(i < 1 + qnum(r) % 2),
        version_at="submit",
        hold=lambda r: 2 * (r.request_id % 3 == 0),
    )
    records = driver.train()
    check_batches(records, learners)
    assert driver.weights.broadcasts == list(range(1, 8))
    for t, (rec, batch) in enumerate(zip(records, learners.batches, strict=True)):
        assert rec[M.REPLACED] == 0
        for g in batch.groups:
            assert g.admitted_version == max(0, t - eta)
            assert batch.version - g.policy_version == min(t, eta)
        assert rec[M.STALENESS_MAX] == min(t, eta) <= eta
    # submissions as the samplers saw them: never more than eta steps ahead of the weights, and the
    # pipeline is actually eta deep (with eta = 0 every step waits for the previous update)
    owner = step_of_requests(learners)
    ahead = [owner[r.request_id] - s.version for s in rollouts.submissions for r in s.requests]
    assert max(ahead) == eta and min(ahead) >= 0
    assert len(rollouts.submissions) == 7  # one submit per step (no re-issues)


# -- 2. mixing counts ------------------------------------------------------------------------------


def test_empty_pool_gives_only_fresh_groups():
    # nothing is ever correct -> nothing stored -> no question is replayable, although replay is on
    driver, rollouts, learners, shards = build(config(), lambda r, i, v: 0.0)
    records = driver.train()
    check_batches(records, learners)
    assert [r[M.N_REPLAY] for r in records] == [0] * 6 and [r[M.N_FRESH] for r in records] == [B] * 6
    assert all(s.sampleable == 0 for s in rollouts.submissions) and sampleable(shards) == 0
    assert learners.scored == []  # no entropy call without replay groups


def test_pool_smaller_than_rho_b_replays_the_whole_pool():
    # Only q0 and q1 are ever solved (k = 2 of 4 fresh; replayed: 2 of 3 + slot = 3): the pool holds at
    # most 2 < floor(0.5 * 8) = 4 questions. With eta = 0 every group is pushed before the step's pull,
    # so at step t's schedule the pool is {q0, q1} & {questions of steps < t}, and
    # n_replay(t) = min(4, that size) = that size.
    driver, rollouts, learners, shards = build(
        config("trainer.steps=8"), lambda r, i, v: float(qnum(r) < 2 and i < 2)
    )
    records = driver.train()
    check_batches(records, learners)
    seen: set[str] = set()
    for t, rec in enumerate(records):
        expected = len(seen & {"q0", "q1"})
        assert rec[M.N_REPLAY] == expected == rec[M.REPLAY_AVAILABLE], t
        assert {g.qid for g in learners.batches[t].groups if g.kind == "replay"} == seen & {"q0", "q1"}
        seen |= {g.qid for g in learners.batches[t].groups}
    assert records[-1][M.N_REPLAY] == 2 and records[0][M.N_REPLAY] == 0
    assert sampleable(shards) == 2


def test_shortage_mid_run_replays_min_of_rho_b_and_what_is_there():
    # q0..q5 are learnable: k = 2 before version 3; from version 3 on every rollout of them is correct,
    # so a fresh group retires its question and a replay group does too (3 of 3 + slot = K; that group
    # retired its own question, so it is trained, with all advantages 0). The pool grows, then shrinks
    # to nothing. A replay request whose question another group retired meanwhile is replaced.
    # Oracle, read from the shards when the step's requests were submitted (the draw and the submit are
    # adjacent, nothing is pushed in between): requested replay = n_replay + replaced = min(4, pool).
    def reward(r, i, v):
        return float(qnum(r) < 6 and (i < 2 or v >= 3))

    driver, rollouts, learners, shards = build(config("trainer.steps=9"), reward)
    records = driver.train()
    check_batches(records, learners)
    first = first_submission_per_step(rollouts, learners)
    pools = [first[t].sampleable for t in range(9)]
    for t, rec in enumerate(records):
        assert rec[M.N_REPLAY] + rec[M.REPLACED] == min(4, pools[t]), (t, pools)
        assert rec[M.REPLAY_AVAILABLE] == pools[t]
    for batch in learners.batches[3:]:  # sampled at version >= 3: every replay group is all correct
        assert all(t.correct for g in batch.groups if g.kind == "replay" for t in g.trajectories)
    peak = pools.index(max(pools))
    # observed pools: 0, 5, 5, 6, 1, 0, 0, 0, 0 -> a shortage (1 < 4) after the pool was full
    assert max(pools) >= 4 and any(0 < p < 4 for p in pools[peak:])
    assert pools[-1] == 0 and sampleable(shards) == 0
    assert driver.replay.stats().retired == 6


# -- 3. delayed start and the clip switch ----------------------------------------------------------


@pytest.mark.parametrize("remove_clip", [True, False])
def test_delayed_start_latches_and_clip_is_removed_from_the_next_step(remove_clip):
    # fresh solve ratio per step (eta = 0: step t sampled at version t): 1/4, 1/4, 2/4, 2/4, 0, 0
    # threshold 0.3: step 2 (0.5 > 0.3) triggers; it is still trained with clip=True, step 3 on without;
    # the ratio falling to 0 later does not switch replay off.
    def reward(r, i, v):
        return float(i < (1 if v < 2 else 2 if v < 4 else 0))

    cfg = config("replay.start_solve_ratio=0.3", f"loss.remove_clip_after_replay={str(remove_clip).lower()}")
    driver, rollouts, learners, shards = build(cfg, reward)
    records = driver.train()
    check_batches(records, learners)
    assert [r[M.SOLVE_RATIO] for r in records] == [0.25, 0.25, 0.5, 0.5, 0.0, 0.0]
    assert [r[M.REPLAY_STARTED] for r in records] == [0, 0, 1, 1, 1, 1]
    clip = [b.clip for b in learners.batches]
    assert clip == ([True, True, True, False, False, False] if remove_clip else [True] * 6)
    assert driver.scheduler.delayed_start.started and all(s.collect for s in shards)
    # trajectories are stored from step 3's groups on (collection switched on after step 2's update);
    # step 3 is scheduled after the switch but the pool is still empty, so replay begins at step 4
    assert [r[M.TRAJECTORIES] > 0 for r in records] == [False, False, False, True, True, True]
    assert [r[M.N_REPLAY] for r in records] == [0, 0, 0, 0, 4, 4]


def test_replay_disabled_never_starts():
    cfg = config("replay.enabled=false", "replay.start_solve_ratio=0.0")
    driver, rollouts, learners, shards = build(cfg, lambda r, i, v: float(i < 2))
    records = driver.train()
    assert [r[M.REPLAY_STARTED] for r in records] == [0] * 6 and all(b.clip for b in learners.batches)
    assert all(r[M.N_REPLAY] == 0 for r in records) and not any(s.collect for s in shards)


@pytest.mark.parametrize(
    "overrides, on_policy",
    [
        ([], False),
        (["replay.enabled=false"], True),
        (["replay.rho=0"], True),
        (["replay.retire=false"], None),
    ],
)
def test_on_policy_grpo_never_retires_nor_stores_and_exgrpo_retires(overrides, on_policy):
    # q0..q5 are solved K/K at every try. 16 questions, B = 8, fresh_take=batch: an epoch is 2 steps.
    # ExGRPO retires them at their first group and the stream skips them from the next epoch; on-policy
    # GRPO (replay off, or rho 0) keeps drawing them every epoch and stores nothing. `replay.retire=false`
    # keeps them with replay on (on_policy None: replay runs, nothing retires).
    def reward(r, i, v):
        return float(qnum(r) < 6 or i < 1)

    cfg = config("data.fresh_take=batch", *overrides)
    driver, rollouts, learners, shards = build(cfg, reward)
    records = driver.train()
    solved = Counter(
        g.qid for b in learners.batches for g in b.groups if g.kind == "fresh" and int(g.qid[1:]) < 6
    )
    if on_policy is False:
        assert driver.replay.stats().retired == 6 and all(n == 1 for n in solved.values())
        assert any(r[M.N_REPLAY] for r in records) and any(s.pool.num_trajectories() for s in shards)
        return
    assert driver.replay.stats().retired == 0 and records[-1][M.RETIRED] == 0 and len(records) == 6
    if on_policy is None:  # replay takes some of the stream's slots, yet solved questions come back
        assert any(r[M.N_REPLAY] for r in records) and max(solved.values()) > 1
        return
    assert sum(solved.values()) == 6 * 3  # 3 epochs, each solved question in every one
    assert all(r[M.N_REPLAY] == 0 for r in records) and not any(s.collect for s in shards)
    assert sum(s.pool.num_trajectories() for s in shards) == 0


# -- 4. a question retired in flight ---------------------------------------------------------------


def test_replay_request_of_a_question_retired_in_flight_is_replaced_by_a_fresh_one():
    # Every group solves k = 1 (fresh: 1 of 4; replayed: 0 of 3 + slot), so all 16 questions stay in
    # bucket 1. Step 0: 8 fresh -> 8 replayable. Step 1 draws 4 replay questions; before the first of
    # their groups reaches replay, another sampler's fresh group solves that question X 4/4 (X retires).
    # The pull drops X's replay request, the driver re-issues a fresh request: step 1 still trains
    # B = 8 groups, 3 replayed + 5 fresh, replay/replaced = 1; X is never replayed afterwards.
    retired = {}

    def before_push(fake, request):
        if request.kind == "replay" and not retired:
            retired["qid"], retired["rid"] = request.prompt.qid, request.request_id
            fake.replay.push(groups=[fake.solved_group(request.prompt.qid, 10**6)])

    driver, rollouts, learners, shards = build(
        config("trainer.steps=5"),
        lambda r, i, v: float(i == 0 and r.kind == "fresh"),
        before_push=before_push,
    )
    records = driver.train()
    check_batches(records, learners)
    x, rid = retired["qid"], retired["rid"]
    assert driver.replay.retired() == frozenset({x})
    assert [r[M.REPLACED] for r in records] == [0, 1, 0, 0, 0]
    assert (records[1][M.N_REPLAY], records[1][M.N_FRESH]) == (3, 5)
    trained = {g.request_id for b in learners.batches for g in b.groups}
    assert rid not in trained  # the dropped replay group is never trained
    assert not any(g.qid == x and g.kind == "replay" for b in learners.batches for g in b.groups)
    replacement = [r for s in rollouts.submissions[2:3] for r in s.requests]
    assert len(replacement) == 1 and replacement[0].kind == "fresh" and replacement[0].n == K
    assert replacement[0].request_id in {g.request_id for g in learners.batches[1].groups}
    later = [r for s in rollouts.submissions[3:] for r in s.requests if r.kind == "replay"]
    assert later and all(r.prompt.qid != x for r in later)


# -- 5. a request pushed twice ---------------------------------------------------------------------


def test_a_request_pushed_twice_is_recorded_and_trained_once():
    # Real groups always give k = 1 (fresh: 1 of 4; replayed: 0 of 3 + slot). The re-run copy of a
    # duplicated request has every rollout correct: recorded, it would retire its question (k = K) and
    # store its trajectories. Duplicated: request 1 (fresh, step 0) and the first two replay requests.
    dup: set[int] = {1}

    def duplicate(request):
        if request.kind == "replay" and len(dup) < 3:
            dup.add(request.request_id)
        return request.request_id in dup

    driver, rollouts, learners, shards = build(
        config("trainer.steps=4"), lambda r, i, v: float(i == 0 and r.kind == "fresh"), duplicate=duplicate
    )
    records = driver.train()
    check_batches(records, learners)
    assert len(dup) == 3 and set(rollouts.duplicates) == dup
    assert driver.replay.stats().retired == 0 and driver.replay.stats().ready == 0  # no second copy left
    for s in shards:  # k recorded once: every question is still in bucket 1
        assert all(s.pool.bucket_of(q) in (None, 1) for q in (f"q{i}" for i in range(16)))
        assert not any(
            "copy" in c.group_id for q in (f"q{i}" for i in range(16)) for c in s.pool.candidates(q)
        )
    trained = {g.request_id: g for b in learners.batches for g in b.groups}
    for rid in dup:
        g, first = trained[rid], rollouts.pushed[rid]
        assert g.trajectories[-(len(first.trajectories)) :] == first.trajectories  # the first copy is trained
    assert Counter(rollouts.reported) == Counter(set(rollouts.reported))  # each request reported once
    for s in rollouts.submissions:
        for r in s.requests:  # a replay request never carries its own (or its re-run's) trajectories
            assert all(not c.group_id.startswith(f"r{r.request_id}") for c in r.candidates)
    for b in learners.batches:
        for g in b.groups:
            if g.kind == "replay":
                slot = g.trajectories[0]
                assert slot.group_id != g.group_id and "copy" not in slot.group_id
                # lowest entropy under the (fake) learner among the candidates its request carried
                (req,) = [r for s in rollouts.submissions for r in s.requests if r.request_id == g.request_id]
                best = min(req.candidates, key=score)
                assert slot.response_ids == best.response_ids


# -- 6. the batch is shuffled ----------------------------------------------------------------------


def _kinds_per_step(seed):
    driver, rollouts, learners, _ = build(
        config(f"trainer.seed={seed}", "trainer.steps=4"), lambda r, i, v: float(i == 0 and r.kind == "fresh")
    )
    records = driver.train()
    check_batches(records, learners)
    assert [r[M.N_REPLAY] for r in records] == [0, 4, 4, 4]  # 8 replayable questions after step 0
    return [[(g.kind, g.request_id) for g in b.groups] for b in learners.batches[1:]]


def test_batch_is_shuffled_and_reproducible():
    # Unshuffled, a batch is in request order: the 4 fresh requests (issued first), then the 4 replay.
    per_seed = {seed: _kinds_per_step(seed) for seed in range(5)}
    batches = [b for bs in per_seed.values() for b in bs]
    replay_last = [all(kind == "replay" for kind, _ in b[4:]) for b in batches]
    replay_first = [all(kind == "replay" for kind, _ in b[:4]) for b in batches]
    in_order = [[rid for _, rid in b] == sorted(rid for _, rid in b) for b in batches]
    # with a uniform shuffle each of these has probability 1/70 or 1/8! per batch; over 15 batches
    assert not all(replay_last) and not all(replay_first) and not all(in_order)
    assert sum(replay_last) <= 3 and sum(in_order) <= 1
    assert _kinds_per_step(3) == per_seed[3]  # same seed, same order
    assert per_seed[0] != per_seed[1]


# -- 7. checkpoint round trip ----------------------------------------------------------------------


class Killed(Exception):
    pass


def _summary(learners, records):
    steps = []
    for b, rec in zip(learners.batches, records, strict=True):
        steps.append(
            (
                [
                    (g.qid, g.kind, g.request_id, g.policy_version, g.trajectories[0].response_ids)
                    for g in b.groups
                ],
                b.version,
                b.clip,
                {
                    k: rec[k]
                    for k in (
                        M.N_REPLAY,
                        M.N_FRESH,
                        M.REPLACED,
                        M.REPLAY_STARTED,
                        M.TRAJECTORIES,
                        M.RETIRED,
                        M.REPLAY_AVAILABLE,
                        M.SOLVE_RATIO,
                        M.STALENESS_MAX,
                    )
                },
            )
        )
    return steps


# eta = 1 is the regression for a drain at a checkpoint leaving the replay sizes stale (the
# uninterrupted run then drew other replay questions than the resumed one).
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
    want = _summary(learners_a, records_a)
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
    first_half = _summary(learners_b, records_b)

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
    got = first_half + _summary(learners2, records2)
    assert got[:4] == want[:4]
    for t in range(4, 8):
        assert got[t] == want[t], f"step {t} differs after the resume"


def test_fresh_take_batch_draws_b_questions_every_step_like_the_official_stream():
    # "batch": every step takes B questions from the stream and uses the first B - n_replay, so the
    # stream position after step t is (t + 1) * B whatever was replayed; "needed" advances by B - n_replay.
    def reward(r, i, v):
        return float(i < 2)  # k = 2 of 4 everywhere: every question stays replayable

    for take in ("batch", "needed"):
        driver, rollouts, learners, shards = build(
            config("trainer.steps=4", f"data.fresh_take={take}"), reward
        )
        records = driver.train()
        n_fresh = [r[M.N_FRESH] for r in records]
        assert sum(r[M.N_REPLAY] for r in records) > 0
        position = driver.scheduler.stream.state_dict()
        used = sum(n_fresh)
        drawn = driver.cfg.trainer.questions_per_step * len(records) if take == "batch" else used
        assert _stream_drawn(position) == drawn, (take, position, n_fresh)


def _stream_drawn(state: dict) -> int:
    """Questions drawn from the stream so far (no retirement here, so every epoch has the same length)."""
    return int(state["epoch"]) * len(state["order"]) + int(state["position"])


# -- 8. what the driver reports --------------------------------------------------------------------


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
    assert all(x is y for x, y in zip(a.batches, learners.batches, strict=True)) and len(a.batches) == 4
    assert order == [e for t in range(4) for e in (("batch", t, t + 1), ("step", t, t + 1))]
    # random selection needs no entropies, but a trace check scores and reports every candidate
    scored = [c for call in learners.scored for c in call]
    rows = [row for _, step_rows in a.candidates for row in step_rows]
    assert len(rows) == len(scored) > 0 and a.candidates == b.candidates
    assert [t for t, _ in a.candidates] == [r[M.STEP] for r in records if r[M.N_REPLAY] > 0]
    for row, c in zip(rows, scored, strict=True):
        assert row["qid"] == c.qid and row["entropy"] == score(c.trajectory)
        assert row["valid"] == valid(None, c.trajectory.text)
    assert all(M.CHOSEN_VALID in r for r in records if r[M.N_REPLAY] > 0)

    # without a trace check, random selection scores nothing and reports no candidate
    c = Recorder()
    driver, _, learners, _ = build(cfg, reward, observer=c)
    assert driver.train() == c.records
    assert learners.scored == [] and c.candidates == [] and len(c.batches) == 4


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


# -- the mechanism variants: the curriculum alone, an age cap, equal fresh data ---------------------


def _every_question_replayable(r, i, v):
    return float(i < 2)  # k = 2 of 4 fresh (or 2 of 3 + the slot): every question stays replayable


def test_questions_only_revisits_replayed_questions_with_k_fresh_rollouts_and_no_stored_one():
    driver, rollouts, learners, shards = build(
        config("replay.replay_trajectories=false"), _every_question_replayable
    )
    records = driver.train()
    assert sum(r[M.N_REPLAY] for r in records) > 0  # questions were drawn from replay...
    groups = [g for b in learners.batches for g in b.groups]
    assert all(g.kind == "fresh" and len(g.trajectories) == K for g in groups)  # ...revisited fresh
    assert not any(t.replayed for g in groups for t in g.trajectories)
    assert learners.scored == []  # no stored trajectory is scored
    counts = Counter(g.qid for g in groups)
    assert max(counts.values()) > 1  # a question was revisited


@pytest.mark.parametrize("max_age", [0, 100])
def test_max_age_replays_only_stored_trajectories_young_enough(max_age):
    # eta = 0: a trajectory stored at version v is replayed at version >= v + 1, so age 0 admits none
    driver, rollouts, learners, shards = build(
        config(f"replay.max_age={max_age}"), _every_question_replayable
    )
    records = driver.train()
    assert sum(r[M.N_REPLAY] for r in records) > 0
    for b in learners.batches:
        for g in b.groups:
            if g.kind == "replay":
                assert g.trajectories[0].replayed
                assert b.version - g.trajectories[0].policy_version <= max_age + 1  # admitted at <= max_age
    replayed = sum(g.kind == "replay" for b in learners.batches for g in b.groups)
    assert (replayed == 0) if max_age == 0 else (replayed > 0)


def test_fresh_per_step_caps_the_fresh_questions_and_the_stream_draw():
    driver, rollouts, learners, shards = build(
        config("data.fresh_per_step=3", "data.fresh_take=batch"), _every_question_replayable
    )
    records = driver.train()
    assert [r[M.N_FRESH] for r in records] == [3] * len(records)
    assert records[0][M.N_REPLAY] == 0 and any(r[M.N_REPLAY] == B // 2 for r in records)
    assert _stream_drawn(driver.scheduler.stream.state_dict()) == 3 * len(records)


def test_the_evaluation_before_the_first_step_is_a_record_of_its_own():
    cfg = config("trainer.steps=2", "trainer.eval_samples=2")
    replay, shards = make_replay(K, retire=cfg.replay.retires)  # as runtime/assembly.py builds them
    weights, learners, seen = FakeWeights(), FakeLearners(), Recorder()
    driver = Driver(
        cfg=cfg,
        rollouts=FakeRollouts(replay=replay, shards=shards, weights=weights, reward=lambda r, i, v: 1.0),
        replay=replay,
        learners=learners,
        weights=weights,
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


# -- 8. the update off the driver's path -----------------------------------------------------------


class Events(Observer):
    def __init__(self, events: list) -> None:
        self.events = events

    def on_step(self, *, record) -> None:
        self.events.append(("record", record[M.STEP]))


def _overlap_run(eta: int, overlap: bool, observer=Events, **extra):
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
    _, _, learners, records, events = _overlap_run(eta, overlap=True)
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
    learner_calls = [e for e in events if e[0] in ("update", "entropies", "prepare")]
    for t in range(6):
        i = learner_calls.index(("update", t))
        assert learner_calls[i + 1] == ("prepare", t + 1)
    # the learners score the candidates inside the update (under the weights of the updates queued before)
    assert not [e for e in events if e[0] == "entropies"] and learners.scored
    assert sum(r[M.N_REPLAY] for r in records) > 0  # replay actually ran
    assert all(r[M.UPDATE_TIME] > 0 and r[M.IDLE_TIME] >= 0 and r[M.ENTROPY_TIME] == 0 for r in records)


@pytest.mark.parametrize("eta", [1, 2])
def test_the_learners_pick_the_trajectory_the_driver_would_pick(eta):
    # the same run with the driver scoring (select_on_learners=false) and with the learners scoring
    on, off = (
        _overlap_run(eta, overlap=True, overrides=(f"async.select_on_learners={x}",))
        for x in ("true", "false")
    )
    assert [b.groups for b in on[2].batches] == [b.groups for b in off[2].batches]

    def scored(learners):  # (the learners score in batch order, the driver in request order)
        return [sorted((c.qid, c.trajectory.response_ids) for c in step) for step in learners.scored]

    assert scored(on[2]) == scored(off[2])  # every candidate scored once, at the same step
    assert [e for e in off[4] if e[0] == "entropies"] and not [e for e in on[4] if e[0] == "entropies"]


HOLD_S = 0.05


def slow_trace_check(prompt, text) -> bool:
    """A trace check that takes HOLD_S per candidate (a slow driver between the scores and the update)."""
    time.sleep(HOLD_S)
    return True


def test_with_overlap_the_update_gap_counts_from_when_the_update_finished():
    # with the driver scoring, update t finishes while step t + 1's scores are awaited (they wait behind it);
    # the trace check then holds the batch at least HOLD_S before update t + 1 starts: the learners waited
    records = _overlap_run(
        1, overlap=True, trace_check=slow_trace_check, overrides=("async.select_on_learners=false",)
    )[3]
    # (step 1 has no stored trajectory to score yet: update 0 is seen finished only as update 1 starts)
    gaps = [r[M.UPDATE_GAP] for r in records]
    assert math.isnan(gaps[0]) and all(g >= HOLD_S for g in gaps[2:]), gaps
    # with the learners scoring, the trace check runs once the update finished, and an update queued before
    # its predecessor finished has no gap
    _, _, _, records, events = _overlap_run(1, overlap=True, trace_check=slow_trace_check)
    at = {e: i for i, e in enumerate(events)}
    queued = [t for t in range(1, 6) if at[("update", t)] < at[("updated", t - 1)]]
    assert queued and all(records[t][M.UPDATE_GAP] == 0.0 for t in queued)


class Batches(Events):
    def on_batch(self, *, batch) -> None:
        self.events.append(("batch", batch.version))


@pytest.mark.parametrize("select", ["true", "false"])
def test_each_batch_is_reported_as_trained_right_before_its_record(select):
    overrides = (f"async.select_on_learners={select}",)
    _, _, learners, _, events = _overlap_run(1, overlap=True, observer=Batches, overrides=overrides)
    reported = [e for e in events if e[0] in ("batch", "record")]
    assert reported == [x for t in range(6) for x in (("batch", t), ("record", t))]


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_overlap_changes_when_the_driver_works_not_how_steps_are_admitted_and_mixed(eta):
    runs = [_overlap_run(eta, overlap=o) for o in (True, False)]
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
        assert _summary(l_on, rec_on) == _summary(l_off, rec_off)
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

    _overlap_run(1, overlap=True, checkpointer=checkpointer, overrides=("trainer.checkpoint_every=2",))
    assert seen == [(2, 2, True), (4, 4, True), (6, 6, True)]


def test_zero_variance_rho_mode_replays_the_share_of_fresh_groups_without_signal():
    # every 4th question gets k = 2 of 4, the rest 0 of 4: a quarter of the fresh groups carry signal, so
    # after the first step the replay share follows 3/4 of B (capped at floor(rho * B) = 6 and B - 1), where
    # the fixed mode asks for floor(0.5 * B) = 4. eta = 0: step t is scheduled after step t - 1 was pulled.
    def reward(r, i, v):
        return float(qnum(r) % 4 == 0 and i < 2)

    cfg = config("replay.rho_mode=zero_variance", "replay.rho=0.75", "trainer.steps=8")
    driver, rollouts, learners, shards = build(cfg, reward, n_prompts=64)
    records = driver.train()
    check_batches(records, learners)
    first = first_submission_per_step(rollouts, learners)
    for t in range(1, len(records)):
        z = records[t - 1][M.FRESH_ZERO_VARIANCE_FRAC]
        want = min(round(z * B), 6, first[t].sampleable)
        assert records[t][M.N_REPLAY] + records[t][M.REPLACED] == want, (t, z, first[t].sampleable)
    assert max(r[M.N_REPLAY] for r in records) > 4  # beyond what rho = 0.5 would have taken
    state = driver.state_dict()
    assert state["fresh_zero_var"] == records[-1][M.FRESH_ZERO_VARIANCE_FRAC]


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
    want = _summary(learners_a, driver_a.train())

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
    got = _summary(learners_b, records_b) + _summary(learners2, records2)
    assert got == want


def test_a_scale_change_reaches_the_jobs_output_with_its_step(caplog):
    """`python -m exgrpo.scale`: before, the change was an INFO line that a job's output (a warning level, or
    the Python API without logging set up) did not show."""

    class Desired:
        def desired_samplers(self):
            return 3

    driver, rollouts, _, _ = build(config("trainer.steps=1"), lambda r, i, v: 0.0)
    driver.scaling = Desired()
    with caplog.at_level("WARNING", logger="exgrpo.loop.driver"):
        driver.train()
    assert "step 0: scaling samplers 1 -> 3" in [r.getMessage() for r in caplog.records]
