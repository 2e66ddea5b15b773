"""Strict and lenient held-out scores of saved completions, per run and against the base, with standard errors.

    .venv/bin/python -m bench.models.heldout_scores --base base.jsonl RUN_A.jsonl RUN_B.jsonl ...
        [--task builtin:sum-1digit] [--num 27]

Reads what `python -m exgrpo.evaluate ... --save-completions FILE` wrote; the scores and the errors:
docs/benchmarks.md, "Base models and tasks".
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from exgrpo.verify import number_scores

SCORES = ("strict", "lenient")


def per_question(path: Path, gold: dict[str, str]) -> dict[str, dict[str, list[float]]]:
    """score -> qid -> the scores of its samples."""
    out: dict[str, dict[str, list[float]]] = {s: defaultdict(list) for s in SCORES}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        qid = row["qid"]
        if qid not in gold:
            raise SystemExit(f"{path}: qid {qid!r} is not a held-out question of the task")
        for s in SCORES:
            score = getattr(number_scores, s)(row["prompt"], row["completion"], {"answer": gold[qid]})
            out[s][qid].append(float(score))
    return out


def summary(scores: dict[str, list[float]]) -> tuple[float, float, list[int]]:
    """(Avg@n, its standard error over questions, histogram of questions solved k of n times)."""
    means = np.array([np.mean(v) for v in scores.values()])
    n = max(len(v) for v in scores.values())
    hist = [0] * (n + 1)
    for v in scores.values():
        hist[int(round(sum(v)))] += 1
    return float(means.mean()), float(means.std(ddof=1) / np.sqrt(len(means))), hist


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="completions of the trained runs")
    parser.add_argument("--base", type=Path, required=True, help="completions of the base model")
    parser.add_argument("--task", default="builtin:sum-1digit")
    parser.add_argument("--num", type=int, default=27, help="held-out questions the evaluations used")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from exgrpo.data.sources import read_source

    gold = {p.qid: p.answer for p in read_source(args.task, split="eval", num=args.num, seed=0).prompts}
    results: dict[str, dict[str, tuple[float, float, list[int]]]] = {}
    for path in [args.base, *args.files]:
        results[str(path)] = {s: summary(q) for s, q in per_question(path, gold).items()}
        for s in SCORES:
            mean, se, hist = results[str(path)][s]
            print(f"{path}  {s:8} Avg {mean:.3f} ± {se:.3f}  k-histogram {hist}")
    base = results[str(args.base)]
    groups: dict[str, list[str]] = defaultdict(list)
    for path in args.files:
        run = path.parent.name if path.name.startswith("heldout") else path.stem
        groups[re.sub(r"-seed\d+$", "", run)].append(str(path))
    for name, paths in groups.items():
        for s in SCORES:
            gains = np.array([results[p][s][0] - base[s][0] for p in paths])
            spread = gains.std(ddof=1) / np.sqrt(len(gains)) if len(gains) > 1 else float("nan")
            se = float(np.sqrt(spread**2 + base[s][1] ** 2))
            print(
                f"{name}: {s} gain over the base {gains.mean():+.3f} ± {se:.3f} "
                f"({len(gains)} seeds: {' '.join(f'{g:+.3f}' for g in gains)})"
            )


if __name__ == "__main__":
    main()
