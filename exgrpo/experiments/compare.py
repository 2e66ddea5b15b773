"""ExGRPO vs on-policy GRPO and the paper's ablations, several seeds each, on the embedded task.

    python -m exgrpo.experiments.compare                       # every variant (see VARIANTS), seeds 0 1 2
    python -m exgrpo.experiments.compare --variants exgrpo grpo --seeds 0 1 2 3 4 --out runs/compare
    python -m exgrpo.experiments.compare data.eval=builtin:scratchpad-val-all   # choose settings on val
    python -m exgrpo.experiments.compare --report runs/compare  # tables and curves from results.json only

All runs share one local Ray cluster and run one after another through `exgrpo.runtime.recipe.train` (the
machine has 2 cores: parallel trials would only slow each other down, which is why Ray Tune is not
used). Each run is the default config plus the variant's overrides; every run of one seed sees the
same questions in the same order (`data.seed` fixed, `data.fresh_take=batch`), so runs are paired
by seed. Held-out accuracy (Avg@n) is measured every `trainer.eval_every` steps on the same questions,
in-distribution (ID) and out-of-distribution (OOD) separately.

Outputs in --out: results.json (one record per run: variant, seed, overrides, run directory, wall
time and its curve of accuracy by learner step and by generated tokens; resumable and re-runnable
per seed), table.md (mean +- std over seeds; paired differences with their standard errors at
equal learner steps and at equal generated tokens; the mechanism table: per-step series such as the fresh
zero-variance share, entropy, clipped steps and the gradient's split by row origin), curves.png and
mechanism.png (those series by step).
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
ID, OOD = "eval/accuracy_scratchpad_id", "eval/accuracy_scratchpad_ood"

# name -> (overrides, what it tests); the paper's Table 1 (ExGRPO vs on-policy) and its ablations
VARIANTS: dict[str, tuple[list[str], str]] = {
    "exgrpo": ([], "ExGRPO: rho = 0.5 from replay, Gaussian buckets, lowest-entropy trajectory, shaping"),
    "grpo": (["replay.enabled=false"], "on-policy GRPO (Dr.GRPO advantages, clipped), no replay"),
    "uniform-buckets": (
        ["replay.question_selection=uniform"],
        "no question selection (uniform over buckets)",
    ),
    "random-trajectory": (
        ["replay.trajectory_selection=random"],
        "no trajectory selection (random stored one)",
    ),
    "highest-entropy": (["replay.trajectory_selection=highest_entropy"], "highest-entropy trajectory"),
    "no-shaping": (["loss.policy_shaping=false"], "replayed tokens use the plain ratio w (no w/(w+beta))"),
    "rho-0.25": (["replay.rho=0.25"], "a quarter of each batch from replay"),
    "rho-0.75": (["replay.rho=0.75"], "three quarters of each batch from replay"),
    # the paper's weak-model setting (Llama) replays from the first step: no delayed start
    "exgrpo-weak": (
        ["model.path=builtin:scratchpad-weak", "replay.start_solve_ratio=0.0"],
        "ExGRPO on the weak base model, no delayed start",
    ),
    "grpo-weak": (
        ["model.path=builtin:scratchpad-weak", "replay.enabled=false"],
        "GRPO on the weak base model",
    ),
    # why replay hurts: one change at a time, each against grpo on the same seeds
    "questions-only": (
        ["replay.replay_trajectories=false"],
        "replay the chosen questions with K fresh rollouts, no stored trajectory (the curriculum alone)",
    ),
    "age-2": (
        ["replay.max_age=2"],
        "stored trajectories at most 2 policy versions old (else K fresh rollouts)",
    ),
    "beta-1": (["loss.beta=1.0"], "policy shaping f(w) = w/(w+1) instead of beta = 0.1"),
    "exgrpo-clip-official": (
        ["learners.grad_clip=0.015625", "learners.skip_grad_norm=7.8125"],
        "ExGRPO with grad clip 1.0 and skip 500 in the official units (x 1/64, like the entropy coefficient)",
    ),
    "grpo-clip-official": (
        ["replay.enabled=false", "learners.grad_clip=0.015625", "learners.skip_grad_norm=7.8125"],
        "GRPO with the same rescaled clip and skip thresholds",
    ),
    # where replay might pay
    "equal-fresh": (
        ["trainer.questions_per_step=16", "data.fresh_per_step=8"],
        "ExGRPO with grpo's 8 fresh questions per step plus up to 8 replayed (equal fresh data, 2x batch)",
    ),
}
# every run also measures where its gradient comes from (learners.update.gradient_shares; no effect on training)
DIAGNOSTICS = ["learners.grad_share_every=5"]
# per-step series kept in results.json (the mechanism's curves)
SERIES = {
    "zero_var": "rollout/zero_variance_frac",
    "fresh_zero_var": "rollout/fresh_zero_variance_frac",
    "train_reward": "rollout/mean_reward",
    "entropy": "learner/entropy",
    "grad_norm": "learner/grad_norm",
    "clipped": "learner/clipped_steps",
    "n_replay": "replay/n_replay",
    "share_stored": "learner/grad_share_stored",
    "share_replay_fresh": "learner/grad_share_replay_fresh",
    "share_fresh": "learner/grad_share_fresh",
}
# (a, b): report a - b per seed; ablations are compared with full ExGRPO
PAIRS = [
    ("exgrpo", "grpo"),
    ("exgrpo", "uniform-buckets"),
    ("exgrpo", "random-trajectory"),
    ("exgrpo", "highest-entropy"),
    ("exgrpo", "no-shaping"),
    ("exgrpo", "rho-0.25"),
    ("exgrpo", "rho-0.75"),
    ("exgrpo-weak", "grpo-weak"),
    ("questions-only", "grpo"),
    ("questions-only", "exgrpo"),
    ("age-2", "grpo"),
    ("beta-1", "grpo"),
    ("exgrpo-clip-official", "grpo-clip-official"),
    ("grpo-clip-official", "grpo"),
    ("equal-fresh", "grpo"),
]


def run_one(name: str, seed: int, overrides: list[str], out: Path) -> dict[str, Any]:
    from exgrpo.core.config_files import load_config
    from exgrpo.runtime.recipe import train

    run_dir = out / f"{name}-seed{seed}"
    every = [
        *DIAGNOSTICS,
        *overrides,
        *VARIANTS[name][0],
        f"trainer.seed={seed}",
        f"logging.run_dir={run_dir}",
        "logging.progress=false",
        "logging.plots=false",
        "logging.ray_metrics=false",
    ]
    result = train(load_config(None, every), checkpoints=False)
    records = result.records
    tokens = np.cumsum([0] + [r["rollout/tokens"] for r in records])  # tokens[v]: generated before version v
    curve = [
        {
            "step": int(e["eval/version"]),
            "tokens": int(tokens[int(e["eval/version"])]),
            "all": e["eval/accuracy"],
            "id": e.get(ID),
            "ood": e.get(OOD),
        }
        for e in result.evals
    ]
    chosen = [r["replay/chosen_valid_frac"] for r in records if "replay/chosen_valid_frac" in r]
    return {
        "variant": name,
        "seed": seed,
        "overrides": every,
        "run_dir": str(run_dir),
        "wall_s": result.wall_s,
        "curve": curve,
        "replay_groups": int(sum(r.get("replay/n_replay", 0) for r in records)),
        "chosen_valid_frac": float(np.mean(chosen)) if chosen else None,
        "final_reward": records[-1].get("rollout/mean_reward"),
        "series": series_of(records),
        "retired": records[-1].get("replay/retired"),
    }


def series_of(records: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The SERIES of a run's step records (those it logged). A run logged before the fresh-only zero-variance
    metric existed gets it only if it never replayed (then it equals the batch's share)."""
    fresh, batch = SERIES["fresh_zero_var"], SERIES["zero_var"]
    if not any(fresh in r or r.get("replay/n_replay") for r in records):
        records = [{**r, fresh: r[batch]} if batch in r else r for r in records]
    return {
        name: [r.get(key) for r in records] for name, key in SERIES.items() if any(key in r for r in records)
    }


def backfill_series(results: list[dict[str, Any]]) -> None:
    """Runs recorded without series (an older sweep) get them from their run directory's metrics.jsonl."""
    for r in results:
        path = Path(r.get("run_dir", "")) / "metrics.jsonl"
        if not r.get("series") and path.is_file():
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            r["series"] = series_of(records)


# -- aggregation ----------------------------------------------------------------------------------------
def _by(results: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    table: dict[str, dict[int, dict[str, Any]]] = {}
    for r in results:
        table.setdefault(r["variant"], {})[r["seed"]] = r
    return table


def _at_step(run: dict[str, Any], step: int, key: str) -> float | None:
    return next((p[key] for p in run["curve"] if p["step"] == step), None)


def _at_tokens(run: dict[str, Any], tokens: float, key: str) -> float:
    """Accuracy at a token budget, linearly interpolated along the run's eval curve."""
    xs = [p["tokens"] for p in run["curve"]]
    ys = [p[key] for p in run["curve"]]
    return float(np.interp(tokens, xs, ys))


def mean_std(values: list[float]) -> tuple[float, float, int]:
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0, len(v)


def paired(diffs: list[float]) -> tuple[float, float, int]:
    """Mean paired difference and its standard error (std with ddof 1 / sqrt(n))."""
    d = np.asarray(diffs, dtype=float)
    se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
    return float(d.mean()), se, len(d)


def format_report(results: list[dict[str, Any]]) -> str:
    by = _by(results)
    steps = sorted({p["step"] for r in results for p in r["curve"]})
    last = steps[-1] if steps else 0
    lines = ["## Held-out accuracy (Avg@n), mean ± std over seeds, at equal learner steps", ""]
    for key, label in (("id", "ID"), ("ood", "OOD"), ("all", "all")):
        lines += [
            f"### {label}",
            "",
            "| variant | seeds | " + " | ".join(f"step {s}" for s in steps) + " |",
            "|---|---|" + "---|" * len(steps),
        ]
        for v, runs in by.items():
            cells = []
            for s in steps:
                vals = [x for x in (_at_step(r, s, key) for r in runs.values()) if x is not None]
                cells.append(f"{mean_std(vals)[0]:.3f} ± {mean_std(vals)[1]:.3f}" if vals else "-")
            lines.append(f"| {v} | {len(runs)} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        f"## Paired differences a − b per seed (mean ± standard error), at step {last} and at equal "
        "generated tokens",
        "",
        "| a − b | seeds | ID (steps) | OOD (steps) | ID (tokens) | OOD (tokens) | token budget |",
        "|---|---|---|---|---|---|---|",
    ]
    for a, b in PAIRS:
        seeds = sorted(set(by.get(a, {})) & set(by.get(b, {})))
        if not seeds:
            continue
        cells = []
        for key in ("id", "ood"):
            d = [_at_step(by[a][s], last, key) - _at_step(by[b][s], last, key) for s in seeds]
            m, se, _ = paired(d)
            cells.append(f"{m:+.3f} ± {se:.3f}")
        budgets = [min(by[a][s]["curve"][-1]["tokens"], by[b][s]["curve"][-1]["tokens"]) for s in seeds]
        for key in ("id", "ood"):
            d = [
                _at_tokens(by[a][s], t, key) - _at_tokens(by[b][s], t, key)
                for s, t in zip(seeds, budgets, strict=True)
            ]
            m, se, _ = paired(d)
            cells.append(f"{m:+.3f} ± {se:.3f}")
        lines.append(f"| {a} − {b} | {len(seeds)} | " + " | ".join(cells) + f" | {np.mean(budgets):.0f} |")
    lines += ["", *mechanism_table(results)]
    lines += [
        "",
        "## Per run",
        "",
        "| variant | seed | wall s | replay groups | chosen valid | final ID | final OOD |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r["curve"][-1]
        cv = "-" if r.get("chosen_valid_frac") is None else f"{r['chosen_valid_frac']:.3f}"
        lines.append(
            f"| {r['variant']} | {r['seed']} | {r['wall_s']:.0f} | {r['replay_groups']} | {cv} | "
            f"{c['id']:.3f} | {c['ood']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def _series_mean(run: dict[str, Any], name: str, *, last: int | None = None) -> float:
    """NaN-aware mean of one per-step series of a run (over its last `last` steps when given)."""
    values = [v for v in run.get("series", {}).get(name, []) if v is not None]
    values = values[-last:] if last else values
    finite = [float(v) for v in values if np.isfinite(float(v))]
    return float(np.mean(finite)) if finite else float("nan")


MECHANISM = (  # (series, over the last N steps or None = all, column)
    ("fresh_zero_var", None, "fresh zero-var"),
    ("zero_var", None, "batch zero-var"),
    ("train_reward", 20, "train reward, last 20"),
    ("entropy", 20, "entropy, last 20"),
    ("grad_norm", None, "grad norm"),
    ("clipped", None, "clipped steps"),
    ("share_stored", None, "grad share: stored"),
    ("share_replay_fresh", None, "replay-fresh"),
    ("share_fresh", None, "fresh"),
)


def mechanism_table(results: list[dict[str, Any]]) -> list[str]:
    """Per variant, the mean over seeds of each run's mean of the mechanism series (NaN-aware)."""
    lines = [
        "## Mechanism: per-step series, mean over steps then over seeds",
        "",
        "| variant | seeds | " + " | ".join(c for _, _, c in MECHANISM) + " |",
        "|---|---|" + "---|" * len(MECHANISM),
    ]
    for v, runs in _by(results).items():
        cells = []
        for name, last, _ in MECHANISM:
            vals = [x for x in (_series_mean(r, name, last=last) for r in runs.values()) if np.isfinite(x)]
            cells.append(f"{np.mean(vals):.3f}" if vals else "-")
        lines.append(f"| {v} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = _by(results)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for ax, key, label in ((axes[0], "id", "ID"), (axes[1], "ood", "OOD")):
        for v, runs in by.items():
            steps = sorted({p["step"] for r in runs.values() for p in r["curve"]})
            stats = [
                mean_std([_at_step(r, s, key) for r in runs.values() if _at_step(r, s, key) is not None])
                for s in steps
            ]
            mean = np.array([m for m, _, _ in stats])
            sd = np.array([sd for _, sd, _ in stats])
            ax.plot(steps, mean, marker="o", ms=3, label=v)
            ax.fill_between(steps, mean - sd, mean + sd, alpha=0.1)
        ax.set_xlabel("learner step")
        ax.set_ylabel(f"held-out {label} accuracy (mean ± std over seeds)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_mechanism(results: list[dict[str, Any]], path: Path, *, window: int = 10) -> None:
    """Per variant, the mean over seeds of each mechanism series by step (moving average of `window` steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("fresh_zero_var", "zero-variance share of fresh groups"),
        ("entropy", "token entropy"),
        ("train_reward", "reward of fresh rollouts (replay groups' too)"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4))
    for ax, (name, label) in zip(axes, panels, strict=True):
        for v, runs in _by(results).items():
            rows = [
                [np.nan if x is None else float(x) for x in r.get("series", {}).get(name, [])]
                for r in runs.values()
            ]
            rows = [row for row in rows if row]
            if not rows:
                continue
            n = min(len(row) for row in rows)
            mean = np.nanmean(np.array([row[:n] for row in rows]), axis=0)  # (steps,)
            smooth = np.convolve(
                np.nan_to_num(mean, nan=np.nanmean(mean)), np.ones(window) / window, mode="valid"
            )
            ax.plot(np.arange(len(smooth)) + window, smooth, label=v)
        ax.set_xlabel("learner step")
        ax.set_title(label, fontsize=9)
        ax.set_ylabel(f"mean over seeds, {window}-step average", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m exgrpo.experiments.compare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="runs/compare")
    parser.add_argument(
        "--report", metavar="DIR", help="only write table.md and curves.png from DIR/results.json"
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = Path(args.report or args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results: list[dict[str, Any]] = json.loads(results_path.read_text()) if results_path.exists() else []
    backfill_series(results)
    t0 = time.perf_counter()
    if not args.report:
        from exgrpo.core.config_files import load_config
        from exgrpo.runtime.env import init_ray

        init_ray(load_config(None, args.overrides))
        done = {(r["variant"], r["seed"]) for r in results}
        for seed in args.seeds:  # seeds outermost: a partial sweep still compares every variant
            for name in args.variants:
                if (name, seed) in done:
                    continue
                log.info("run %s seed %d", name, seed)
                results.append(run_one(name, seed, list(args.overrides), out))
                results_path.write_text(json.dumps(results, indent=1))  # resumable sweep
                (out / "table.md").write_text(format_report(results))
    (out / "table.md").write_text(format_report(results))
    plot(results, out / "curves.png")
    if any(r.get("series") for r in results):
        plot_mechanism(results, out / "mechanism.png")
    print(format_report(results))
    print(f"sweep wall time this invocation: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
