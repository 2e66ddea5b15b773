"""The plan against the cluster's resources, checked before anything waits (no Ray cluster needed)."""

from __future__ import annotations

import pytest

from exgrpo.core.config import ConfigError
from exgrpo.core.config_files import load_config
from exgrpo.runtime.resources import (
    ResourceError,
    check_cluster,
    check_fits,
    model_weight_bytes,
    plan_resources,
    samplers_that_fit,
    shortfalls,
)

GIB = 1024**3


def cfg_of(*overrides):
    return load_config(None, list(overrides))


def test_plan_counts_samplers_and_learner_bundles():
    cfg = cfg_of(
        "samplers.num=2",
        "samplers.num_cpus=1",
        "learners.num=1",
        "learners.num_cpus=1",
        "replay.num_shards=4",
    )
    plan = plan_resources(cfg)
    assert (plan.cpus, plan.gpus) == (3, 0)  # shards and controller take 0 CPU
    assert plan.breakdown("num_cpus") == "2 samplers x 1 + 1 learner x 1"


def test_too_few_cpus_names_the_need_and_the_fixes():
    cfg = cfg_of("samplers.num=2", "samplers.num_cpus=1", "learners.num=1", "learners.num_cpus=1")
    with pytest.raises(ResourceError) as err:
        check_fits(cfg, plan_resources(cfg), {"CPU": 2.0})
    text = str(err.value)
    assert (
        "the plan needs 3 CPUs (2 samplers x 1 + 1 learner x 1; replay shards and the controller take 0) "
        "but the cluster has 2" in text
    )
    assert "samplers.num_cpus=0.5" in text and "samplers.num=1" in text and "--num-cpus=3" in text
    assert isinstance(err.value, ConfigError)
    # the suggested fix fits
    fixed = cfg_of("samplers.num=2", "samplers.num_cpus=0.5", "learners.num=1", "learners.num_cpus=1")
    check_fits(fixed, plan_resources(fixed), {"CPU": 2.0})


def test_gpus_on_a_cpu_cluster():
    cfg = cfg_of("samplers.engine=vllm", "samplers.num_gpus=1", "learners.num_gpus=1", "samplers.num=2")
    problems = shortfalls(cfg, plan_resources(cfg), {"CPU": 64.0})
    assert len(problems) == 1
    assert "needs 3 GPUs (2 samplers x 1 + 1 learner x 1) but the cluster has 0" in problems[0]
    assert "samplers.num_gpus=0 learners.num_gpus=0" in problems[0]
    problems = shortfalls(cfg, plan_resources(cfg), {"CPU": 64.0, "GPU": 2.0})
    assert "samplers.num=1" in problems[0]


def test_gpu_fixes_never_suggest_a_share_of_a_gpu():
    """A fractional samplers.num_gpus puts two engines (and, with the collective transport, two NCCL ranks) on
    one device, which the config refuses: the fixes name whole GPUs only."""
    cfg = cfg_of("samplers.engine=vllm", "samplers.num_gpus=1", "learners.num_gpus=1", "samplers.num=4")
    problems = shortfalls(cfg, plan_resources(cfg), {"CPU": 64.0, "GPU": 3.0})
    assert len(problems) == 1 and "samplers.num=2" in problems[0]
    assert "samplers.num_gpus=0." not in problems[0] and "gpu_memory_utilization" not in problems[0]
    two = cfg_of("samplers.engine=vllm", "samplers.num_gpus=2", "learners.num_gpus=1", "samplers.num=2")
    problems = shortfalls(two, plan_resources(two), {"CPU": 64.0, "GPU": 3.0})
    assert "samplers.num_gpus=1" in problems[0]  # a whole GPU is still a valid suggestion


def test_a_bundle_larger_than_any_node():
    cfg = cfg_of("samplers.num=1", "samplers.num_cpus=1", "learners.num=1", "learners.num_cpus=3")
    nodes = [{"CPU": 2.0}, {"CPU": 2.0}]
    problems = shortfalls(cfg, plan_resources(cfg), {"CPU": 4.0}, nodes)
    assert problems and "learner bundle 0 (3 CPU, 0 GPU) fits on no node" in problems[0]
    assert shortfalls(cfg, plan_resources(cfg), {"CPU": 4.0}, [{"CPU": 4.0}]) == []


def test_memory_and_object_store_estimates(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "config.json").write_text("{}")
    assert model_weight_bytes(tmp_path) == 1000 and model_weight_bytes(None) == 0
    cfg = cfg_of("samplers.num=2", "learners.num=1", "async.max_staleness=1")
    plan = plan_resources(cfg, model_bytes=10 * GIB)
    assert plan.memory_bytes == 2 * 10 * GIB + 4 * 10 * GIB and plan.object_store_bytes == 20 * GIB
    problems = shortfalls(cfg, plan, {"CPU": 8.0, "memory": 30.0 * GIB, "object_store_memory": 5.0 * GIB})
    assert any("60.0 GiB of memory" in p for p in problems)
    assert any("object store of" in p or "object store holds" in p for p in problems)
    assert (
        shortfalls(
            cfg,
            plan_resources(cfg, model_bytes=1000),
            {"CPU": 8.0, "memory": 30.0 * GIB, "object_store_memory": 5.0 * GIB},
        )
        == []
    )


def test_packaged_cpu_configs_fit_a_two_core_cluster():
    for name in ("default", "tiny-cpu", "smollm2-135m-cpu"):
        cfg = load_config(name)
        assert shortfalls(cfg, plan_resources(cfg), {"CPU": 2.0}, [{"CPU": 2.0}]) == [], name


class FakeRay:
    def __init__(self, total, free_sequence):
        self.total, self.free = total, list(free_sequence)

    def cluster_resources(self):
        return dict(self.total)

    def available_resources(self):
        return dict(self.free.pop(0) if len(self.free) > 1 else self.free[0])

    def nodes(self):
        return [{"Alive": True, "Resources": dict(self.total)}]


def test_check_cluster_fails_at_once_or_waits_for_held_resources(monkeypatch):
    import ray

    cfg = cfg_of("samplers.num=2", "samplers.num_cpus=1", "learners.num=1", "learners.num_cpus=1")
    fake = FakeRay({"CPU": 2.0}, [{"CPU": 2.0}])
    for name in ("cluster_resources", "available_resources", "nodes"):
        monkeypatch.setattr(ray, name, getattr(fake, name))
    with pytest.raises(ResourceError, match="needs 3 CPUs"):
        check_cluster(cfg, wait_s=60)  # impossible: no waiting
    fake.total = {"CPU": 4.0}
    fake.free = [{"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 4.0}]  # a previous run's actors are released
    assert check_cluster(cfg, wait_s=5).cpus == 3
    fake.free = [{"CPU": 1.0}]
    with pytest.raises(ResourceError, match=r"only 1 are free now .*ray status"):
        check_cluster(cfg, wait_s=0.3)


def test_samplers_that_fit_counts_free_cpus_and_gpus():
    # 2 samplers running; 1.5 CPUs free at 0.5 each -> 3 more
    assert samplers_that_fit(current=2, cpus=0.5, gpus=0.0, free={"CPU": 1.5}) == 5
    assert samplers_that_fit(current=2, cpus=1.0, gpus=0.0, free={"CPU": 0.0}) == 2  # nothing free: no more
    assert samplers_that_fit(current=1, cpus=1.0, gpus=1.0, free={"CPU": 8.0, "GPU": 1.0}) == 2  # GPU-bound
    assert samplers_that_fit(current=1, cpus=1.0, gpus=1.0, free={"CPU": 8.0}) == 1  # no GPU on the cluster
    assert samplers_that_fit(current=3, cpus=0.0, gpus=0.0, free={}) > 10**6  # reserves nothing: always fits


@pytest.mark.integration
def test_scale_refuses_a_scale_up_the_cluster_cannot_place(ray_cluster):
    """`python -m exgrpo.scale` against a job's controller on a 4-CPU cluster: 3 more 1-CPU samplers fit, 50 do
    not (refused at once, exit 2, nothing changed); scaling down is always accepted."""
    import subprocess
    import sys

    import ray

    from exgrpo.core.names import CONTROLLER
    from exgrpo.runtime.controller import Controller
    from exgrpo.runtime.env import remote_actor

    controller = remote_actor(Controller, name=CONTROLLER, num_cpus=0, samplers=1, sampler_cpus=1.0)
    try:
        address = ray.get_runtime_context().gcs_address

        def scale(n: int) -> subprocess.CompletedProcess:
            cmd = [sys.executable, "-m", "exgrpo.scale", "--samplers", str(n), "--address", address]
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

        free = int(ray.available_resources().get("CPU", 0))
        refused = scale(50)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert (
            f"at most {1 + free} samplers fit (python -m exgrpo.scale --job {address}/" in refused.stderr
            and f" --samplers {1 + free})" in refused.stderr
        )
        assert ray.get(controller.desired_samplers.remote()) == 1
        ok = scale(1 + free)
        assert ok.returncode == 0 and f"{1 + free} samplers" in ok.stdout, ok.stderr[-2000:]
        assert scale(1).returncode == 0 and ray.get(controller.desired_samplers.remote()) == 1
    finally:
        ray.kill(controller)
