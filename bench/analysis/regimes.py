"""The regime table of docs/results.md: one row per sweep cell, ExGRPO (or another arm) against GRPO.

    python -m bench.analysis.regimes runs/sweeps/e1-2ep runs/sweeps/e1-1ep ... [--arm exgrpo] [--base grpo]

The columns: docs/benchmarks.md, "Sweep analyses".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.analysis.sweeps import refuse_missing, sweeps_parser
from exgrpo.experiments.tables import by_variant, paired, series_mean


def cell_row(sweep: Path, *, arm: str, base: str) -> dict[str, Any] | None:
    """The regime row of one sweep, or None when it holds no seed of both `arm` and `base`."""
    from exgrpo.core.config_files import load_config

    by = by_variant(json.loads((sweep / "results.json").read_text()))
    seeds = sorted(set(by.get(arm, {})) & set(by.get(base, {})))
    if not seeds:
        return None
    first = by[base][seeds[0]]
    cfg = load_config(first.get("config"), [o for o in first["overrides"] if not o.startswith("logging.")])
    draws = cfg.trainer.steps * cfg.trainer.questions_per_step

    def final(run: dict[str, Any], key: str) -> float:
        return float(run["curve"][-1][key])

    # a task of one source has no ID/OOD split: its ID column is the accuracy over all held-out questions, OOD nan
    id_key = "id" if by[base][seeds[0]]["curve"][-1].get("id") is not None else "all"
    diffs = {"id": paired([final(by[arm][s], id_key) - final(by[base][s], id_key) for s in seeds])}
    diffs["ood"] = (
        paired([final(by[arm][s], "ood") - final(by[base][s], "ood") for s in seeds])
        if id_key == "id"
        else (float("nan"), float("nan"), len(seeds))
    )
    zero_var = [series_mean(by[base][s], "fresh_zero_var") for s in seeds]
    return {
        "cell": sweep.name,
        "epochs": draws / cfg.data.num_train,
        "B": cfg.trainer.questions_per_step,
        "minibatches": cfg.learners.minibatches,
        "eta": cfg.async_.max_staleness,
        "fresh_zero_var": float(np.nanmean(zero_var)),
        "id": diffs["id"][:2],
        "ood": diffs["ood"][:2],
        "base_id": float(np.mean([final(by[base][s], id_key) for s in seeds])),
        "seeds": len(seeds),
        "wall_s": float(np.mean([by[v][s]["wall_s"] for v in (arm, base) for s in seeds])),
    }


def format_rows(rows: list[dict[str, Any]], *, arm: str, base: str) -> str:
    lines = [
        f"| cell | epochs | B | mini-batches | eta | fresh zero-var ({base}) | {base} ID | "
        f"{arm} − {base} ID | OOD | seeds | wall s / run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cell']} | {r['epochs']:.1f} | {r['B']} | {r['minibatches']} | {r['eta']} | "
            f"{r['fresh_zero_var']:.2f} | {r['base_id']:.3f} | {r['id'][0]:+.3f} ± {r['id'][1]:.3f} | "
            f"{r['ood'][0]:+.3f} ± {r['ood'][1]:.3f} | {r['seeds']} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = sweeps_parser("python -m bench.analysis.regimes", __doc__)
    parser.add_argument("--arm", default="exgrpo", help="the variant compared (default: %(default)s)")
    parser.add_argument("--base", default="grpo", help="the variant it is paired with (default: %(default)s)")
    args = parser.parse_args(argv)
    if refuse_missing(args.sweeps):
        return 2
    rows = [r for s in args.sweeps if (r := cell_row(s, arm=args.arm, base=args.base)) is not None]
    print(format_rows(rows, arm=args.arm, base=args.base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
