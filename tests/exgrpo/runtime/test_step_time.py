"""The time estimate `--dry-run` prints for GPU runs (`exgrpo/runtime/step_time.py`): its arithmetic, the rates it
rests on (each recorded in docs/benchmarks.md), and docs/gpu.md's table of the recipes' figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exgrpo import run
from exgrpo.core.config_files import load_config
from exgrpo.runtime.longest_call import ASSUMED_GPU_TOKENS_PER_S
from exgrpo.runtime.memory_plan import KNOWN
from exgrpo.runtime.step_time import (
    RECORDED_LEARNER_PARAMS,
    RECORDED_LEARNER_TOKENS_PER_S,
    estimate,
    model_params,
    step_time,
)

ROOT = Path(__file__).resolve().parents[3]
GPU_CONFIGS = ("gpu-smoke", "qwen2.5-math-1.5b", "qwen2.5-math-7b", "llama3.1-8b")


def test_the_1_5b_recipe_at_the_recorded_rates():
    cfg = load_config("qwen2.5-math-1.5b")
    e = estimate(cfg, model_params(cfg))
    sequences = 128 * 8
    assert e.generation_s == pytest.approx(sequences * 8192 / (4 * 790.0))  # 4 samplers at 790 tokens/s each
    assert e.update_s == pytest.approx(sequences * (1024 + 8192) / (4 * 18_774.0))  # 4 ranks, the 1.5B shape
    assert e.step_s == e.generation_s and e.run_s == pytest.approx(
        500 * e.generation_s
    )  # overlapped: the larger
    text = step_time(cfg)
    assert (
        "about 44.2 min a step, 369 h (15.4 days) for trainer.steps=500 (2,950 GPU-hours on 8 GPUs)" in text
    )
    for rests_on in (
        "790 tokens/s",
        "18,774 tokens/s",
        "docs/benchmarks.md",
        "no GPU has run this",
        "not counted",
    ):
        assert rests_on in text


def test_the_update_scales_with_the_parameter_count_and_a_synchronous_step_adds_the_parts():
    cfg = load_config("qwen2.5-math-7b", ["async.max_staleness=0"])
    e = estimate(cfg, KNOWN["qwen2.5-math-7b"].params)
    rate = RECORDED_LEARNER_TOKENS_PER_S * RECORDED_LEARNER_PARAMS / KNOWN["qwen2.5-math-7b"].params
    assert e.update_s == pytest.approx(128 * 8 * (1024 + 8192) / (4 * rate))
    assert e.step_s == pytest.approx(e.generation_s + e.update_s)
    assert "the sum of the two" in step_time(cfg)


def test_what_has_no_recorded_rate_is_not_estimated():
    assert step_time(load_config("tiny-cpu")) == ""  # a CPU run: no line at all
    cpu_samplers = step_time(
        load_config(
            "qwen2.5-math-1.5b",
            ["samplers.num_gpus=0", "samplers.engine=hf", "async.weight_sync=object_store"],
        )
    )
    assert (
        "generation: not estimated (CPU samplers" in cpu_samplers and "per step not estimated" in cpu_samplers
    )
    unknown = step_time(load_config("qwen2.5-math-1.5b", ["model.path=/nowhere/my-model"]))
    assert "parameter count is unknown" in unknown and "per step not estimated" in unknown


def test_the_rates_are_the_ones_recorded_in_the_docs():
    bench = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    assert (
        f"**{ASSUMED_GPU_TOKENS_PER_S:.0f} tokens/s**" in bench
    )  # HF generate, "GPU learner and HF generate"
    assert (
        f"| 2 | 6.98 (4 timed) | {RECORDED_LEARNER_TOKENS_PER_S:,.0f} |" in bench
    )  # "GPU device check", ZeRO-2
    assert abs(RECORDED_LEARNER_PARAMS - 1.544e9) < 0.001e9  # "Learner, 1.544 B parameters"


def test_docs_gpu_md_lists_what_the_dry_run_prints_for_each_gpu_config():
    page = (ROOT / "docs" / "gpu.md").read_text()
    assert step_time(load_config("gpu-smoke")) in page  # the smoke config's estimate, as printed (step 3)
    for name in GPU_CONFIGS:
        cfg = load_config(name)
        e = estimate(cfg, model_params(cfg))
        assert e.step_s is not None and e.run_s is not None
        head = step_time(cfg).splitlines()[0]
        per_step, whole = re.search(r"about (.+?) a step, (.+?) for trainer\.steps=(\d+)", head).group(1, 2)
        row = next(line for line in page.splitlines() if line.startswith(f"| `{name}` "))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == f"{e.generation_s:.0f} s" and cells[2] == f"{e.update_s:.0f} s", row
        assert (
            cells[3] == f"about {per_step}" and cells[4] == f"{whole} for trainer.steps={cfg.trainer.steps}"
        ), row


def test_the_dry_run_prints_the_estimate_before_its_other_checks(capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run.main(["--config", "configs/gpu-smoke.yaml", "--dry-run"])  # exit 2 here: no data file or no GPUs
    out = capsys.readouterr().out
    assert "time estimate (the only GPU rates recorded" in out and "about 83 s a step" in out
    assert out.index("longest sampler call") < out.index("time estimate") < out.index("memory plan")
