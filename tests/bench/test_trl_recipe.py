"""`python -m bench.peers.bench_trl --recipe` (bench/peers/trl_recipe.py): TRL's settings and the scoring options
follow the recipe (fast), and the mode runs end to end on the tiny builtin model, printing and writing finite figures
(slow: a Ray run with a vLLM sampler, a TRL run and three evaluations, each in its own process: 2-7 minutes on the
shared 2-core machine)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
needs_trl = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="trl (the bench extra) is not installed"
)


@needs_trl
def test_trl_gets_the_recipes_settings(tmp_path: Path) -> None:
    from bench.peers.bench_trl import grpo_config
    from bench.peers.trl_recipe import TRL_OVERRIDES, lora_config, recipe_config

    cfg = recipe_config(None, [])
    args = grpo_config(cfg, out_dir=str(tmp_path), max_steps=30, **TRL_OVERRIDES)
    b, k = cfg.trainer.questions_per_step, cfg.trainer.rollouts_per_question
    assert (b, k, cfg.model.max_response_len, cfg.learners.lr) == (4, 8, 64, 1e-4)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == b * k
    assert args.steps_per_generation == args.gradient_accumulation_steps  # one generation per optimiser step
    assert (args.num_generations, args.max_completion_length, args.learning_rate) == (k, 64, 1e-4)
    assert (args.loss_type, args.scale_rewards, args.beta, args.num_iterations) == ("dr_grpo", "none", 0.0, 1)
    assert (args.temperature, args.top_p, args.top_k, args.repetition_penalty, args.min_p) == (
        1.0,
        1.0,
        0,
        1.0,
        None,
    )
    assert (args.adam_beta1, args.adam_beta2) == cfg.learners.betas
    assert (args.weight_decay, args.max_grad_norm) == (cfg.learners.weight_decay, cfg.learners.grad_clip)
    assert (args.epsilon, args.epsilon_high, args.entropy_coef) == (
        cfg.loss.clip_eps,
        None,
        cfg.loss.entropy_coef,
    )
    assert not (args.gradient_checkpointing or args.bf16 or args.use_vllm or args.mask_truncated_completions)
    assert (args.lr_scheduler_type, args.save_strategy, args.report_to) == ("constant", "no", [])
    lora = lora_config(cfg)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (16, 32, 0.0)
    assert lora.target_modules == set(cfg.learners.lora_target_modules)


def test_the_evaluation_is_the_runs_own(tmp_path: Path) -> None:
    """`eval_argv` gives `python -m exgrpo.evaluate` every option `--like-run` reads from a run's config."""
    from bench.peers.trl_recipe import eval_argv, recipe_config
    from exgrpo.evaluation.like_run import like_run

    cfg = recipe_config(None, [])
    (tmp_path / "config.yaml").write_text(cfg.to_yaml())
    argv = eval_argv(cfg, "MODEL", tmp_path / "out.json", "hf")
    given = {argv[i].removeprefix("--").replace("-", "_"): argv[i + 1] for i in range(0, len(argv) - 1, 2)}
    expected = {k: str(v) for k, v in like_run(tmp_path).items() if k != "model"}
    assert {k: given[k] for k in expected} == expected
    assert (given["data"], given["num"], given["n"]) == ("builtin:sum-1digit", "27", "8")


@pytest.mark.slow
@pytest.mark.timeout(1800)
@needs_trl
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="the recipe's sampler is vLLM")
def test_recipe_mode_runs_on_the_tiny_model(tmp_path: Path) -> None:
    tiny = ["model.max_prompt_len=160", "model.max_response_len=8", "trainer.questions_per_step=2"]
    tiny += ["trainer.rollouts_per_question=2", "learners.micro_batch_size=4", "data.num_eval=3"]
    tiny += ["trainer.eval_samples=2"]
    out = tmp_path / "recipe.json"
    argv = ["--recipe", "--steps", "2", "--model", "builtin:tiny", "--out", str(out)]
    argv += [a for kv in tiny for a in ("--set", kv)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.peers.bench_trl", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1700,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for text in (
        "prompt ids equal on both sides: all 173",
        "project: ",
        "trl    : ",
        "project/TRL: step-time ratio",
    ):
        assert text in done.stdout, done.stdout[-3000:]
    res = json.loads(out.read_text())
    for side in ("project", "trl"):
        fig = res[side]
        assert len(fig["intervals_s"]) == 2
        for key in ("step_s", "generation_s", "update_s", "wall_s"):
            assert math.isfinite(fig[key]) and fig[key] >= 0, (side, key, fig[key])
        assert fig["wall_s"] > fig["step_s"]  # startup included
        assert (Path(fig["final"]) / "config.json").is_file()
    for name in ("base", "project", "trl"):
        score = res["heldout"][name]
        assert (score["questions"], score["n"]) == (3, 2)
        assert 0 <= score["avg_at_n"] <= 1 and math.isfinite(score["se"])
    assert all(math.isfinite(r) and r > 0 for r in res["ratios"].values())
    assert res["trl"]["threads"] == 2 and res["trl"]["prompt_ids_checked"]["project_sampled"] >= 2
