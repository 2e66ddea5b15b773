"""A learner set up in a process whose earlier torch.distributed world was destroyed by another library (an
in-process vLLM engine's shutdown destroys it) trains, whether it starts the new world itself or finds one the
other library started: DeepSpeed's cached groups of the old world are dropped first
(`learners.modeling.forget_deepspeed_groups`)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.expanduser("~/.cache/exgrpo/torch_extensions"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tiny_qwen2 import save_tiny_qwen2, tiny_groups  # noqa: E402

from exgrpo.core import metric_names as M  # noqa: E402
from exgrpo.core.config import LearnerConfig, LossConfig  # noqa: E402
from exgrpo.core.records import TrainBatch  # noqa: E402
from exgrpo.transport.ranks import free_port  # noqa: E402
from learners.learner import Learner  # noqa: E402
from learners.modeling import in_current_world  # noqa: E402

torch.set_num_threads(1)


def _learner(path: str) -> Learner:
    learner = Learner(
        model_path=path,
        learner=LearnerConfig(lr=1e-3, micro_batch_size=3, zero_stage=0),
        loss=LossConfig(),
        max_response_len=8,
    )
    learner.setup()
    return learner


@pytest.mark.parametrize("restarted_by", ["learner", "other library"])
def test_a_learner_after_another_library_destroyed_the_world_trains(tmp_path_factory, restarted_by):
    path = save_tiny_qwen2(tmp_path_factory, seed=1, name="tiny-qwen2-world")
    first = _learner(path)
    first.update(TrainBatch(groups=tiny_groups(0, stale=False), version=0, clip=True))
    dist.destroy_process_group()  # what vLLM's shutdown does, behind DeepSpeed's back
    if restarted_by == "other library":  # what the next in-process vLLM engine's start does
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    second = _learner(path)
    metrics = second.update(TrainBatch(groups=tiny_groups(0, stale=False), version=0, clip=True)).metrics
    assert dist.is_initialized() and torch.isfinite(torch.tensor(metrics[M.LOSS]))


def _start_world() -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)


def test_a_group_of_a_destroyed_world_is_not_in_the_next_one():
    if dist.is_initialized():
        dist.destroy_process_group()
    _start_world()
    old = dist.new_group(ranks=[0])
    assert in_current_world(old)
    dist.destroy_process_group()
    _start_world()
    assert not in_current_world(old)
    assert in_current_world(dist.new_group(ranks=[0]))
    dist.destroy_process_group()
