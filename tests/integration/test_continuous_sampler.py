"""The continuous sampler (`actors/continuous_sampler.py`) as a real Ray actor on a real vLLM CPU engine.

A weight update lands in the middle of a long response: every recorded token log-prob before the
recorded switch equals the old weights' log-prob of that token (teacher-forced by transformers), and
every one after it the new weights', so the recorded version ranges are the weights that sampled each
token. A short request sent after the long one finishes first; a request admitted at a newer version waits
for those weights; the pool drives the actor through its usual contract (one request per call).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from actors.sampler import EngineSpec, SamplerSettings
from exgrpo.core.records import GenerationRequest, Prompt
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model
from exgrpo.transport.packed import Packer

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]

LONG = 400  # tokens of the long response
CONTEXT = 480


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinyModelSpec(init_std=0.3, max_position=CONTEXT)
    return build_tiny_model(tmp_path_factory.mktemp("continuous") / "tiny", spec=spec)


def hf_model(model_dir: Path, noise: float = 0.0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if noise:
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * noise)
    return model


@torch.no_grad()
def token_logprobs(model: torch.nn.Module, prompt: tuple[int, ...], response: tuple[int, ...]) -> np.ndarray:
    """log pi(response[t] | prompt, response[:t]) at temperature 1, teacher-forced in one pass."""
    ids = torch.tensor([[*prompt, *response]])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) + len(response) - 1].double()
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0].numpy()


def start_sampler(
    model_dir: Path, *, index: int, num_cpus: int, max_response_len: int, seed: int, replay=None
):
    """A ContinuousSampler actor on the tiny model (K = 2), as the pool starts one."""
    from actors.continuous_sampler import ContinuousSampler
    from exgrpo.runtime.env import remote_actor

    return remote_actor(
        ContinuousSampler,
        name=f"exgrpo-sampler-{index}",
        num_cpus=num_cpus,
        max_concurrency=16,
        index=index,
        engine=EngineSpec(kind="vllm", model_path=str(model_dir), max_model_len=CONTEXT),
        settings=SamplerSettings(
            template="plain", max_response_len=max_response_len, seed=seed, rollouts_per_question=2
        ),
        replay=replay,
    )


@pytest.fixture(scope="module")
def sampler(ray_cluster, model_dir: Path):
    pytest.importorskip("vllm")
    import ray

    handle = start_sampler(model_dir, index=0, num_cpus=1, max_response_len=16, seed=3)
    ray.get(handle.ping.remote(), timeout=600)
    ray.get(
        handle.generate.remote(requests=[request(0)], max_tokens=2), timeout=600
    )  # engine and verifier up
    return handle


def request(rid: int, *, n: int = 1, admitted: int = 0) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid, prompt=Prompt(f"q{rid}", "What is 1+2?", "3"), n=n, admitted_version=admitted
    )


def test_an_update_mid_response_tags_every_token_with_the_weights_that_sampled_it(sampler, model_dir):
    import ray

    long_ref = sampler.generate.remote(requests=[request(1, n=2)], max_tokens=LONG, ignore_eos=True)
    deadline = time.monotonic() + 600
    while ray.get(sampler.engine_steps.remote()) < 60:  # a third of the way in
        assert time.monotonic() < deadline, "the long request made no progress"
        time.sleep(0.05)
    old, new = hf_model(model_dir), hf_model(model_dir, noise=0.05)
    seconds = ray.get(sampler.load_weights.remote(weights=Packer().pack(new.state_dict()), version=1))
    assert seconds > 0 and ray.get(sampler.version.remote()) == 1
    short_ref = sampler.generate.remote(requests=[request(2)], max_tokens=4, ignore_eos=True)
    short = ray.get(short_ref, timeout=600)
    ready, _ = ray.wait([long_ref], timeout=0)
    assert not ready, "the short request, sent after the long one, should finish first"
    assert ray.get(sampler.in_flight.remote()) == 1  # the long one is still generating
    long = ray.get(long_ref, timeout=600)

    (group,) = long.groups
    assert long.policy_version == group.policy_version == group.oldest_version == 0  # what staleness counts
    assert long.tokens == 2 * LONG, [
        (len(t.response_ids), t.version_spans, t.text[-30:]) for t in group.trajectories
    ]
    for t in group.trajectories:
        assert len(t.response_ids) == LONG and t.policy_version == 0
        assert len(t.version_spans) == 2 and t.version_spans[0] == (0, 0) and t.version_spans[1][1] == 1
        switch = t.version_spans[1][0]
        assert 60 <= switch < LONG
        got = np.array(t.logprobs)
        want_old = token_logprobs(old, group.prompt_ids, t.response_ids)
        want_new = token_logprobs(new, group.prompt_ids, t.response_ids)
        assert np.abs(got[:switch] - want_old[:switch]).max() < 1e-3
        assert np.abs(got[switch:] - want_new[switch:]).max() < 1e-3
        # the check tells the two weights apart: the old ones do not explain the tokens after the switch
        assert np.abs(got[switch:] - want_old[switch:]).max() > 1e-2
    (sg,) = short.groups
    assert [t.policy_version for t in sg.trajectories] == [1] and sg.trajectories[0].version_spans == ()


def test_a_request_admitted_at_a_newer_version_waits_for_its_weights(sampler, model_dir):
    import ray

    ref = sampler.generate.remote(requests=[request(3, admitted=2)], max_tokens=4)
    ready, _ = ray.wait([ref], timeout=2.0)
    assert not ready  # the sampler serves version 1
    ray.get(sampler.load_weights.remote(weights=Packer().pack(hf_model(model_dir).state_dict()), version=2))
    result = ray.get(ref, timeout=300)
    assert result.policy_version == 2
    assert [t.policy_version for t in result.groups[0].trajectories] == [2]


def test_the_pool_sends_one_request_per_call_and_hears_each_one(sampler):
    from actors.pool import SamplerPool

    pool = SamplerPool(spawn=lambda i: sampler, num=1, requests_per_call=1, max_in_flight_per_sampler=8)
    pool.submit(requests=[request(10 + i, n=2, admitted=2) for i in range(5)])
    results = pool.wait_idle(timeout_s=600)
    assert sorted(r.request_ids for r in results) == [(10 + i,) for i in range(5)]
    assert all(len(r.groups) == 1 and len(r.groups[0].trajectories) == 2 for r in results)
    assert pool.num_pending() == 0
    pool.shutdown()


def test_groups_pushed_to_a_real_replay_shard_as_they_finish(ray_cluster, model_dir: Path):
    """With a replay service (a real shard actor): every request's group is in replay once the request is
    reported, also when many finish together (their pushes coalesce), and none comes back to the driver."""
    pytest.importorskip("vllm")
    import ray

    from buffers.shard import ReplayShard
    from buffers.sharded import RayInvoke, ShardedReplay
    from exgrpo.runtime.env import remote_actor

    shard = remote_actor(ReplayShard, name="exgrpo-replay-0", num_cpus=0, max_concurrency=8, k_rollouts=2)
    replay = ShardedReplay(shards=[shard], k_rollouts=2, invoke=RayInvoke(retry_s=0.0))
    handle = start_sampler(model_dir, index=9, num_cpus=0, max_response_len=8, seed=4, replay=replay)
    try:
        calls = [handle.generate.remote(requests=[request(100 + i, n=2)]) for i in range(8)]
        results = ray.get(calls, timeout=600)
        assert all(r.groups == () for r in results)  # the groups went to replay, not back
        pulled = replay.pull_batch(request_ids=[100 + i for i in range(8)])
        assert [g.request_id for g in pulled.groups] == [100 + i for i in range(8)]
        assert all(len(g.trajectories) == 2 for g in pulled.groups)
    finally:
        ray.kill(handle)
        ray.kill(shard)
