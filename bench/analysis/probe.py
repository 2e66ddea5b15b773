"""Probe the final models of a compare sweep: held-out accuracy at the paper's T = 0.6 beside T = 1.0, and
accuracy on the questions ExGRPO replayed (is replay memorising its questions?).

    python -m bench.analysis.probe runs/compare --n 4 --temperatures 1.0 0.6

Writes `probe.json` and `probe.md` into the sweep directory. More: docs/results.md (7.4, "the probe").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.analysis.sweeps import run_dir_of
from exgrpo.core.records import Prompt
from exgrpo.experiments.tables import mean_std, paired


def _replayed_qids(run_dir: Path) -> list[str]:
    seen: dict[str, None] = {}
    path = run_dir / "candidates.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            seen.setdefault(json.loads(line)["qid"], None)
    return list(seen)


def _score(model: Path, prompts: list[Prompt], *, n: int, temperature: float) -> dict[str, float]:
    from exgrpo.evaluation.measure import measure_traces

    sampled = measure_traces(model, prompts, n=n, temperature=temperature, seed=0)
    per_q = [float(np.mean(r)) for r in sampled.rewards]
    out = {"all": float(np.mean(per_q))}
    for source in sorted({p.data_source for p in prompts}):
        out[source] = float(
            np.mean([s for s, p in zip(per_q, prompts, strict=True) if p.data_source == source])
        )
    return out


def probe_run(
    run: dict[str, Any],
    *,
    replayed: list[str],
    n: int,
    temperatures: list[float],
    num: int,
    eval_spec: str = "",
) -> dict:
    from exgrpo.core.config_files import load_config
    from exgrpo.data.sources import load_prompts

    run_dir = Path(run["run_dir"])
    cfg = load_config(str(run_dir / "config.yaml"), [f"data.eval={eval_spec}"] if eval_spec else [])
    train, evaluation = load_prompts(cfg)
    by_qid = {p.qid: p for p in train}
    chosen = [by_qid[q] for q in replayed if q in by_qid][:num]
    early = [p for p in train[: 8 * num] if p.qid not in set(replayed)][: len(chosen)]
    model = run_dir / "final"
    out: dict[str, Any] = {"variant": run["variant"], "seed": run["seed"], "run_dir": str(run_dir)}
    for t in temperatures:
        out[f"eval@{t:g}"] = _score(model, evaluation, n=n, temperature=t)
    if chosen:
        out["replayed"] = _score(model, chosen, n=n, temperature=1.0)["all"]
        out["fresh_seen"] = _score(model, early, n=n, temperature=1.0)["all"]
        out["num_replayed_probed"] = len(chosen)
    return out


def format_probe(records: list[dict[str, Any]]) -> str:
    keys = sorted({k for r in records for k, v in r.items() if isinstance(v, dict)})
    cols = [(k, s) for k in keys for s in sorted({s for r in records for s in r.get(k, {})})]
    cols += [(k, None) for k in ("replayed", "fresh_seen") if any(k in r for r in records)]

    def value(r: dict[str, Any], col: tuple[str, str | None]) -> float | None:
        k, s = col
        v = r.get(k)
        return v.get(s) if isinstance(v, dict) else v

    names = [f"{k} {s}" if s else k for k, s in cols]
    lines = ["## Final models, mean ± std over seeds", "", "| variant | seeds | " + " | ".join(names) + " |"]
    lines.append("|---|---|" + "---|" * len(cols))
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["variant"], {})[r["seed"]] = r
    for v, runs in by.items():
        cells = []
        for c in cols:
            vals = [x for x in (value(r, c) for r in runs.values()) if x is not None]
            m, sd, _ = mean_std(vals) if vals else (float("nan"), 0.0, 0)
            cells.append(f"{m:.3f} ± {sd:.3f}" if vals else "-")
        lines.append(f"| {v} | {len(runs)} | " + " | ".join(cells) + " |")
    lines += ["", "## Paired differences against grpo (mean ± standard error)", ""]
    lines += ["| a − grpo | seeds | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(cols)]
    for v, runs in by.items():
        if v == "grpo" or "grpo" not in by:
            continue
        seeds = sorted(set(runs) & set(by["grpo"]))
        cells = []
        for c in cols:
            d = [
                value(runs[s], c) - value(by["grpo"][s], c)  # type: ignore[operator]
                for s in seeds
                if value(runs[s], c) is not None and value(by["grpo"][s], c) is not None
            ]
            m, se, _ = paired(d) if d else (float("nan"), float("nan"), 0)
            cells.append(f"{m:+.3f} ± {se:.3f}" if d else "-")
        lines.append(f"| {v} − grpo | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.analysis.probe", description=__doc__.split("\n")[0]
    )
    parser.add_argument("sweep", type=Path, help="a compare --out directory (holds results.json)")
    parser.add_argument("--variants", nargs="*", help="only these variants (default: all)")
    parser.add_argument("--n", type=int, default=4, help="samples per question")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[1.0, 0.6])
    parser.add_argument("--num", type=int, default=100, help="replayed (and fresh-seen) questions probed")
    parser.add_argument(
        "--eval", default="", help="score these held-out questions instead of the run's data.eval"
    )
    parser.add_argument("--name", default="probe", help="output files: <sweep>/<name>.json and <name>.md")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    results = json.loads((args.sweep / "results.json").read_text())
    results = [{**r, "run_dir": str(run_dir_of(args.sweep, r))} for r in results]
    path = args.sweep / f"{args.name}.json"
    records: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    done = {(r["variant"], r["seed"]) for r in records}
    replayed = {r["seed"]: _replayed_qids(Path(r["run_dir"])) for r in results if r["variant"] == "exgrpo"}
    for run in results:
        if (run["variant"], run["seed"]) in done or (args.variants and run["variant"] not in args.variants):
            continue
        if not (Path(run["run_dir"]) / "final").is_dir():
            continue
        records.append(
            probe_run(
                run,
                replayed=replayed.get(run["seed"], []),
                n=args.n,
                temperatures=args.temperatures,
                num=args.num,
            )
        )
        path.write_text(json.dumps(records, indent=1))
    (args.sweep / f"{args.name}.md").write_text(format_probe(records))
    print(format_probe(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
