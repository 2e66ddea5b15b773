"""The memory plan's verdict says what a learner rank needs against what it may use, and offers LoRA where LoRA
would make it fit (exgrpo/runtime/memory_plan.py, `verdict`, `_lora_knob`)."""

from __future__ import annotations

import re

from exgrpo.core.config_files import load_config
from exgrpo.runtime.memory_plan import GIB, KNOWN, plan, render

QWEN_7B = KNOWN["qwen2.5-math-7b"]
RECIPE = "configs/qwen2.5-math-7b.yaml"
ONE_RANK = ["learners.num=1", "learners.lora_rank=0", "loss.kl_coef=0"]


def verdict_and_fixes(*overrides: str) -> tuple[str, list[str]]:
    p = plan(load_config(RECIPE, [*ONE_RANK, *overrides]), QWEN_7B, device_gib=80)
    lines = render(p, title="t").splitlines()
    return next(x for x in lines if x.startswith("  plan: ")), [x for x in lines if x.startswith("  fix: ")]


def test_the_verdict_names_the_need_and_the_limit():
    line, _ = verdict_and_fixes("learners.zero_stage=3")
    need = re.fullmatch(
        r"  plan: DOES NOT FIT: a learner rank needs ([\d.]+) GiB; it may use 72\.0 GiB \(90% of the 80 GiB device\)",
        line,
    )
    assert need and float(need.group(1)) > 72.0, line
    line, fixes = verdict_and_fixes("learners.zero_stage=2", "learners.lora_rank=16")
    assert re.fullmatch(r"  plan: fits: a learner rank needs [\d.]+ GiB; it may use 72\.0 GiB .*", line), line
    assert fixes == []


def test_lora_is_offered_with_what_it_needs_and_its_suggestion_fits():
    _, fixes = verdict_and_fixes("learners.zero_stage=3")  # LoRA needs ZeRO <= 2: the fix says so
    lora = [f for f in fixes if "lora_rank" in f]
    assert len(lora) == 1 and lora[0].startswith(
        "  fix: set learners.lora_rank=16 learners.zero_stage=2 (LoRA:"
    )
    _, fixes = verdict_and_fixes("learners.zero_stage=1", "learners.gradient_checkpointing=off")
    lora = next(f for f in fixes if "lora_rank" in f)
    settings = lora.removeprefix("  fix: set ").split(" (")[0].split()
    assert settings == ["learners.lora_rank=16", "learners.gradient_checkpointing=on"]
    fixed = plan(load_config(RECIPE, [*ONE_RANK, "learners.zero_stage=1", *settings]), QWEN_7B, device_gib=80)
    assert fixed.fits and f"needs {fixed.learner_peak / GIB:.1f} GiB" in lora


def test_lora_is_not_offered_where_it_would_not_fit_nor_to_a_lora_run():
    for overrides, gib in (
        (["learners.zero_stage=2"], 16),
        (["learners.zero_stage=2", "learners.lora_rank=8"], 24),
    ):
        p = plan(load_config(RECIPE, [*ONE_RANK, *overrides]), QWEN_7B, device_gib=gib)
        assert not p.fits and p.knobs and not any("lora_rank" in k for k in p.knobs), p.knobs
