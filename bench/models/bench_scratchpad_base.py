"""What the scratchpad base models can do before RL: build time, solve rates, k histogram, trace quality.

    .venv/bin/python -m bench.models.bench_scratchpad_base [--model builtin:scratchpad-base] [--n 200] [--k 8]

What it samples and prints per split: docs/benchmarks.md, "Base models and tasks".
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np
import torch

from bench.common import print_json
from exgrpo.data.scratchpad import ScratchpadTask, solution_steps
from exgrpo.evaluation.measure import measure_traces
from exgrpo.models.resolve import resolve_model


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="builtin:scratchpad-base")
    parser.add_argument("--n", type=int, default=200, help="questions per split")
    parser.add_argument("--k", type=int, default=8, help="samples per question")
    parser.add_argument("--cache-dir", default="~/.cache/exgrpo")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (the questions stay the same)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model = resolve_model(args.model, cache_dir=args.cache_dir)
    print_json(
        {
            "model": str(model),
            "resolve_s": round(time.perf_counter() - t0, 1),
            "seed": args.seed,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }
    )
    task = ScratchpadTask()
    for split in ("train", "val", "eval", "ood-eval"):
        prompts = task.make_split(split=split, n=args.n, seed=0)
        s = measure_traces(model, prompts, n=args.k, seed=args.seed)
        rewards = np.array(s.rewards, dtype=float)  # (questions, K)
        k = rewards.sum(axis=1).astype(int)
        by_len: dict[int, list[float]] = {}
        for p, r in zip(prompts, rewards, strict=True):
            by_len.setdefault(len(solution_steps(p.question)), []).append(float(r.mean()))
        correct = [
            c
            for row_r, row_c in zip(s.rewards, s.checks, strict=True)
            for r, c in zip(row_r, row_c, strict=True)
            if r > 0.5
        ]
        flawed = sum(not c.valid for c in correct)
        unparsed = sum(not c.parsed for row in s.checks for c in row)
        print_json(
            {
                "split": split,
                "questions": len(prompts),
                "solve_rate": round(float(rewards.mean()), 3),
                "by_digits": {d: round(float(np.mean(v)), 3) for d, v in sorted(by_len.items())},
                "k_histogram": [Counter(k.tolist()).get(i, 0) for i in range(args.k + 1)],
                "correct_with_flawed_trace": f"{flawed}/{len(correct)}",
                "unparsed_share": round(unparsed / rewards.size, 3),
            }
        )


if __name__ == "__main__":
    main()
