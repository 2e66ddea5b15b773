"""A sweep's evaluation curves with seed bands, and each arm's paired difference to a base arm over steps.

    python -m bench.analysis.curves runs/sweeps/sum-mixed [--base grpo] [--out curves-paired.png]

Left: each arm's mean accuracy on data.eval with a band of one standard error over its seeds; right: arm - base
per seed (paired), mean with a band of two standard errors. Prints both as tables. More: docs/benchmarks.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.analysis.sweeps import refuse_missing, sweeps_parser
from exgrpo.experiments.tables import by_variant, paired


def _at(run: dict[str, Any], step: int) -> float | None:
    return next((p["all"] for p in run["curve"] if p["step"] == step), None)


def arm_curves(results: list[dict[str, Any]]) -> dict[str, list[tuple[int, float, float, int]]]:
    """variant -> (step, mean, standard error, seeds) at every step any of its runs was scored."""
    out = {}
    for variant, runs in by_variant(results).items():
        steps = sorted({p["step"] for r in runs.values() for p in r["curve"]})
        rows = []
        for step in steps:
            vals = np.array([v for r in runs.values() if (v := _at(r, step)) is not None], dtype=float)
            se = float(vals.std(ddof=1) / np.sqrt(len(vals))) if len(vals) > 1 else float("nan")
            rows.append((step, float(vals.mean()), se, len(vals)))
        out[variant] = rows
    return out


def paired_curves(results: list[dict[str, Any]], base: str) -> dict[str, list[tuple[int, float, float, int]]]:
    """variant -> (step, mean of arm - base over the seeds both ran, its standard error, seeds), per step."""
    by = by_variant(results)
    if base not in by:
        raise ValueError(f"no {base!r} runs in this sweep (arms: {', '.join(by)}); pass --base")
    out = {}
    for variant, runs in by.items():
        if variant == base:
            continue
        seeds = sorted(set(runs) & set(by[base]))
        steps = sorted({p["step"] for s in seeds for p in runs[s]["curve"]})
        rows = []
        for step in steps:
            pairs = [(_at(runs[s], step), _at(by[base][s], step)) for s in seeds]
            diffs = [a - b for a, b in pairs if a is not None and b is not None]
            if diffs:
                rows.append((step, *paired(diffs)))
        out[variant] = rows
    return out


def plot(results: list[dict[str, Any]], base: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    arms = arm_curves(results)
    color = {variant: f"C{i}" for i, variant in enumerate(arms)}  # an arm's colour in both panels
    for variant, rows in arms.items():
        step, mean, se, _ = (np.array(c, dtype=float) for c in zip(*rows, strict=True))
        left.plot(step, mean, marker="o", ms=3, label=variant, color=color[variant])
        left.fill_between(step, mean - se, mean + se, alpha=0.15, color=color[variant])
    left.set(xlabel="learner step", ylabel="accuracy on data.eval", title="mean over seeds, band ±1 s.e.")
    for variant, rows in paired_curves(results, base).items():
        step, mean, se, _ = (np.array(c, dtype=float) for c in zip(*rows, strict=True))
        right.plot(step, mean, marker="o", ms=3, label=f"{variant} - {base}", color=color[variant])
        right.fill_between(step, mean - 2 * se, mean + 2 * se, alpha=0.15, color=color[variant])
    right.axhline(0.0, color="gray", lw=0.8)
    right.set(xlabel="learner step", ylabel=f"arm - {base}, paired by seed", title="mean, band ±2 s.e.")
    for ax in (left, right):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_curves(results: list[dict[str, Any]], base: str) -> str:
    lines = ["| arm | step | mean | s.e. | seeds |", "|---|---|---|---|---|"]
    for variant, rows in arm_curves(results).items():
        lines += [f"| {variant} | {s} | {m:.3f} | {e:.3f} | {n} |" for s, m, e, n in rows]
    lines += ["", f"| arm - {base} | step | mean | s.e. | seeds |", "|---|---|---|---|---|"]
    for variant, rows in paired_curves(results, base).items():
        lines += [f"| {variant} - {base} | {s} | {m:+.3f} | {e:.3f} | {n} |" for s, m, e, n in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = sweeps_parser("python -m bench.analysis.curves", __doc__)
    parser.add_argument("--base", default="grpo", help="the arm the paired differences are taken to")
    parser.add_argument("--out", type=Path, help="the figure (default: <sweep>/curves-paired.png)")
    args = parser.parse_args(argv)
    if refuse_missing(args.sweeps):
        return 2
    if args.out and len(args.sweeps) > 1:
        print("error: --out names one figure: give one sweep with it", file=sys.stderr)
        return 2
    for sweep in args.sweeps:
        results = json.loads((sweep / "results.json").read_text())
        try:
            print(f"### {sweep}\n\n{format_curves(results, args.base)}")
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        out = args.out or sweep / "curves-paired.png"
        plot(results, args.base, out)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
