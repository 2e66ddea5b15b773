"""SamplerPool on a real local Ray cluster with tiny HF samplers: requests, on_new, failures, scaling, evaluate."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import ray

from actors.pool import SamplerPool
from actors.sampler import EngineSpec, Sampler, SamplerSettings
from exgrpo.core.records import GenerationRequest, Prompt, RolloutResult, Trajectory
from exgrpo.models.tiny import TinyModelSpec, build_tiny_model
from exgrpo.runtime.env import remote_actor

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("pool") / "tiny", spec=TinyModelSpec())


def _spawn(model_dir: Path, prefix: str, *, cpus=lambda index: 0.5):
    spec = EngineSpec(kind="hf", model_path=str(model_dir))

    def spawn(index: int):
        return remote_actor(
            Sampler,
            name=f"{prefix}-{index}",
            num_cpus=cpus(index),
            index=index,
            engine=spec,
            settings=SamplerSettings(template="plain", max_response_len=4, seed=index),
            replay=None,
        )

    return spawn


def _request(i: int) -> GenerationRequest:
    cands = ()
    if i % 2:
        cands = (Trajectory(qid=f"q{i}", response_ids=(4,), logprobs=(-1.0,), reward=1.0, policy_version=0),)
    return GenerationRequest(
        request_id=i,
        prompt=Prompt(qid=f"q{i}", question=f"{i}+1", answer=str(i + 1)),
        n=2,
        kind="replay" if cands else "fresh",
        candidates=cands,
    )


def _collect(pool: SamplerPool, want: int, timeout_s: float = 120.0) -> list[RolloutResult]:
    out, deadline = [], time.monotonic() + timeout_s
    while sum(len(r.request_ids) for r in out) < want and time.monotonic() < deadline:
        out += pool.poll(timeout_s=0.2)
    return out


def test_requests_on_new_failure_replacement_and_scaling(ray_cluster, model_dir):
    seen: list = []
    pool = SamplerPool(spawn=_spawn(model_dir, "pool-a"), num=0, requests_per_call=2, on_new=seen.append)
    try:
        pool.scale(num=2)
        assert pool.size() == 2 and pool.members() == {}  # starting: no request reaches them yet
        pool.wait_started(timeout_s=120)
        assert pool.size() == 2 and list(pool.members()) == ["exgrpo-sampler-0", "exgrpo-sampler-1"]
        # on_new saw every sampler before any request, in the order they finished starting
        assert len(seen) == 2 and set(seen) == set(pool.members().values())
        pool.submit(requests=[_request(i) for i in range(8)])
        victim = pool.members()["exgrpo-sampler-0"]
        ray.kill(victim, no_restart=True)  # with requests in flight on it
        results = _collect(pool, 8)
        ids = sorted(i for r in results for i in r.request_ids)
        assert ids == list(range(8))  # every request exactly once, none lost with the dead sampler
        assert pool.restarts == 1 and pool.size() == 2 and pool.num_pending() == 0
        pool.wait_started(timeout_s=120)
        assert len(seen) == 3 and seen[-1] is pool.members()["exgrpo-sampler-2"]  # the replacement
        groups = {g.request_id: g for r in results for g in r.groups}
        for i, g in groups.items():
            assert g.candidates == _request(i).candidates and len(g.trajectories) == 2
        pool.scale(num=1)  # drains the newest (idle: removed at once)
        assert list(pool.members()) == ["exgrpo-sampler-1"]
        pool.submit(requests=[_request(i) for i in range(8, 10)])
        assert {r.sampler for r in pool.wait_idle(timeout_s=120)} == {"exgrpo-sampler-1"}
        with pytest.raises(ValueError, match="at least one sampler"):
            pool.scale(num=0)
    finally:
        pool.shutdown()
    assert pool.size() == 0


def test_evaluate_splits_prompts_and_keeps_their_order(ray_cluster, model_dir):
    pool = SamplerPool(spawn=_spawn(model_dir, "pool-b"), num=2, requests_per_call=1)
    try:
        prompts = [Prompt(qid=f"e{i}", question=f"{i}+0", answer=str(i)) for i in range(5)]
        scores = pool.evaluate(prompts=prompts, n=3)
        assert len(scores) == 5 and all(len(s) == 3 and set(s) <= {0.0, 1.0} for s in scores)
        assert pool.evaluate(prompts=[], n=3) == []
    finally:
        pool.shutdown()


def test_a_sampler_that_dies_during_evaluation_is_replaced_and_its_slice_evaluated_again(
    ray_cluster, model_dir
):
    pool = SamplerPool(spawn=_spawn(model_dir, "pool-d"), num=2, requests_per_call=1)
    try:
        prompts = [Prompt(qid=f"d{i}", question=f"{i}+0", answer=str(i)) for i in range(5)]
        ray.kill(pool.members()["exgrpo-sampler-0"], no_restart=True)  # dies before its slice is scored
        scores = pool.evaluate(prompts=prompts, n=2)
        assert len(scores) == 5 and all(len(s) == 2 and set(s) <= {0.0, 1.0} for s in scores)
        assert pool.restarts == 1 and pool.size() == 2 and "exgrpo-sampler-0" not in pool.members()
    finally:
        pool.shutdown()


class FailingSampler(Sampler):
    """A sampler without an engine whose calls fail (the actor stays up) and whose `close` leaves a mark, then
    hangs."""

    def __init__(self, *, mark: str) -> None:  # no engine: the pool only pings it, calls it and closes it
        self.mark = mark

    def generate(self, *, requests):
        raise RuntimeError("planted sampler failure")

    def close(self) -> None:
        Path(self.mark).write_text("closed")
        time.sleep(30)


def test_a_failed_sampler_is_killed_without_waiting_for_its_close(ray_cluster, tmp_path):
    """A sampler whose node vanished cannot answer `close`: the pool must not wait for it (the step would
    stall until Ray declares the node dead). Here sampler 0's calls fail and its close would hang 30 s; its
    replacement asks for more CPUs than the cluster has, so it stays pending and the requests stay queued."""
    mark = tmp_path / "closed"

    def spawn(index: int):
        return remote_actor(
            FailingSampler, name=f"pool-f-{index}", num_cpus=64.0 if index else 0.5, mark=str(mark)
        )

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file
    pool = SamplerPool(spawn=spawn, num=1, requests_per_call=1)
    try:
        pool.submit(requests=[_request(i) for i in range(3)])
        deadline = time.monotonic() + 60
        while pool.restarts == 0 and time.monotonic() < deadline:
            assert pool.poll(timeout_s=0.2) == []
        assert pool.restarts == 1 and not mark.exists()  # killed, never asked to close
        assert (
            pool.num_pending() == 3 and pool.num_starting() == 1
        )  # its requests back in the queue, none lost
    finally:
        pool.shutdown()


def test_a_sampler_ray_cannot_place_gets_no_request_and_a_scale_down_removes_it(ray_cluster, model_dir):
    """Sampler 1 asks for more CPUs than the cluster has, so it stays PENDING_CREATION: the live sampler
    serves every request meanwhile, and scaling back down cancels the pending one."""
    cpus = {1: 64.0}  # index 1: unplaceable on the 4-CPU test cluster; every other index 0.5
    pool = SamplerPool(
        spawn=_spawn(model_dir, "pool-p", cpus=lambda i: cpus.get(i, 0.5)), num=1, requests_per_call=1
    )
    try:
        pool.scale(num=2)
        assert pool.size() == 2 and pool.num_starting() == 1 and list(pool.members()) == ["exgrpo-sampler-0"]
        pool.submit(requests=[_request(i) for i in range(6)])
        t0 = time.monotonic()
        results = _collect(pool, 6, timeout_s=60)
        assert sorted(i for r in results for i in r.request_ids) == list(range(6)), time.monotonic() - t0
        assert {r.sampler for r in results} == {"exgrpo-sampler-0"} and pool.num_starting() == 1
        pool.scale(num=1)  # the pending sampler goes, without waiting for it
        assert pool.size() == 1 and pool.num_starting() == 0 and pool.num_pending() == 0
        pool.submit(requests=[_request(i) for i in range(6, 8)])  # and the pool goes on as before
        assert sorted(i for r in pool.wait_idle(timeout_s=60) for i in r.request_ids) == [6, 7]
    finally:
        pool.shutdown()
    assert pool.size() == 0
