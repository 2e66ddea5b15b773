"""The project against TRL's GRPOTrainer on the same work: per-step time and generated tokens/s ratios.

    .venv/bin/pip install -e '.[bench]' -c constraints/cpu.txt      # trl, a peer baseline only
    .venv/bin/python -m bench.peers.bench_trl                        # the embedded default (~5 min)
    .venv/bin/python -m bench.peers.bench_trl --smollm2              # SmolLM2-135M on gsm (~15 min)
    .venv/bin/python -m bench.peers.bench_trl --recipe               # the SmolLM2 recipe, 30 steps, scored

What both sides share, what stays different, and the figures: docs/benchmarks.md, "Against TRL".
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from typing import Any

from bench.common import OUT_DIR, ROOT, STEP_SPLIT, env_defaults, in_child, write_json

env_defaults(ray=True, one_thread=True, tokenizers=True)

from exgrpo.core.config import Config  # noqa: E402
from exgrpo.core.config_files import load_config  # noqa: E402

SMOLLM2_CONFIG = ROOT / "configs" / "smollm2-135m-cpu.yaml"


def workload(smollm2: bool, steps: int, out_dir: str, extra: list[str]) -> Config:
    """The project config of the workload, with `steps` steps, no evaluation, quiet."""
    return load_config(
        str(SMOLLM2_CONFIG) if smollm2 else None,
        [
            f"trainer.steps={steps}",
            "trainer.eval_every=0",
            "data.num_eval=0",
            "logging.progress=false",
            "logging.plots=false",
            "logging.report=false",
            f"logging.run_dir={out_dir}",
            *extra,
        ],
    )


def summarize(ends: list[float], tokens: list[int], warmup: int) -> dict[str, Any]:
    """Median step interval and tokens/s over the steps after `warmup` (ends[0] = the start)."""
    intervals = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    timed, tok = intervals[warmup:], tokens[warmup:]
    return {
        "step_s": statistics.median(timed),
        "mean_step_s": statistics.mean(timed),
        "tokens_per_s": sum(tok) / sum(timed),
        "timed_steps": len(timed),
        "intervals_s": [round(x, 3) for x in intervals],
        "tokens": tok,
    }


# -------------------------------------------------------------------------------- the project
def run_project(
    smollm2: bool, steps: int, warmup: int, eta: int, extra: list[str], out_dir: str
) -> dict[str, Any]:
    import ray

    from exgrpo.loop.observer import Observer
    from exgrpo.runtime.recipe import train

    cfg = workload(smollm2, warmup + steps, out_dir, [f"async.max_staleness={eta}", *extra])
    ends: list[float] = []

    class StepEnds(Observer):
        def on_step(self, *, record: dict[str, Any]) -> None:
            ends.append(time.perf_counter())

    records = train(cfg, checkpoints=False, observer=StepEnds()).records
    ray.shutdown()
    # step 0's interval runs from the loop's first step start; the others between consecutive step ends
    first_start = ends[0] - records[0]["system/step_time_s"]
    out = summarize([first_start, *ends], [int(r["rollout/tokens"]) for r in records], warmup)
    timed = records[warmup:]
    out["split_s"] = {k.split("/")[1]: round(statistics.mean(r[k] for r in timed), 4) for k in STEP_SPLIT}
    out["step_time_s_median"] = statistics.median(r["system/step_time_s"] for r in timed)
    out["n_replay"] = [int(r["replay/n_replay"]) for r in records]
    out["update_time_s"] = [round(r["learner/update_time_s"], 4) for r in records]
    return out


# -------------------------------------------------------------------------------- TRL
def step_clock(ends: list[float], now: Any) -> Any:
    """A TrainerCallback appending `now()` to `ends` when training begins and after every optimizer step."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001, ANN003
            ends.append(now())

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN003
            ends.append(now())

    return Clock()


def grpo_config(cfg: Any, *, out_dir: str, max_steps: int, **extra: Any) -> Any:
    """TRL's GRPOConfig for the project's config: the same B x K, micro-batches, optimiser, loss and sampling,
    on the CPU in the model's dtype, one optimiser step per generation of B x K completions; `extra`: more
    GRPOConfig fields, or other values for these."""
    import torch
    from trl import GRPOConfig

    b, k, lc, lr = cfg.trainer.questions_per_step, cfg.trainer.rollouts_per_question, cfg.loss, cfg.learners
    micro = min(lr.micro_batch_size, b * k)
    if (b * k) % micro:
        raise ValueError(f"B*K={b * k} is not a multiple of the micro-batch size {micro}")
    fields = dict(
        output_dir=out_dir,
        max_steps=max_steps,
        seed=cfg.trainer.seed,
        data_seed=cfg.data.seed,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=b * k // micro,
        steps_per_generation=b * k // micro,  # one generation of B x K completions per optimiser step
        num_generations=k,
        max_completion_length=cfg.model.max_response_len,
        num_iterations=1,
        learning_rate=lr.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=lr.betas[0],
        adam_beta2=lr.betas[1],
        weight_decay=lr.weight_decay,
        max_grad_norm=lr.grad_clip,
        beta=0.0,
        epsilon=lc.clip_eps,
        loss_type="dr_grpo" if lc.norm == "constant" else "dapo",
        scale_rewards="group" if lc.std_normalize else "none",
        entropy_coef=lc.entropy_coef,
        temperature=cfg.samplers.temperature,
        top_p=cfg.samplers.top_p,
        top_k=0,
        disable_dropout=True,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
        model_init_kwargs={"dtype": getattr(torch, cfg.model.dtype)},
    )
    return GRPOConfig(**{**fields, **extra})


def run_trl(smollm2: bool, steps: int, warmup: int, out_dir: str) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import AutoTokenizer, PrinterCallback
    from trl import GRPOTrainer

    from exgrpo.data.sources import load_prompts
    from exgrpo.data.templates import render_prompt, reward_mode
    from exgrpo.models.resolve import resolve_model
    from exgrpo.verify.verifier import Verifier

    cfg = workload(smollm2, warmup + steps, out_dir, [])
    model_dir = str(resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train_set, _ = load_prompts(cfg)
    texts = [render_prompt(p.question, template=cfg.model.template, tokenizer=tokenizer) for p in train_set]
    # TRL tokenizes a plain-text prompt with the tokenizer's special tokens; the project without them
    probe = texts[0]
    if tokenizer(text=[probe])["input_ids"][0] != tokenizer.encode(probe, add_special_tokens=False):
        raise RuntimeError("the tokenizer adds special tokens to plain text: TRL's prompts would differ")
    data = Dataset.from_dict({"prompt": texts, "answer": [p.answer for p in train_set]})
    verifier = Verifier(mode=reward_mode(cfg.model.template), timeout_s=cfg.samplers.verify_timeout_s)
    verifier.start()
    tokens: list[int] = []

    def reward(
        prompts: list[str],
        completions: list[str],
        answer: list[str],
        completion_ids: list[list[int]],
        **_: Any,
    ) -> list[float]:
        tokens.append(sum(len(c) for c in completion_ids))
        return verifier.score_many(completions, answer)

    ends: list[float] = []
    clock = step_clock(ends, time.perf_counter)
    args = grpo_config(cfg, out_dir=out_dir, max_steps=warmup + steps)
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.remove_callback(PrinterCallback)  # no metrics dict printed per step
    trainer.train()
    verifier.close()
    out = summarize(ends, tokens, warmup)
    out["threads"] = torch.get_num_threads()
    return out


# -------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smollm2", action="store_true", help="SmolLM2-135M (configs/smollm2-135m-cpu.yaml)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10; SmolLM2: 1)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed first steps (default 3; SmolLM2: 1)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternations of the runs")
    parser.add_argument("--runs", default="eta0,eta1,trl", help="comma-separated: eta0, eta1, trl")
    parser.add_argument(
        "--no-replay", action="store_true", help="project as plain GRPO (replay.enabled=false)"
    )
    parser.add_argument(
        "--out", default=None, help="JSON results (default bench/out/trl-<workload>.json, trl-recipe.json)"
    )
    recipe = parser.add_argument_group("--recipe (bench/peers/trl_recipe.py)")
    recipe.add_argument(
        "--recipe",
        action="store_true",
        help="TRL (LoRA, 2 threads) and the project on configs/smollm2-135m-cpu.yaml's work, 30 steps each "
        "(--steps), both final models and the base scored by python -m exgrpo.evaluate",
    )
    recipe.add_argument("--model", default=None, help="model.path of both sides (default: the recipe's)")
    recipe.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override of the recipe, for both sides and the scoring (repeatable)",
    )
    recipe.add_argument(
        "--eval-engine", choices=("hf", "vllm"), default="hf", help="exgrpo.evaluate's --engine (default: hf)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.recipe:
        from bench.peers import trl_recipe

        other = args.smollm2 or args.no_replay or args.warmup is not None or args.rounds != 1
        if other or args.runs != parser.get_default("runs") or (args.steps is not None and args.steps < 1):
            parser.error(
                "--recipe runs both sides once for --steps >= 1 steps: no --smollm2, --no-replay, "
                "--warmup, --rounds or --runs"
            )

        trl_recipe.main(
            model=args.model,
            overrides=args.set,
            steps=30 if args.steps is None else args.steps,
            eval_engine=args.eval_engine,
            out=args.out,
        )
        return
    if args.model or args.set:
        parser.error("--model and --set go with --recipe")
    steps = args.steps if args.steps is not None else (1 if args.smollm2 else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.smollm2 else 3)
    name = "smollm2" if args.smollm2 else "default"
    extra = ["replay.enabled=false"] if args.no_replay else []
    cfg = workload(args.smollm2, steps, "", extra)
    print(
        f"workload {name}: model {cfg.model.path}, B={cfg.trainer.questions_per_step} "
        f"K={cfg.trainer.rollouts_per_question} T={cfg.model.max_response_len} lr={cfg.learners.lr} "
        f"micro-batch {cfg.learners.micro_batch_size}; {warmup} warm-up + {steps} timed steps per run, "
        f"{args.rounds} round(s); replay {'off' if args.no_replay else 'as configured'}",
        flush=True,
    )
    results: dict[str, list[dict[str, Any]]] = {}
    out_root = OUT_DIR / f"trl-{name}"
    for r in range(args.rounds):
        for run in args.runs.split(","):
            t0 = time.perf_counter()
            where = str(out_root / f"{run}-{r}")
            shutil.rmtree(where, ignore_errors=True)  # a fresh run directory (metrics.jsonl appends)
            if run == "trl":
                res = in_child(run_trl, args.smollm2, steps, warmup, where)
            else:
                res = in_child(
                    run_project, args.smollm2, steps, warmup, int(run.removeprefix("eta")), extra, where
                )
            res["wall_s"] = round(time.perf_counter() - t0, 1)
            results.setdefault(run, []).append(res)
            split = "  split " + json.dumps(res["split_s"]) if "split_s" in res else ""
            print(
                f"round {r} {run:5}: {res['step_s']:.3f} s/step (median of {res['timed_steps']}; mean "
                f"{res['mean_step_s']:.3f}), {res['tokens_per_s']:.1f} generated tokens/s (tokens / time), "
                f"run {res['wall_s']} s{split}",
                flush=True,
            )
    print("\nmedian over rounds:")
    med = {
        run: (statistics.median(x["step_s"] for x in rs), statistics.median(x["tokens_per_s"] for x in rs))
        for run, rs in results.items()
    }
    for run, (s, t) in med.items():
        print(f"  {run:5} {s:.3f} s/step  {t:.1f} tokens/s")
    if "trl" in med:
        for run in med:
            if run != "trl":
                print(
                    f"  {run}/trl: step-time ratio {med[run][0] / med['trl'][0]:.2f} (<= 1 is no slower), "
                    f"tokens/s ratio {med[run][1] / med['trl'][1]:.2f} (>= 1 is no slower)"
                )
    path = write_json(
        args.out or OUT_DIR / f"trl-{name}.json",
        {"workload": name, "warmup": warmup, "steps": steps, "results": results},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
