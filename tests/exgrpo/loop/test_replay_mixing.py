"""Replay mixing: how many replay groups a step gets, a question retired in flight, a request pushed twice,
the shuffled batch and the zero-variance replay share.

The loop on in-process fakes (tests/exgrpo/loop/loop_harness.py): no Ray, no model, a few seconds.
"""

from __future__ import annotations

from collections import Counter

from fakes import (
    sampleable,
    score,
)
from loop_harness import (
    B,
    K,
    build,
    check_batches,
    config,
    first_submission_per_step,
    qnum,
)

from exgrpo.core import metric_names as M


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
