"""Sampler in-process: generate reports a RolloutResult, replay candidates travel on in their groups."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest
import torch

from actors.sampler import EngineSpec, Sampler, SamplerSettings
from exgrpo.core.records import GenerationRequest, Prompt, RolloutResult, Trajectory
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("sampler") / "tiny", spec=TinyModelSpec())


class _Replay:
    def __init__(self) -> None:
        self.pushed: list = []

    def push(self, *, groups) -> None:
        self.pushed.extend(groups)


def _requests() -> list[GenerationRequest]:
    stored = Trajectory(
        qid="q1", response_ids=(5, 6), logprobs=(-1.0, -2.0), reward=1.0, policy_version=0, group_id="r0"
    )
    return [
        GenerationRequest(
            request_id=7, prompt=Prompt(qid="q0", question="1+2", answer="3"), n=3, admitted_version=2
        ),
        GenerationRequest(
            request_id=8,
            prompt=Prompt(qid="q1", question="2+2", answer="4"),
            n=2,
            kind="replay",
            admitted_version=2,
            candidates=(stored,),
        ),
    ]


@pytest.mark.parametrize("with_replay", [False, True])
def test_generate_reports_a_rollout_result_and_copies_candidates(model_dir, with_replay):
    replay = _Replay() if with_replay else None
    sampler = Sampler(
        index=3,
        engine=EngineSpec(kind="hf", model_path=str(model_dir)),
        settings=SamplerSettings(template="plain", max_response_len=6, seed=1),
        replay=replay,
    )
    try:
        requests = _requests()
        result = sampler.generate(requests=requests)
    finally:
        sampler.close()
    assert isinstance(result, RolloutResult)
    assert (result.sampler, result.request_ids, result.policy_version) == ("exgrpo-sampler-3", (7, 8), 0)
    groups = replay.pushed if with_replay else list(result.groups)
    assert result.groups == (() if with_replay else tuple(groups))
    assert [len(g.trajectories) for g in groups] == [3, 2]
    assert result.tokens == sum(len(t.response_ids) for g in groups for t in g.trajectories)
    assert groups[0].candidates == () and groups[1].candidates == requests[1].candidates
    assert [(g.kind, g.request_id, g.admitted_version, g.group_id) for g in groups] == [
        ("fresh", 7, 2, "r7"),
        ("replay", 8, 2, "r8"),
    ]
    assert result.gen_time_s > 0 and result.verify_time_s >= 0


def test_the_spawner_builds_one_picklable_settings_record_from_the_config():
    """Both sampler kinds get the same record, which travels to each actor with `.remote` (pickled)."""
    from exgrpo.core.config_files import load_config
    from exgrpo.runtime.parts import SamplerSpawner

    cfg = load_config(
        None,
        [
            "model.max_response_len=24",
            "samplers.temperature=0.7",
            "samplers.top_p=0.9",
            "samplers.verify_timeout_s=3",
            "samplers.seeded=false",
            "trainer.seed=5",
            "trainer.rollouts_per_question=4",
        ],
    )
    settings = SamplerSpawner(cfg, model_path="unused", replay=None).settings
    assert settings == SamplerSettings(
        template=cfg.model.template,
        max_response_len=24,
        temperature=0.7,
        top_p=0.9,
        verify_timeout_s=3.0,
        reward_fn=cfg.reward.fn,
        seed=5,
        rollouts_per_question=4,
        seeded=False,
        weight_sums=True,  # checks.checksum (on by default)
    )
    assert pickle.loads(pickle.dumps(settings)) == settings
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.seed = 6  # type: ignore[misc]
