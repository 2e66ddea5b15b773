"""vLLM's weight-transfer API under ZeRO-3: both learner ranks gather each layer for the broadcast.

A module of its own: its learner group takes the actor names the transports module's group holds. The slow tests
give the learner group a short collective timeout (a gloo stand-in for NCCL's watchdog, which aborts a rank
whose collective waits past it) and a sampler call longer than it while a new weight world opens.
"""

from __future__ import annotations

import time

import pytest
import ray
from test_transports import (
    VLLM_REL,
    _assert_in_sync,
    _batch,
    _check_metrics,
    _pool,
    _request,
    _start,
    _step,
)

from exgrpo.core import faults
from exgrpo.core.config import LearnerConfig, LossConfig
from exgrpo.runtime.env import remote_actor
from exgrpo.transport.broadcast import VLLMTransport
from learners.group import LearnerGroup

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    from exgrpo.models.tiny import TinyModelSpec, build_tiny_model

    # MLP weights of 256 x 512 = 131,072 elements: over ZeRO-3's persistence threshold (1e5), so they are
    # partitioned and the push gathers them (smaller parameters stay whole on every rank: no collective)
    spec = TinyModelSpec(hidden_size=256, num_heads=8, num_kv_heads=2, intermediate_size=512)
    return build_tiny_model(tmp_path_factory.mktemp("zero3") / "tiny", spec=spec)


def test_vllm_api_under_zero3_gathers_on_both_learner_ranks(ray_cluster, model_dir):
    pytest.importorskip("vllm")
    group = LearnerGroup(
        num=2,
        make_actor=remote_actor,
        model_path=str(model_dir),
        learner_cfg=LearnerConfig(num=2, zero_stage=3, lr=1e-2, micro_batch_size=8),
        loss_cfg=LossConfig(),
        max_response_len=4,
    )
    pool = _pool(model_dir, "z3", engine="vllm")
    transport = VLLMTransport(learners=group, samplers=pool)
    try:
        _start(pool, transport, 1)
        v = _step(group)
        _check_metrics(transport.broadcast(version=v))
        assert transport.fallbacks == 0
        sums = group.checksums()
        assert sums[0] == sums[1]
        _assert_in_sync(pool, group, v, rel=VLLM_REL)
        # a sampler dies (the pool has not noticed): rank 0's send fails, yet it finishes the round's
        # gathers, so rank 1 (which gathers every layer regardless) is not left waiting in a collective
        ray.kill(pool.members()["exgrpo-sampler-0"], no_restart=True)
        v = _step(group)
        t0 = time.perf_counter()
        transport.broadcast(version=v)
        assert transport.fallbacks == 1 and time.perf_counter() - t0 < 60
        v = _step(group)  # both ranks still train together
        sums = group.checksums()
        assert sums[0] == sums[1] and group.version() == v
    finally:
        pool.shutdown()
        group.shutdown()


WATCHDOG_S = 20.0  # the learner group's collective timeout in these tests
CALL_S = 35  # a sampler call that lasts longer


def _group(model_dir, zero_stage: int) -> LearnerGroup:
    return LearnerGroup(
        num=2,
        make_actor=remote_actor,
        model_path=str(model_dir),
        learner_cfg=LearnerConfig(
            num=2, zero_stage=zero_stage, lr=1e-2, micro_batch_size=8, collective_timeout_s=WATCHDOG_S
        ),
        loss_cfg=LossConfig(),
        max_response_len=4,
    )


def _busy_new_world(pool, transport, group, tmp_path, monkeypatch, prefix: str) -> None:
    """One sampler in a world, then a second joins while the first runs a CALL_S generate call (its second,
    slowed by the fault point): the next push opens a new world behind that call."""
    monkeypatch.setenv(faults.FAULTS_VAR, f"{prefix}-0:sampler.generate@2!sleep{CALL_S}")
    monkeypatch.setenv(faults.FAULTS_DIR_VAR, str(tmp_path / "fired"))
    _start(pool, transport, 1)
    monkeypatch.delenv(faults.FAULTS_VAR)
    transport.broadcast(version=_step(group))
    pool.submit(requests=[_request(0)])
    while not pool.poll(timeout_s=5):
        pass
    pool.scale(num=2)
    pool.wait_started(timeout_s=300)
    pool.submit(requests=[_request(1), _request(2)])  # one each: the first sampler's sleeps CALL_S
    time.sleep(2)


@pytest.mark.slow
def test_a_zero3_push_outlives_a_sampler_call_longer_than_the_learner_watchdog(
    ray_cluster, model_dir, tmp_path, monkeypatch
):
    """Both ranks push under ZeRO-3 (rank 1 gathers every layer with rank 0). The samplers acknowledge the new
    world before the ranks are asked to push, so rank 1 never waits in a gather while rank 0 waits for the
    sampler call to end (it did: past the collective timeout, gloo aborted it, as NCCL's watchdog would)."""
    pytest.importorskip("vllm")
    group = _group(model_dir, 3)
    pool = _pool(model_dir, "z3w", engine="vllm")
    transport = VLLMTransport(learners=group, samplers=pool, timeout_s=120)
    try:
        _busy_new_world(pool, transport, group, tmp_path, monkeypatch, "z3w")
        v = _step(group)
        t0 = time.perf_counter()
        transport.broadcast(version=v)
        took = time.perf_counter() - t0
        assert transport.fallbacks == 0 and took > WATCHDOG_S, took  # it waited out the call, and pushed
        _assert_in_sync(pool, group, v, rel=VLLM_REL)
        v = _step(group)  # the learner group still trains together
        sums = group.checksums()
        assert sums[0] == sums[1] and group.version() == v
        print(
            f"ZeRO-3 push behind a {CALL_S} s sampler call took {took:.1f} s (collective timeout {WATCHDOG_S:g} s)"
        )
    finally:
        pool.shutdown()
        group.shutdown()


@pytest.mark.slow
def test_a_zero2_overlapped_update_outlives_a_push_behind_a_long_sampler_call(
    ray_cluster, model_dir, tmp_path, monkeypatch
):
    """ZeRO-2 with `async.overlap_update`: update t+1 is queued on every rank right after the push of t (rank 0
    only). `prepare` opens the new world before it queues the push, so rank 1's first all-reduce of t+1 waits
    for a short push, not for the sampler call behind it."""
    pytest.importorskip("vllm")
    group = _group(model_dir, 2)
    pool = _pool(model_dir, "z2w", engine="vllm")
    transport = VLLMTransport(learners=group, samplers=pool, timeout_s=120)
    try:
        _busy_new_world(pool, transport, group, tmp_path, monkeypatch, "z2w")
        v = group.version()
        first = group.start_update(batch=_batch(v))  # update v -> v + 1
        transport.prepare(version=v + 1)  # the new world acknowledged, then rank 0's push queued
        second = group.start_update(batch=_batch(v + 1))  # queued at once: the driver's overlap
        first.result()
        transport.broadcast(version=v + 1)
        second.result()
        assert transport.fallbacks == 0 and group.version() == v + 2
        sums = group.checksums()
        assert sums[0] == sums[1]
        transport.broadcast(version=v + 2)
        _assert_in_sync(pool, group, v + 2, rel=VLLM_REL)
    finally:
        pool.shutdown()
        group.shutdown()
