"""`python -m bench.peers.bench_trl --recipe`: TRL's GRPOTrainer and the project on the SmolLM2 recipe's work
(configs/smollm2-135m-cpu.yaml, 30 steps each by default), both scored by the project's evaluator; the figures go
to bench/out/trl-recipe.json. What both sides share (`TRL_OVERRIDES`: the TRL defaults that differ) and what
stays different: docs/benchmarks.md, "Against TRL".
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import OUT_DIR, ROOT, STEP_SPLIT, in_child, write_json
from exgrpo.core.config import Config
from exgrpo.core.config_files import load_config

RECIPE = ROOT / "configs" / "smollm2-135m-cpu.yaml"
TRL_THREADS = 2
# TRL 1.16 / transformers defaults that differ from the project, overridden (the rest follow from the config in
# `bench_trl.grpo_config`: lr 1e-6 -> learners.lr, max_completion_length 512 -> T, num_generations 8 -> K, weight
# decay 0.0 -> 0.01, lr_scheduler "linear" -> "constant", loss_type "dapo" -> "dr_grpo", scale_rewards "group" ->
# "none", entropy_coef 0 -> loss.entropy_coef, seed 42 -> trainer.seed, bf16 None (= True) -> False, logging_steps
# 10 -> 1, save_strategy "steps" -> "no", report_to -> "none", disable_dropout False -> True)
TRL_OVERRIDES: dict[str, Any] = {
    "gradient_checkpointing": False,  # TRL: True; the project: learners.gradient_checkpointing=auto = off on CPU
    "optim": "adamw_torch",  # transformers: adamw_torch_fused; the project: torch.optim.AdamW (GuardedAdamW)
    "adam_epsilon": 1e-8,  # torch AdamW's default eps, which the project keeps
    "mask_truncated_completions": False,  # the project trains on truncated responses too
    "repetition_penalty": 1.0,  # none in the project's samplers
    "min_p": None,  # none in the project's samplers
    "use_vllm": False,  # HF generate in the trainer's process (the project's vLLM sampler is its own)
    "epsilon_high": None,  # symmetric clip range loss.clip_eps, as the project
    "top_entropy_quantile": 1.0,  # every token in the loss
    "importance_sampling_level": "token",  # token-level ratios, as the project
    "num_iterations": 1,  # one update per generation batch (the project: one update per step)
}


# -------------------------------------------------------------------------------- configs
def recipe_config(model: str | None, overrides: list[str]) -> Config:
    """The recipe with `--model` and `--set` applied: what both sides train and how they are scored."""
    return load_config(str(RECIPE), [*([f"model.path={model}"] if model else []), *overrides])


def train_config(model: str | None, overrides: list[str], steps: int, run_dir: str) -> Config:
    """The recipe for training: `steps` steps, no in-run evaluation, quiet, in `run_dir`."""
    return load_config(
        str(RECIPE),
        [
            *([f"model.path={model}"] if model else []),
            *overrides,
            f"trainer.steps={steps}",
            "trainer.eval_every=0",
            "data.num_eval=0",
            "logging.progress=false",
            "logging.plots=false",
            "logging.report=false",
            f"logging.run_dir={run_dir}",
        ],
    )


def lora_config(cfg: Config) -> Any:
    """PEFT's LoraConfig of the project's learner (learners/lora.py::wrap): the same rank, alpha, targets, no
    dropout, no bias."""
    from peft import LoraConfig

    lr = cfg.learners
    if lr.lora_rank <= 0:
        raise ValueError("the recipe mode compares LoRA runs: learners.lora_rank must be > 0")
    return LoraConfig(
        r=lr.lora_rank,
        lora_alpha=lr.lora_alpha,  # a float, as learners/lora.py passes it
        target_modules=list(lr.lora_target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def intervals(first_start: float, ends: list[float]) -> list[float]:
    """Seconds between consecutive step ends, the first from the loop's start."""
    stamps = [first_start, *ends]
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


# -------------------------------------------------------------------------------- the project
def project_side(model: str | None, overrides: list[str], steps: int, run_dir: str) -> dict[str, Any]:
    """The recipe trained by `exgrpo.runtime.recipe.train` (in a spawned child): step ends (time.time), the
    split, the final model's directory and the prompt ids of every question it sampled."""
    import ray
    import torch

    from exgrpo.core.precision import autocast_choice
    from exgrpo.core.records import TrainBatch
    from exgrpo.loop.observer import Observer
    from exgrpo.runtime.recipe import train

    cfg = train_config(model, overrides, steps, run_dir)
    ends: list[float] = []
    prompt_ids: dict[str, list[int]] = {}

    class Watch(Observer):
        def on_batch(self, *, batch: TrainBatch) -> None:
            for g in batch.groups:
                prompt_ids[g.qid] = list(g.prompt_ids)

        def on_step(self, *, record: dict[str, Any]) -> None:
            ends.append(time.time())

    result = train(cfg, checkpoints=False, observer=Watch())
    ray.shutdown()
    records = result.records
    if len(records) != steps:
        raise RuntimeError(f"the project ran {len(records)} steps, not {steps}")
    final = Path(result.run_dir) / "final"
    if not (final / "config.json").is_file():
        raise RuntimeError(f"the project's run left no final model in {final}")
    split = {k.split("/")[1]: [float(r[k]) for r in records] for k in STEP_SPLIT}
    return {
        "intervals_s": intervals(ends[0] - float(records[0]["system/step_time_s"]), ends),
        "train_end": ends[-1],
        "generation_per_step_s": split["wait_s"],
        "update_per_step_s": split["update_s"],
        "split_median_s": {k: statistics.median(v) for k, v in split.items()},
        "n_replay": [int(r["replay/n_replay"]) for r in records],
        "precision": autocast_choice(
            cfg.learners.autocast, device=torch.device("cpu"), dtype=cfg.model.dtype
        )[1],
        "final": str(final),
        "prompt_ids": prompt_ids,
    }


# -------------------------------------------------------------------------------- TRL
def check_prompt_ids(
    trainer: Any, texts: list[str], qids: list[str], project_ids: dict[str, list[int]], max_len: int
) -> dict[str, int]:
    """TRL's token ids of every rendered prompt (its own `_tokenize_prompts`) against the project's: its engines'
    `tokenize` (the text's tokens, no special tokens added) of every prompt, and the ids the project's run trained
    on for each question it sampled. Raises on the first difference, or on a prompt over model.max_prompt_len
    (TRL 1.16 does not truncate prompts; the project refuses longer ones)."""
    from actors.engines import TokenizedEngine

    trl_ids = [list(ids) for ids in trainer._tokenize_prompts(texts)[0]]
    engine = TokenizedEngine()
    engine.tokenizer = trainer.processing_class
    for qid, text, ids in zip(qids, texts, trl_ids, strict=True):
        mine = list(engine.tokenize(text))
        if ids != mine:
            raise RuntimeError(f"{qid}: TRL tokenizes the prompt as {ids}, the project's engines as {mine}")
        if qid in project_ids and ids != project_ids[qid]:
            raise RuntimeError(
                f"{qid}: TRL's prompt ids {ids} differ from the project run's {project_ids[qid]}"
            )
        if len(ids) > max_len:
            raise RuntimeError(f"{qid}: {len(ids)} prompt tokens, over model.max_prompt_len={max_len}")
    missing = set(project_ids) - set(qids)
    if missing:
        raise RuntimeError(f"the project trained on questions TRL does not have: {sorted(missing)[:5]}")
    return {"prompts": len(texts), "project_sampled": len(project_ids)}


def trl_side(
    model: str | None, overrides: list[str], steps: int, out_dir: str, project_ids: dict[str, list[int]]
) -> dict[str, Any]:
    """GRPOTrainer on the recipe (in a spawned child, `TRL_THREADS` torch threads): step ends (time.time), the
    time inside generation per step, and its merged final model."""
    import torch

    torch.set_num_threads(TRL_THREADS)
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback
    from trl import GRPOTrainer

    from bench.peers.bench_trl import grpo_config, step_clock
    from exgrpo.data.sources import load_prompts
    from exgrpo.data.templates import render_prompt, reward_mode
    from exgrpo.models.resolve import resolve_model
    from exgrpo.verify.rewards import make_scorer

    cfg = train_config(model, overrides, steps, out_dir)
    model_dir = str(resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train_set, _ = load_prompts(cfg)
    by_qid = {p.qid: p for p in train_set}
    texts = [render_prompt(p.question, template=cfg.model.template, tokenizer=tokenizer) for p in train_set]
    data = Dataset.from_dict({"prompt": texts, "qid": [p.qid for p in train_set]})
    scorer = make_scorer(
        cfg.reward.fn, mode=reward_mode(cfg.model.template), timeout_s=cfg.samplers.verify_timeout_s
    )
    scorer.start()

    def reward(prompts: list[str], completions: list[str], qid: list[str], **_: Any) -> list[float]:
        return scorer.score_prompts([by_qid[q] for q in qid], completions)

    ends: list[float] = []
    clock = step_clock(ends, time.time)
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=reward,
        args=grpo_config(cfg, out_dir=out_dir, max_steps=steps, **TRL_OVERRIDES),
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[clock],
        peft_config=lora_config(cfg),
    )
    trainer.remove_callback(PrinterCallback)  # no metrics dict printed per step
    checked = check_prompt_ids(trainer, texts, list(by_qid), project_ids, cfg.model.max_prompt_len)
    generation_s: list[float] = []
    generate = trainer._generate_and_score_completions

    def timed_generate(inputs: Any) -> Any:
        t0 = time.perf_counter()
        out = generate(inputs)
        generation_s.append(time.perf_counter() - t0)
        return out

    trainer._generate_and_score_completions = timed_generate
    trainer.train()
    scorer.close()
    if len(ends) != steps + 1 or len(generation_s) != steps:
        raise RuntimeError(f"TRL ran {len(ends) - 1} steps with {len(generation_s)} generations, not {steps}")
    steps_s = intervals(ends[0], ends[1:])
    final = Path(out_dir) / "final"
    trainer.model.merge_and_unload().save_pretrained(final)  # the base's HF names, W + s B A per target
    tokenizer.save_pretrained(final)
    return {
        "intervals_s": steps_s,
        "train_end": ends[-1],
        "generation_per_step_s": generation_s,
        "update_per_step_s": [s - g for s, g in zip(steps_s, generation_s, strict=True)],
        "threads": torch.get_num_threads(),
        "final": str(final),
        "prompt_ids_checked": checked,
    }


# -------------------------------------------------------------------------------- scoring
def eval_argv(cfg: Config, model_dir: str, out: Path, engine: str) -> list[str]:
    """`python -m exgrpo.evaluate` options of the recipe's own held-out evaluation (the keys `--like-run` reads)."""
    data = cfg.data.eval or cfg.data.train
    if not cfg.data.eval and not data.startswith("builtin:"):
        raise ValueError(f"data.train {data} has no held-out split: set data.eval")
    return [
        *("--model", model_dir, "--data", data, "--num", str(cfg.data.num_eval)),
        *("--n", str(cfg.trainer.eval_samples), "--temperature", str(cfg.samplers.temperature)),
        *("--top-p", str(cfg.samplers.top_p), "--max-tokens", str(cfg.model.max_response_len)),
        *("--template", cfg.model.template, "--reward-fn", cfg.reward.fn, "--seed", str(cfg.data.seed)),
        *("--dtype", cfg.model.dtype, "--verify-timeout", str(cfg.samplers.verify_timeout_s)),
        *("--question-key", cfg.data.question_key, "--answer-key", cfg.data.answer_key),
        *("--cache-dir", cfg.model.cache_dir, "--engine", engine, "--out", str(out), "--overwrite"),
    ]


def heldout(cfg: Config, model_dir: str, out: Path, engine: str) -> dict[str, Any]:
    """Avg@n of one model by `python -m exgrpo.evaluate` (its own process), with the standard error over questions."""
    argv = [sys.executable, "-m", "exgrpo.evaluate", *eval_argv(cfg, model_dir, out, engine)]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    report = json.loads(out.read_text())
    means = [q["mean_reward"] for q in report["questions"]]
    se = statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else math.nan
    return {
        "avg_at_n": report["overall"]["avg_at_n"],
        "se": se,
        "pass_at_n": report["overall"]["pass_at_n"],
        "questions": len(means),
        "n": report["n"],
        "eval_s": round(time.perf_counter() - t0, 1),
        "json": str(out),
    }


# -------------------------------------------------------------------------------- main
def run_side(func: Any, *args: Any) -> dict[str, Any]:
    """`func(*args)` in a fresh spawned process: its median step time and split, and its wall time from the spawn
    to its last step's end."""
    launched = time.time()
    res = in_child(func, *args)
    return {
        "step_s": statistics.median(res["intervals_s"]),
        "mean_step_s": statistics.mean(res["intervals_s"]),
        "generation_s": statistics.median(res["generation_per_step_s"]),
        "update_s": statistics.median(res["update_per_step_s"]),
        "wall_s": res["train_end"] - launched,
        "child_s": time.time() - launched,
        **{k: v for k, v in res.items() if k != "train_end"},
    }


def print_side(name: str, fig: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> None:
    gen = "generation wait" if name == "project" else "generation"
    print(
        f"{name:7}: {fig['step_s']:.2f} s/step (median of {len(fig['intervals_s'])}; mean {fig['mean_step_s']:.2f}; "
        f"{gen} {fig['generation_s']:.2f} s, update {fig['update_s']:.2f} s), wall {fig['wall_s']:.1f} s from "
        f"process start to the end of training; held-out Avg@{after['n']} {before['avg_at_n']:.3f} ± "
        f"{before['se']:.3f} -> {after['avg_at_n']:.3f} ± {after['se']:.3f}",
        flush=True,
    )


def main(
    *, model: str | None, overrides: list[str], steps: int, eval_engine: str, out: str | None
) -> dict[str, Any]:
    """Both sides trained, the base and both final models scored, the figures printed and written as JSON."""
    from exgrpo.models.resolve import resolve_model

    cfg = recipe_config(model, overrides)
    model_dir = str(resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir))
    lr = cfg.learners
    print(
        f"recipe {RECIPE.relative_to(ROOT)}: model {model_dir}, B={cfg.trainer.questions_per_step} "
        f"K={cfg.trainer.rollouts_per_question} T={cfg.model.max_response_len} lr={lr.lr} LoRA r={lr.lora_rank} "
        f"alpha={lr.lora_alpha} on {','.join(lr.lora_target_modules)}, micro-batch {lr.micro_batch_size}, "
        f"reward {cfg.reward.fn}; {steps} steps per side; TRL on {TRL_THREADS} threads",
        flush=True,
    )
    root = Path(out).parent / f"{Path(out).stem}-runs" if out else OUT_DIR / "trl-recipe"  # runs, evaluations
    shutil.rmtree(root, ignore_errors=True)  # fresh run directories (a run refuses another's checkpoints)
    project = run_side(project_side, model, overrides, steps, str(root / "project"))
    print(f"project: trained ({project['precision']}), final model {project['final']}", flush=True)
    trl = run_side(trl_side, model, overrides, steps, str(root / "trl"), project.pop("prompt_ids"))
    checked = trl["prompt_ids_checked"]
    print(
        f"prompt ids equal on both sides: all {checked['prompts']} train prompts (TRL's _tokenize_prompts vs the "
        f"project's engine tokenize), {checked['project_sampled']} of them also against the project run's own ids",
        flush=True,
    )
    scores = {
        name: heldout(cfg, where, root / f"eval-{name}.json", eval_engine)
        for name, where in (("base", model_dir), ("project", project["final"]), ("trl", trl["final"]))
    }
    print(
        f"held-out: {cfg.data.num_eval} questions of {cfg.data.eval or cfg.data.train}, Avg@{cfg.trainer.eval_samples} "
        f"at T={cfg.samplers.temperature}, {cfg.model.max_response_len} tokens, by python -m exgrpo.evaluate "
        f"--engine {eval_engine} (± standard error over questions)"
    )
    for name, fig in (("project", project), ("trl", trl)):
        print_side(name, fig, scores["base"], scores[name])
    ratios = {"step_time": project["step_s"] / trl["step_s"], "wall_time": project["wall_s"] / trl["wall_s"]}
    print(
        f"project/TRL: step-time ratio {ratios['step_time']:.2f}, wall-time ratio {ratios['wall_time']:.2f} "
        "(< 1: the project is faster)"
    )
    result = {
        "config": str(RECIPE.relative_to(ROOT)),
        "overrides": overrides,
        "model": model_dir,
        "steps": steps,
    }
    result |= {"trl_threads": TRL_THREADS, "trl_overrides": TRL_OVERRIDES, "project": project, "trl": trl}
    result |= {"heldout": scores, "ratios": ratios}
    path = write_json(out or OUT_DIR / "trl-recipe.json", result)
    print(f"wrote {path}")
    return result
