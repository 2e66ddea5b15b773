"""The paper's Figure 1 in miniature: is a low-entropy correct trajectory more often a valid reasoning trace?

    python -m bench.analysis.figure1 runs/compare/exgrpo-seed0 runs/compare/exgrpo-seed1 ... [--bins 5]

Reads the runs' `candidates.jsonl` (a task with a process check: `builtin:scratchpad`); what it prints:
docs/benchmarks.md, "Sweep analyses".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np


def read_candidates(run_dirs: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for i, d in enumerate(run_dirs):
        path = Path(d) / "candidates.jsonl"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} not found: figure1 needs runs on a task with a process check "
                "(e.g. data.train=builtin:scratchpad) and replay on"
            )
        rows += [{**json.loads(line), "run": i} for line in path.read_text().splitlines() if line.strip()]
    return rows


def entropy_bins(rows: list[dict[str, Any]], bins: int) -> list[dict[str, float]]:
    ent = np.array([r["entropy"] for r in rows], dtype=float)
    valid = np.array([r["valid"] for r in rows], dtype=float)
    edges = np.unique(np.quantile(ent, np.linspace(0, 1, bins + 1)))
    which = np.clip(np.searchsorted(edges, ent, side="right") - 1, 0, len(edges) - 2)
    out = []
    for b in range(len(edges) - 1):
        m = which == b
        n = int(m.sum())
        p = float(valid[m].mean()) if n else float("nan")
        out.append(
            {
                "lo": float(edges[b]),
                "hi": float(edges[b + 1]),
                "n": n,
                "valid": p,
                "se": float(np.sqrt(p * (1 - p) / n)) if n else float("nan"),
            }
        )
    return out


def selection_rules(rows: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["run"], r["step"], r["request_id"])].append(r)
    mixed = [g for g in groups.values() if len(g) > 1 and 0 < sum(c["valid"] for c in g) < len(g)]
    if not mixed:
        return {"groups": len(groups), "informative": 0}
    low = np.array([min(g, key=lambda c: c["entropy"])["valid"] for g in mixed], dtype=float)
    high = np.array([max(g, key=lambda c: c["entropy"])["valid"] for g in mixed], dtype=float)
    rand = np.array([np.mean([c["valid"] for c in g]) for g in mixed], dtype=float)
    n = len(mixed)

    def se(x: np.ndarray) -> float:
        return float(x.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")

    return {
        "groups": len(groups),
        "informative": n,
        "lowest_entropy": float(low.mean()),
        "lowest_entropy_se": se(low),
        "random": float(rand.mean()),
        "random_se": se(rand),
        "highest_entropy": float(high.mean()),
        "highest_entropy_se": se(high),
        "lowest_minus_random": float((low - rand).mean()),
        "lowest_minus_random_se": se(low - rand),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.analysis.figure1", description=__doc__.split("\n")[0]
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories holding candidates.jsonl")
    parser.add_argument(
        "--bins", type=int, default=5, help="entropy bins (quantiles over all rows) (default: %(default)s)"
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON here (default: print only)")
    args = parser.parse_args(argv)
    try:
        rows = read_candidates(args.runs)
    except (FileNotFoundError, ValueError) as err:  # no candidates file, or one that is not JSON lines
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not rows:
        print(
            f"error: no candidates in {', '.join(map(str, args.runs))}: replay never chose among stored "
            "trajectories (did replay start? see replay/started in metrics.jsonl)",
            file=sys.stderr,
        )
        return 2
    valid_share = float(np.mean([r["valid"] for r in rows]))
    bins, r = entropy_bins(rows, args.bins), selection_rules(rows)
    result = {"candidates": len(rows), "valid_share": valid_share, "bins": bins, "rules": r}
    print(f"{len(rows)} correct candidates scored, {valid_share:.3f} with a fully valid trace")
    print("| mean token entropy | candidates | valid trace share |\n|---|---|---|")
    for b in bins:
        print(f"| {b['lo']:.3f} - {b['hi']:.3f} | {b['n']} | {b['valid']:.3f} ± {b['se']:.3f} |")
    print(f"\nreplay groups with both valid and flawed candidates: {r['informative']} of {r['groups']}")
    if r["informative"]:
        print("| rule | chosen trace valid |\n|---|---|")
        for k in ("lowest_entropy", "random", "highest_entropy"):
            print(f"| {k.replace('_', ' ')} | {r[k]:.3f} ± {r[k + '_se']:.3f} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
