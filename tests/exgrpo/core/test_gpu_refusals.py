"""Settings that cannot work on GPUs are refused when the config loads (exgrpo/core/config_checks.py): each
message names the fix, and `python -m exgrpo.run` exits 2 before Ray starts (issue 41, item 5)."""

from __future__ import annotations

import pytest

from exgrpo import run
from exgrpo.core.config import ConfigError
from exgrpo.core.config_files import load_config

VLLM_GPU = ["samplers.engine=vllm", "learners.num_gpus=1"]


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(None, list(overrides))
    return str(err.value)


@pytest.mark.parametrize("num_gpus", ["0.5", "1.5"])
def test_collective_weights_need_a_whole_gpu_per_engine_rank(num_gpus):
    msg = refused(*VLLM_GPU, f"samplers.num_gpus={num_gpus}", "async.weight_sync=collective")
    assert f"async.weight_sync=collective with samplers.num_gpus={num_gpus}" in msg
    assert "NCCL refuses two ranks on one device" in msg
    assert "use samplers.num_gpus=1" in msg and "async.weight_sync=object_store" in msg  # the fixes
    load_config(None, [*VLLM_GPU, "samplers.num_gpus=1", "async.weight_sync=collective"])
    load_config(None, [*VLLM_GPU, "samplers.num_gpus=2", "async.weight_sync=collective"])


def test_engines_sharing_a_gpu_must_fit_it_together():
    msg = refused(*VLLM_GPU, "samplers.num_gpus=0.5")  # at the default gpu_memory_utilization 0.85
    assert "samplers.num_gpus=0.5 shares one GPU between vLLM engines" in msg
    assert "samplers.gpu_memory_utilization=0.85" in msg
    assert "set samplers.gpu_memory_utilization <= 0.45 (num_gpus x 0.9), or samplers.num_gpus=1" in msg
    assert "samplers.gpu_memory_utilization <= 0.3" in refused(*VLLM_GPU, "samplers.num_gpus=0.34")
    fixed = load_config(None, [*VLLM_GPU, "samplers.num_gpus=0.5", "samplers.gpu_memory_utilization=0.45"])
    assert fixed.samplers.num_gpus == 0.5  # object-store weights: a share of a GPU is fine
    # the named fix alone does not make the collective transport accept a share
    assert "NCCL" in refused(
        *VLLM_GPU,
        "samplers.num_gpus=0.5",
        "samplers.gpu_memory_utilization=0.45",
        "async.weight_sync=collective",
    )


def test_hf_samplers_are_refused_on_gpus():
    msg = refused("samplers.engine=hf", "samplers.num_gpus=1")
    assert "samplers.engine=hf with samplers.num_gpus=1" in msg and "never moves its model to the GPU" in msg
    assert "use samplers.engine=vllm on GPUs, or samplers.num_gpus=0" in msg
    load_config(
        None, ["samplers.engine=hf", "samplers.num_gpus=0", "learners.num_gpus=1"]
    )  # GPU learners only


def test_tensor_parallel_gpu_samplers_need_an_acknowledgement():
    msg = refused(*VLLM_GPU, "samplers.num_gpus=1", "samplers.tensor_parallel_size=2")
    assert "samplers.tensor_parallel_size=2 on GPUs is untested" in msg
    assert "use samplers.tensor_parallel_size=1" in msg and "samplers.allow_untested_tp=true" in msg
    ok = load_config(
        None,
        [
            *VLLM_GPU,
            "samplers.num_gpus=1",
            "samplers.tensor_parallel_size=2",
            "samplers.allow_untested_tp=true",
        ],
    )
    from exgrpo.runtime.preflight import untested

    assert "untested" in untested(ok) and untested(load_config(None, VLLM_GPU)) == ""
    # the CPU refusal stays, acknowledgement or not
    cpu = refused(
        "samplers.engine=vllm", "samplers.tensor_parallel_size=2", "samplers.allow_untested_tp=true"
    )
    assert "vLLM on CPU has no tensor parallelism here; use tensor_parallel_size=1" in cpu


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        (
            [
                "samplers.engine=vllm",
                "samplers.num_gpus=0.5",
                "async.weight_sync=collective",
                "learners.num_gpus=1",
            ],
            "use samplers.num_gpus=1",
        ),
        (["samplers.engine=hf", "samplers.num_gpus=1"], "samplers.engine=vllm"),
        (
            ["samplers.engine=vllm", "samplers.num_gpus=1", "samplers.tensor_parallel_size=2"],
            "samplers.allow_untested_tp=true",
        ),
    ],
)
def test_the_command_exits_2_before_ray_starts(overrides, fix, capsys, monkeypatch):
    import ray

    def no_ray(*args, **kwargs):
        raise AssertionError("ray.init was called")

    monkeypatch.setattr(ray, "init", no_ray)
    assert run.main(["--dry-run", *overrides]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: invalid config:") and fix in captured.err
    assert captured.out == ""  # nothing planned, nothing started
    assert run.main(overrides) == 2  # a real start too


@pytest.mark.parametrize("name", ["qwen2.5-math-7b", "qwen2.5-math-1.5b", "llama3.1-8b"])
def test_the_gpu_recipes_still_validate(name):
    cfg = load_config(f"configs/{name}.yaml")
    assert cfg.samplers.engine == "vllm" and cfg.samplers.num_gpus == 1
    assert cfg.async_.weight_sync == "collective" and cfg.samplers.tensor_parallel_size == 1
