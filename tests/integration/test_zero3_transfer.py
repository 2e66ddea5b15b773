"""vLLM's weight-transfer API under ZeRO-3: both learner ranks gather each layer for the broadcast.

A module of its own: its learner group takes the actor names the transports module's group holds.
"""

from __future__ import annotations

import time

import pytest
import ray
from test_transports import VLLM_REL, _assert_in_sync, _check_metrics, _pool, _start, _step

from exgrpo.core.config import LearnerConfig, LossConfig
from exgrpo.runtime.env import remote_actor
from exgrpo.transport.broadcast import VLLMTransport
from learners.group import LearnerGroup

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    from exgrpo.models.tiny import TinyModelSpec, build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("zero3") / "tiny", spec=TinyModelSpec())


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
