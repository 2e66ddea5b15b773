"""Per-token policy versions (`Trajectory.version_spans`): the record's checks, its Arrow round trip (the
shards' write-ahead log and queues), groups built from completions, and the driver counting the oldest."""

from __future__ import annotations

import pyarrow as pa
import pytest
from fakes import FakeLearners, FakeRollouts, FakeWeights, make_replay, prompts

from actors.engines import Completion
from actors.sampling import build_groups
from buffers.records import conform, decode_payload, encode_payload, groups_from_arrow, groups_to_arrow
from exgrpo.core.config_files import load_config
from exgrpo.core.records import GenerationRequest, Group, Prompt, ReplayPick, Trajectory
from exgrpo.loop.driver import Driver, Roles


def traj(spans: tuple[tuple[int, int], ...], *, n: int = 6, version: int | None = None) -> Trajectory:
    return Trajectory(
        qid="q1",
        response_ids=tuple(range(n)),
        logprobs=(-0.5,) * n,
        reward=1.0,
        policy_version=spans[0][1] if version is None else version,
        version_spans=spans,
    )


def test_spans_give_each_token_its_version_and_the_oldest():
    t = traj(((0, 2), (4, 3), (5, 5)))
    assert t.token_versions() == (2, 2, 2, 2, 3, 5)
    assert t.oldest_version == t.policy_version == 2
    plain = Trajectory("q", (1, 2), (-1.0, -1.0), 0.0, 7)
    assert plain.token_versions() == (7, 7) and plain.oldest_version == 7


@pytest.mark.parametrize(
    "spans, version",
    [
        (((1, 0), (3, 1)), 0),  # must start at token 0
        (((0, 0), (3, 1), (3, 2)), 0),  # starts strictly increase
        (((0, 0), (6, 1)), 0),  # a start past the last token
        (((0, 2), (3, 1)), 2),  # versions never go back
        (((0, 1), (3, 2)), 2),  # policy_version is the oldest (first span's)
    ],
)
def test_inconsistent_spans_are_refused(spans, version):
    with pytest.raises(ValueError, match="version_spans"):
        traj(spans, version=version)


def test_spans_survive_the_arrow_round_trip_and_old_tables_read_as_single_version():
    g = Group(
        qid="q1",
        prompt_ids=(1, 2),
        trajectories=(traj(((0, 4), (2, 6))), traj(((0, 6),), version=6)),
        request_id=3,
        policy_version=4,
    )
    table = groups_to_arrow([g])
    assert groups_from_arrow(table) == [g]
    old = table.drop_columns(["span_starts", "span_versions"])  # a log frame from before the field
    back = groups_from_arrow(old)[0]
    assert [t.version_spans for t in back.trajectories] == [(), ()]
    # a log frame or shard file of that layout reads back conformed (the spans empty), another one is refused
    assert decode_payload(encode_payload(old)).column("span_starts").to_pylist() == [[], []]
    with pytest.raises(ValueError, match="not a table of groups"):
        conform(old.drop_columns(["text"]))
    assert isinstance(table.schema.field("span_starts").type, pa.ListType)


def test_built_groups_take_the_oldest_version():
    req = GenerationRequest(request_id=5, prompt=Prompt("q1", "1+1", "2"), n=2, admitted_version=3)
    comps = [
        Completion((1, 2, 3), (-1.0,) * 3, "a", "stop", version_spans=((0, 3), (1, 4))),
        Completion((4, 5), (-1.0,) * 2, "b", "stop", version_spans=((0, 4),)),
    ]
    (g,) = build_groups([req], [(9, 9)], [comps], [1.0, 0.0], versions=[3])
    assert [t.policy_version for t in g.trajectories] == [3, 4]
    assert g.trajectories[0].version_spans == ((0, 3), (1, 4))
    assert g.trajectories[1].version_spans == ()  # one version: the plain record
    assert g.policy_version == g.oldest_version == 3


def driver(*extra: str) -> Driver:
    cfg = load_config(
        None,
        [
            "trainer.questions_per_step=4",
            "trainer.rollouts_per_question=4",
            "trainer.steps=2",
            "trainer.eval_every=0",
            "trainer.checkpoint_every=0",
            "logging.progress=false",
            *extra,
        ],
    )
    replay, shards = make_replay(4)
    weights = FakeWeights()
    rollouts = FakeRollouts(replay=replay, shards=shards, weights=weights, reward=lambda *a: 1.0)
    return Driver(
        cfg=cfg,
        roles=Roles(rollouts=rollouts, replay=replay, learners=FakeLearners(), weights=weights),
        train=prompts(8),
        stall_timeout_s=10.0,
    )


def test_replay_max_age_counts_the_oldest_token():
    scheduler = driver("replay.max_age=1").scheduler
    qid = next(iter(scheduler.prompts))
    mixed = traj(((0, 1), (3, 3)))  # newest tokens at 3 (age 0), oldest at 1 (age 2 > max_age)
    young = traj(((0, 2), (3, 3)))  # oldest at 2: age 1
    assert scheduler.replay_request(ReplayPick(qid=qid, candidates=(mixed,)), version=3).kind == "fresh"
    req = scheduler.replay_request(ReplayPick(qid=qid, candidates=(mixed, young)), version=3)
    assert req.kind == "replay" and req.candidates == (young,)


@pytest.mark.parametrize(
    "overrides",
    [
        ["samplers.engine=hf"],
        ["samplers.engine=vllm", "async.weight_sync=collective"],
    ],
)
def test_continuous_samplers_need_vllm_fed_by_the_object_store(overrides):
    from exgrpo.core.config import ConfigError

    with pytest.raises(ConfigError, match="samplers.continuous=true"):
        load_config(None, ["samplers.continuous=true", *overrides])
    load_config(None, ["samplers.continuous=true", "samplers.engine=vllm"])  # the supported combination
