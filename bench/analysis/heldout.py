"""A compare sweep's held-out phase, paired over seeds, from each run's saved held-out completions.

    python -m bench.analysis.heldout runs/sweeps/sum-mixed-heldout [--base COLD.jsonl] [--json out.json]

Reads RUN/heldout.jsonl (`python -m exgrpo.evaluate --like-run RUN --save-completions RUN/heldout.jsonl`) of every
run in results.json; what it prints: docs/benchmarks.md, "Sweep analyses".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.analysis.reach import CORRECT_ABOVE, RARE  # the same rule for a rare success as the reach's
from bench.analysis.sweeps import refuse_missing, run_dir_of, sweeps_parser
from exgrpo.experiments.tables import PAIRS, paired


def question_rewards(path: Path) -> dict[str, list[float]]:
    """qid -> the rewards of its samples, from a `--save-completions` file."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: evaluate the run first (see the module doc)")
    out: dict[str, list[float]] = defaultdict(list)
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["qid"]].append(float(row["reward"]))
    return dict(out)


def avg_at_n(rewards: dict[str, list[float]], qids: list[str] | None = None) -> float:
    """Mean over questions of the mean reward of their samples (Avg@n), over `qids` (default: all)."""
    keys = list(rewards) if qids is None else qids
    return float(np.mean([np.mean(rewards[q]) for q in keys])) if keys else float("nan")


def rare_questions(base: dict[str, list[float]]) -> list[str]:
    """The questions the base solved in `RARE` of its samples."""
    return sorted(q for q, r in base.items() if sum(x > CORRECT_ABOVE for x in r) in RARE)


def solve_histogram(rewards: dict[str, list[float]]) -> list[int]:
    """Questions per count k = 0..n of correct samples (n: the most samples a question has)."""
    n = max(len(r) for r in rewards.values())
    counts = [sum(x > CORRECT_ABOVE for x in r) for r in rewards.values()]
    return [counts.count(k) for k in range(n + 1)]


def sweep_heldout(sweep: Path, base: dict[str, list[float]] | None = None) -> list[dict[str, Any]]:
    """One record per run: variant, seed, held-out Avg@n, questions, generated tokens, wall s, and with a base
    the Avg@n on the base's rare-success questions."""
    rare = rare_questions(base) if base else []
    records = []
    for r in json.loads((sweep / "results.json").read_text()):
        rewards = question_rewards(run_dir_of(sweep, r) / "heldout.jsonl")
        if base and set(rewards) != set(base):
            raise ValueError(f"{r['variant']} seed {r['seed']}: its held-out questions are not the base's")
        record = {
            "variant": r["variant"],
            "seed": r["seed"],
            "heldout": avg_at_n(rewards),
            "questions": len(rewards),
            "tokens": r["curve"][-1]["tokens"],
            "wall_s": r["wall_s"],
        }
        if rare:
            record["rare"] = avg_at_n(rewards, rare)
        records.append(record)
    return records


def contrasts(records: list[dict[str, Any]], key: str = "heldout") -> list[dict[str, Any]]:
    """a - b per seed over the seeds both arms ran, for the pairs of the compare tables present here."""
    by = {(r["variant"], r["seed"]): r for r in records}
    variants = {r["variant"] for r in records}
    out = []
    for a, b in PAIRS:
        if a not in variants or b not in variants:
            continue
        seeds = sorted(s for v, s in by if v == a and (b, s) in by)
        diffs = [by[a, s][key] - by[b, s][key] for s in seeds]
        mean, se, n = paired(diffs)
        out.append({"pair": f"{a} - {b}", "key": key, "seeds": n, "mean": mean, "se": se, "diffs": diffs})
    return out


def format_heldout(records: list[dict[str, Any]], base: dict[str, list[float]] | None) -> str:
    rare = bool(base) and any("rare" in r for r in records)
    cols = ["variant", "seed", "held-out Avg@n", "questions", "generated tokens", "wall s"]
    cols += ["on the base's rare successes"] if rare else []
    lines = ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    for r in sorted(records, key=lambda r: (r["variant"], r["seed"])):
        cells = [
            r["variant"],
            r["seed"],
            f"{r['heldout']:.3f}",
            r["questions"],
            r["tokens"],
            f"{r['wall_s']:.0f}",
        ]
        cells += [f"{r['rare']:.3f}"] if rare else []
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    if base:
        n_rare = len(rare_questions(base))
        lines += [
            "",
            f"The base: Avg@n {avg_at_n(base):.3f}; questions solved k of n times, k = 0..n: "
            + ", ".join(map(str, solve_histogram(base)))
            + f"; rare successes (k in {RARE}): {n_rare} questions",
        ]
    lines += ["", "| a - b | on | seeds | mean ± standard error | per seed |", "|---|---|---|---|---|"]
    for key in ("heldout", "rare") if rare else ("heldout",):
        for c in contrasts(records, key):
            per_seed = " ".join(f"{d:+.3f}" for d in c["diffs"])
            lines.append(
                f"| {c['pair']} | {key} | {c['seeds']} | {c['mean']:+.3f} ± {c['se']:.3f} | {per_seed} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser: argparse.ArgumentParser = sweeps_parser("python -m bench.analysis.heldout", __doc__)
    parser.add_argument(
        "--base", type=Path, help="the base model's saved held-out completions (same questions)"
    )
    parser.add_argument("--json", type=Path, help="also write every run's record and the contrasts here")
    args = parser.parse_args(argv)
    if refuse_missing(args.sweeps):
        return 2
    base = question_rewards(args.base) if args.base else None
    everything = {}
    for sweep in args.sweeps:
        records = sweep_heldout(sweep, base)
        print(f"### {sweep}\n\n{format_heldout(records, base)}")
        everything[str(sweep)] = {"runs": records, "contrasts": contrasts(records)}
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
