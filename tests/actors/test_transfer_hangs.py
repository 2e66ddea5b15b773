"""Weight transfer that cannot hang (docs/failures.md): the sampler's control calls.

A fake vLLM engine (no model) stands behind the real `actors.sampler.Sampler`, so these run in seconds:

* a control call that reaches the sampler after its deadline is refused, never run (a late
  `start_weight_update` would move the layers to the meta device after the learner gave up);
* an abandoned session (started, never finished) is ended before the next engine call, and the fallback
  `load_weights` then loads the version;
* every re-init releases the previous engine first (vLLM's `shutdown_weight_transfer_engine`): no leak;
* on a real Ray actor, a sampler busy in long generate calls answers `start_weight_update` after at most
  the one call in flight, not after its whole queue (the control calls have their own concurrency group).

The data plane with real vLLM samplers (gloo) and a sampler killed mid-way: tests/integration/test_transports.py.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

import actors.sampler as sampler_mod
from actors.sampler import LateWeightUpdate, Sampler
from exgrpo.core.records import RolloutResult


class FakeVLLM:
    """The weight-transfer surface of `actors.vllm_engine.VLLMEngine`, recording calls."""

    def __init__(self, gen_s: float = 0.0) -> None:
        self.calls: list[str] = []
        self.version = 0
        self.gen_s = gen_s
        self.on_meta = False

    def init_weight_transfer(self, init_info: Any) -> None:
        self.calls.append("init")

    def shutdown_weight_transfer(self) -> None:
        self.calls.append("shutdown")

    def start_weight_update(self) -> None:
        self.calls.append("start")
        self.on_meta = True

    def update_weights(self, update_info: Any) -> None:
        self.calls.append("update")

    def finish_weight_update(self, *, version: int) -> None:
        self.calls.append(f"finish:{version}")
        self.on_meta, self.version = False, version

    def load_weights(self, weights: Any, *, version: int) -> None:
        assert not self.on_meta, "a full load into a half-updated engine"
        self.calls.append(f"load:{version}")
        self.version = version

    def checksum(self) -> float:
        return float(self.version)


class FakeSampler(Sampler):
    """`Sampler` with a `FakeVLLM` (its generate sleeps `gen_s` and returns an empty result)."""

    def __init__(self, gen_s: float = 0.0) -> None:  # noqa: D107 - skips the engine and verifier
        self.name = "fake-sampler"
        self.engine = FakeVLLM(gen_s)  # type: ignore[assignment]
        self._update_start = time.perf_counter()
        self.weight_load_s = 0.0
        self.gate = self._new_gate()
        self.transfer_inits = self.transfer_shutdowns = 0
        self.weight_sums = False  # no served-weight sums (checks.checksum)

    def _generate(self, requests: Any) -> RolloutResult:
        assert not self.engine.on_meta, "generate on a half-updated engine"
        time.sleep(self.engine.gen_s)
        return RolloutResult(
            sampler=self.name,
            request_ids=(),
            policy_version=self.engine.version,
            tokens=0,
            gen_time_s=self.engine.gen_s,
            verify_time_s=0.0,
        )

    def calls(self) -> list[str]:
        return list(self.engine.calls)


def test_a_late_control_call_is_refused_and_not_run():
    s = FakeSampler()
    past = time.time() - 1
    for call in (
        lambda: s.init_weight_transfer_engine(init_info={}, deadline=past),
        lambda: s.start_weight_update(deadline=past),
    ):
        with pytest.raises(LateWeightUpdate, match="after its deadline"):
            call()
    assert s.engine.calls == [] and not s.engine.on_meta
    assert s.transfer_stats()["refused"] == 2


def test_an_abandoned_update_is_closed_before_the_fallback_load_and_before_generate(monkeypatch):
    s = FakeSampler()
    soon = time.time() + 60
    s.init_weight_transfer_engine(init_info={}, deadline=soon)
    s.start_weight_update(deadline=soon)  # the broadcast fails after this: no update, no finish
    assert s.engine.on_meta
    monkeypatch.setattr(sampler_mod, "unpack_weights", lambda w: {})
    s.load_weights(weights=None, version=3)  # type: ignore[arg-type]  # the object-store fallback
    assert s.engine.calls == ["init", "start", "finish:0", "load:3"]
    assert s.transfer_stats()["aborted_updates"] == 1
    with pytest.raises(LateWeightUpdate, match="abandoned"):  # the failed version's late finish
        s.finish_weight_update(version=3, deadline=soon)
    # an expired session is closed by the next generate too (it waits for the deadline, not forever)
    s.start_weight_update(deadline=time.time() + 0.3)
    t0 = time.perf_counter()
    assert s.generate(requests=[]).policy_version == 3
    assert 0.2 < time.perf_counter() - t0 < 5
    assert s.engine.calls[-2:] == ["start", "finish:3"]


def test_every_reinit_shuts_the_previous_engine_down():
    s = FakeSampler()
    for _ in range(4):  # four worlds (membership changes)
        s.init_weight_transfer_engine(init_info={}, deadline=time.time() + 60)
    stats = s.transfer_stats()
    assert stats["inits"] == 4 and stats["shutdowns"] == 3
    assert s.engine.calls == ["init"] + ["shutdown", "init"] * 3


@pytest.mark.integration
def test_a_busy_sampler_answers_the_update_after_one_call_not_its_queue(ray_cluster):
    import ray

    from exgrpo.runtime.env import remote_actor

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this file
    gen_s = 3.0
    h = remote_actor(FakeSampler, name="busy-fake-sampler", num_cpus=0.5, gen_s=gen_s)
    try:
        ray.get(h.ping.remote())
        queued = [h.generate.remote(requests=[]) for _ in range(4)]  # 12 s of generation queued
        time.sleep(0.5)  # the first is in flight
        t0 = time.perf_counter()
        ray.get(h.start_weight_update.remote(deadline=time.time() + 30), timeout=30)
        latency = time.perf_counter() - t0
        assert latency < gen_s + 1.5, latency  # bounded by the one call in flight, not by the 4 queued
        ray.get(h.update_weights.remote(update_info={}, deadline=time.time() + 30), timeout=30)
        ray.get(h.finish_weight_update.remote(version=1, deadline=time.time() + 30), timeout=30)
        results = ray.get(queued, timeout=60)
        # the queued generates waited for the session and then sampled with the new version
        assert [r.policy_version for r in results] == [0, 1, 1, 1]
        assert ray.get(h.calls.remote()) == ["start", "update", "finish:1"]
        # a control call whose deadline passes while it waits behind a long generate is refused
        slow = [h.generate.remote(requests=[]) for _ in range(2)]
        time.sleep(0.5)
        with pytest.raises(ray.exceptions.RayTaskError, match="after its deadline"):
            ray.get(h.start_weight_update.remote(deadline=time.time() + 1.0), timeout=30)
        ray.get(slow, timeout=60)
        assert ray.get(h.transfer_stats.remote())["open"] == 0
        print(f"update latency behind a {gen_s:.0f} s generate with 3 more queued: {latency:.2f} s")
    finally:
        ray.kill(h)


class WorldVLLM(FakeVLLM):
    """`FakeVLLM` whose init joins the trainer's world for real: vLLM's `StatelessProcessGroup` rendezvous (its
    store waits for every member) and a gloo group over it, as the gloo engine's worker side does."""

    def init_weight_transfer(self, init_info: Any) -> None:
        from exgrpo.transport.gloo import GlooInitInfo, _gloo_group, rendezvous

        info = GlooInitInfo(**init_info)
        store = rendezvous(
            info.host,
            info.port,
            rank=info.rank_offset,
            world_size=info.world_size,
            timeout_s=info.rendezvous_s,
        )
        self.group = _gloo_group(
            store, name=info.group_name, rank=info.rank_offset, world_size=info.world_size, timeout_s=60
        )
        self.calls.append("init")


class WorldSampler(FakeSampler):
    def __init__(self, gen_s: float = 0.0) -> None:
        import exgrpo.transport.gloo  # noqa: F401  (vLLM's import takes seconds; a real sampler has it loaded)

        super().__init__(gen_s)
        self.engine = WorldVLLM(gen_s)  # type: ignore[assignment]
        self.tp = 1


@pytest.mark.integration
def test_a_world_opens_while_the_sampler_runs_calls_longer_than_the_rendezvous(ray_cluster):
    """The rendezvous waits 2 s for every member (vLLM's store, its 300 s scaled down); the sampler has 5 s
    generate calls queued. `join_world` holds the engine once it is free, so the init arrives at once instead of
    after the next queued generate (which failed the world: the store gave up first)."""
    import ray
    import torch

    from exgrpo.runtime.env import remote_actor
    from exgrpo.transport.vllm_api import WeightPusher

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    gen_s = 5.0
    h = remote_actor(WorldSampler, name="world-fake-sampler", num_cpus=0.5, gen_s=gen_s)
    try:
        ray.get(h.ping.remote())
        queued = [h.generate.remote(requests=[]) for _ in range(3)]
        time.sleep(0.5)  # the first is in flight, two wait
        pusher = WeightPusher(
            module=torch.nn.Linear(2, 2), backend="gloo", host="127.0.0.1", timeout_s=60, rendezvous_s=2.0
        )
        t0 = time.perf_counter()
        pusher._rebuild({"s0": h})  # acknowledged after the call in flight, then opened at once
        opened_s = time.perf_counter() - t0
        assert pusher._engine is not None and opened_s < gen_s + 2, opened_s
        client = pusher._engine.client
        client.version = 1
        client.start_weight_update()  # the update's session takes over from the reservation
        client.finish_weight_update()
        results = ray.get(queued, timeout=60)
        assert [r.policy_version for r in results] == [0, 1, 1]  # nothing generated between join and start
        assert ray.get(h.calls.remote()) == ["init", "start", "finish:1"]
        print(f"world opened {opened_s:.2f} s after the push began, behind a {gen_s:.0f} s call")
    finally:
        ray.kill(h)
