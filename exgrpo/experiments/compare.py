"""ExGRPO vs on-policy GRPO and the paper's ablations, several seeds each, on the builtin task.

    python -m exgrpo.experiments.compare                       # everything (see VARIANTS), 3 seeds
    python -m exgrpo.experiments.compare --variants exgrpo grpo --seeds 0 1 --out runs/compare
    python -m exgrpo.experiments.compare trainer.steps=10      # overrides apply to every run

All runs share one local Ray cluster and run one after another (the machine has 2 cores, so
parallel trials would only slow each other down; this is why Ray Tune is not used here). Each run
is the normal driver on the default config plus the variant's overrides; held-out accuracy is
measured every `trainer.eval_every` steps on the same held-out questions for every run
(`data.seed` stays fixed; `trainer.seed` varies).

Outputs in --out: results.json (every run's eval curve, wall time), table.md (mean +- std over
seeds at each evaluated step), curves.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("exgrpo.compare")

# name -> (overrides, what it tests); mirrors the paper's Table 1 (ExGRPO vs on-policy), Table 5/6 ablations
VARIANTS: dict[str, tuple[list[str], str]] = {
    "exgrpo": ([], "ExGRPO: rho = 0.5 from replay, Gaussian buckets, lowest-entropy trajectory, shaping"),
    "grpo": (["replay.enabled=false"], "on-policy GRPO (Dr.GRPO advantages, clipped), no replay"),
    "uniform-buckets": (["replay.question_selection=uniform"], "no question selection (uniform over buckets)"),
    "random-trajectory": (["replay.trajectory_selection=random"], "no trajectory selection (random stored one)"),
    "highest-entropy": (["replay.trajectory_selection=highest_entropy"], "highest-entropy trajectory"),
    "no-shaping": (["loss.policy_shaping=false"], "replayed tokens use the plain ratio w (no f(w)=w/(w+beta))"),
    # the paper's weak-model setting (Llama) replays from the first step: no delayed start
    "exgrpo-weak": (["model.path=builtin:arith-weak", "replay.start_solve_ratio=0.0"],
                    "ExGRPO on the weak base model, no delayed start"),
    "grpo-weak": (["model.path=builtin:arith-weak", "replay.enabled=false"], "GRPO on the weak base model"),
}


def run_one(name: str, seed: int, overrides: list[str], out: Path) -> dict[str, Any]:
    from exgrpo.config import load_config
    from exgrpo.launch import train

    run_dir = out / f"{name}-seed{seed}"
    cfg = load_config(None, [*overrides, *VARIANTS[name][0], f"trainer.seed={seed}", f"logging.run_dir={run_dir}",
                             "logging.progress=false", "logging.plots=false", "logging.ray_metrics=false"])
    result = train(cfg, checkpoints=False)
    records = result.records
    curve = [(e["eval/version"], e["eval/accuracy"]) for e in result.evals]
    return {"variant": name, "seed": seed, "curve": curve, "wall_s": result.wall_s,
            "replay_groups": int(sum(r.get("replay/n_replay", 0) for r in records)),
            "final_reward": records[-1].get("rollout/mean_reward"), "retired": records[-1].get("replay/retired")}


def aggregate(results: list[dict[str, Any]]) -> dict[str, dict[int, tuple[float, float, int]]]:
    """variant -> step -> (mean, std, n) of held-out accuracy over seeds."""
    table: dict[str, dict[int, list[float]]] = {}
    for r in results:
        for step, acc in r["curve"]:
            table.setdefault(r["variant"], {}).setdefault(int(step), []).append(acc)
    return {v: {s: (float(np.mean(a)), float(np.std(a)), len(a)) for s, a in sorted(steps.items())}
            for v, steps in table.items()}


def format_table(agg: dict[str, dict[int, tuple[float, float, int]]]) -> str:
    steps = sorted({s for v in agg.values() for s in v})
    head = "| variant | " + " | ".join(f"step {s}" for s in steps) + " |"
    lines = [head, "|" + "---|" * (len(steps) + 1)]
    for v, row in agg.items():
        cells = [f"{row[s][0]:.3f} ± {row[s][1]:.3f}" if s in row else "-" for s in steps]
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(agg: dict[str, dict[int, tuple[float, float, int]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for v, row in agg.items():
        steps = sorted(row)
        mean = np.array([row[s][0] for s in steps])
        std = np.array([row[s][1] for s in steps])
        ax.plot(steps, mean, marker="o", ms=3, label=v)
        ax.fill_between(steps, mean - std, mean + std, alpha=0.15)
    ax.set_xlabel("learner step")
    ax.set_ylabel("held-out accuracy (mean ± std over seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exgrpo.experiments.compare", description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="runs/compare")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from exgrpo.config import load_config
    from exgrpo.launch import init_ray

    init_ray(load_config(None, args.overrides))
    results_path = out / "results.json"
    results: list[dict[str, Any]] = json.loads(results_path.read_text()) if results_path.exists() else []
    done = {(r["variant"], r["seed"]) for r in results}
    t0 = time.perf_counter()
    for seed in args.seeds:  # seeds outermost: a partial sweep still compares every variant
        for name in args.variants:
            if (name, seed) in done:
                continue
            log.info("run %s seed %d", name, seed)
            results.append(run_one(name, seed, list(args.overrides), out))
            results_path.write_text(json.dumps(results, indent=1))  # resumable sweep
            agg = aggregate(results)
            (out / "table.md").write_text(format_table(agg) + "\n")
    agg = aggregate(results)
    plot(agg, out / "curves.png")
    print(format_table(agg))
    print(f"sweep wall time this invocation: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
