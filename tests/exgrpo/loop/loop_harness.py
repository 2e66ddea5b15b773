"""The driver on in-process fakes, shared by the tests of this folder: the config, `build` and the checks.

Rollouts, learners and weights are the fakes of tests/exgrpo/fakes.py; replay is the real
ShardedReplay over two in-process ReplayShards. Rewards are scripted per (request, rollout, version),
so every expected count in the tests is derived by hand from the script.
"""

from __future__ import annotations

from collections import Counter

from fakes import FakeLearners, FakeRollouts, FakeWeights, make_replay, prompts

from exgrpo.core import metric_names as M
from exgrpo.core.config_files import load_config
from exgrpo.loop.driver import Driver, Roles

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
        roles=Roles(rollouts=rollouts, replay=replay, learners=learners, weights=weights),
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


def summary(learners, records):
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


def stream_drawn(state: dict) -> int:
    """Questions drawn from the stream so far (no retirement here, so every epoch has the same length)."""
    return int(state["epoch"]) * len(state["order"]) + int(state["position"])
