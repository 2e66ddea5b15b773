"""The TP rank arithmetic of vLLM's weight-transfer world, the TP config rules and the TP resource plan (CPU).

Tensor parallelism itself needs GPUs and is not run here; these tests check the arithmetic and the plan only.
"""

from __future__ import annotations

import pytest

from exgrpo.core.config import ConfigError, from_dict
from exgrpo.runtime.resources import placement_plan, plan_resources, sampler_bundles
from exgrpo.transport.ranks import transfer_ranks


@pytest.mark.parametrize(
    ("sizes", "world", "offsets"),
    [
        ([], 1, []),
        ([1], 2, [1]),
        ([1, 1, 1], 4, [1, 2, 3]),  # TP=1: the old 1 + number of samplers, offsets 1 + i
        ([2, 2], 5, [1, 3]),
        ([4, 1, 2], 8, [1, 5, 6]),  # mixed sizes
        ([1, 2, 4], 8, [1, 2, 4]),  # the same members reordered: same world, other offsets
        ([8], 9, [1]),
    ],
)
def test_world_size_and_rank_offsets(sizes, world, offsets):
    assert transfer_ranks(sizes) == (world, offsets)


@pytest.mark.parametrize("sizes", [[4, 1, 2], [2, 2, 2, 1], [1] * 5, [3, 8, 1, 1, 2]])
def test_every_worker_gets_a_distinct_rank_after_the_sender(sizes):
    world, offsets = transfer_ranks(sizes)
    ranks = [off + t for off, tp in zip(offsets, sizes, strict=True) for t in range(tp)]
    assert sorted(ranks) == list(range(1, world))  # 0 is learner rank 0, no gap, no overlap


def test_a_replaced_member_shifts_the_later_offsets():
    # sampler 1 (tp 4) replaced by a tp-2 one appended at the end: the world is rebuilt from the new order
    before = transfer_ranks([2, 4, 2])
    after = transfer_ranks([2, 2, 2])
    assert before == (9, [1, 3, 7]) and after == (7, [1, 3, 5])


@pytest.mark.parametrize("bad", [[0], [2, -1], [1.5]])
def test_invalid_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="tensor-parallel sizes"):
        transfer_ranks(bad)


def _cfg(**samplers):
    return from_dict({"samplers": samplers})


def test_tp_needs_vllm_and_gpus():
    with pytest.raises(ConfigError, match="needs samplers.engine=vllm"):
        _cfg(tensor_parallel_size=2, engine="hf", num_gpus=1.0)
    with pytest.raises(ConfigError, match="vLLM on CPU has no tensor parallelism"):
        _cfg(tensor_parallel_size=2, engine="vllm", num_gpus=0.0)
    with pytest.raises(ConfigError, match="0 < samplers.num_gpus <= 1"):
        _cfg(tensor_parallel_size=2, engine="vllm", num_gpus=2.0)
    _cfg(tensor_parallel_size=2, engine="vllm", num_gpus=1.0, allow_untested_tp=True)  # valid, acknowledged


def test_plan_counts_tp_times_gpus_per_sampler():
    cfg = _cfg(
        num=3,
        tensor_parallel_size=4,
        engine="vllm",
        num_gpus=0.5,
        allow_untested_tp=True,
        gpu_memory_utilization=0.45,
    )
    plan = plan_resources(cfg)
    sampler = next(d for d in plan.demands if d.role == "sampler")
    assert (sampler.count, sampler.num_gpus) == (3, 2.0)
    assert "placement group of 4 x 0.5 GPU" in placement_plan(cfg)


def test_sampler_bundles():
    assert sampler_bundles(num_cpus=1.0, num_gpus=1.0, tensor_parallel_size=3) == [
        {"GPU": 1.0, "CPU": 1.0},
        {"GPU": 1.0},
        {"GPU": 1.0},
    ]
    assert sampler_bundles(num_cpus=0.0, num_gpus=0.5, tensor_parallel_size=2) == [{"GPU": 0.5}, {"GPU": 0.5}]


class _Probe:
    """Stands in for a sampler: reports the placement group it runs in (no vLLM, no TP run)."""

    def __init__(self, **_: object) -> None:
        pass

    def group(self) -> list[dict[str, float]]:
        import ray

        pg = ray.util.get_current_placement_group()
        return [] if pg is None else list(pg.bundle_specs)


def test_a_tp_sampler_is_placed_in_a_group_of_tp_gpu_bundles_and_released(tmp_path):
    """On a local cluster with 4 declared (fake) GPUs: placement only; nothing runs on a GPU."""
    import os
    from pathlib import Path

    import ray

    from exgrpo.runtime.parts import place_sampler

    here = Path(__file__).resolve()
    path = os.pathsep.join([str(here.parent), str(here.parents[3]), os.environ.get("PYTHONPATH", "")])
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=4,
        include_dashboard=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},  # the workers import this module's probe
    )
    try:
        handle, group = place_sampler(
            _Probe, name="tp-probe", num_cpus=1.0, num_gpus=1.0, tensor_parallel_size=3
        )
        assert ray.get(handle.group.remote(), timeout=60) == [
            {"GPU": 1.0, "CPU": 1.0},
            {"GPU": 1.0},
            {"GPU": 1.0},
        ]
        assert ray.available_resources().get("GPU", 0) == pytest.approx(1.0)  # 3 of 4 held by the group
        ray.kill(handle)
        ray.util.remove_placement_group(group)
        plain, none = place_sampler(_Probe, name="tp1-probe", num_cpus=0.5, num_gpus=0.0)
        assert none is None and ray.get(plain.group.remote(), timeout=60) == []
    finally:
        ray.shutdown()
