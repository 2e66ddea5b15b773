"""Tables and plots of a compare sweep, as plain functions of its results.json records: paired differences
at equal learner steps and at equal generated tokens, the mechanism table (per-step series such as the
fresh zero-variance share, entropy, clipped steps and the gradient's split by row origin), curves.png and
mechanism.png. `python -m exgrpo.experiments.compare --report DIR` rewrites them from DIR/results.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

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
    "ratio_replay": "learner/ratio_replay",
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
    # the three channels of a replay group (docs/results.md): the stored row's own gradient, the baseline shift
    # of its place in the group mean, the curriculum of re-asked questions
    ("exgrpo", "beta-100"),
    ("beta-100", "questions-only"),
    ("beta-100", "grpo"),
    ("mu-2", "grpo"),
    ("mu-2-beta-1", "grpo"),
    ("zero-var-rho", "grpo"),
    ("zero-var-rho", "exgrpo"),
]


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
def by_variant(results: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """A sweep's results as {variant: {seed: result}}."""
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


def split_keys(results: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The curve keys a report compares on: ID and OOD when the evaluation had them (the embedded task's two
    sources), else the accuracy over all held-out questions (a task of one source)."""
    split = [(k, label) for k, label in (("id", "ID"), ("ood", "OOD")) if _has(results, k)]
    return split or [("all", "all")]


def _has(results: list[dict[str, Any]], key: str) -> bool:
    return any(p.get(key) is not None for r in results for p in r["curve"])


def format_report(results: list[dict[str, Any]]) -> str:
    by = by_variant(results)
    steps = sorted({p["step"] for r in results for p in r["curve"]})
    last = steps[-1] if steps else 0
    keys = split_keys(results)
    lines = [
        "## Accuracy on data.eval (Avg@n: validation or held-out), mean ± std over seeds, at equal learner steps",
        "",
    ]
    for key, label in (("id", "ID"), ("ood", "OOD"), ("all", "all")):
        if not _has(results, key):
            continue
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
        "| a − b | seeds | "
        + " | ".join(f"{label} ({unit})" for unit in ("steps", "tokens") for _, label in keys)
        + " | token budget |",
        "|---|---|" + "---|" * (2 * len(keys) + 1),
    ]
    for a, b in PAIRS:
        seeds = sorted(set(by.get(a, {})) & set(by.get(b, {})))
        if not seeds:
            continue
        cells = []
        for key, _ in keys:
            d = [_at_step(by[a][s], last, key) - _at_step(by[b][s], last, key) for s in seeds]
            m, se, _ = paired(d)
            cells.append(f"{m:+.3f} ± {se:.3f}")
        budgets = [min(by[a][s]["curve"][-1]["tokens"], by[b][s]["curve"][-1]["tokens"]) for s in seeds]
        for key, _ in keys:
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
        "| variant | seed | wall s | replay groups | chosen valid | "
        + " | ".join(f"final {label}" for _, label in keys)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(keys),
    ]
    for r in results:
        c = r["curve"][-1]
        cv = "-" if r.get("chosen_valid_frac") is None else f"{r['chosen_valid_frac']:.3f}"
        finals = " | ".join(f"{c[key]:.3f}" for key, _ in keys)
        lines.append(
            f"| {r['variant']} | {r['seed']} | {r['wall_s']:.0f} | {r['replay_groups']} | {cv} | {finals} |"
        )
    return "\n".join(lines) + "\n"


def series_mean(run: dict[str, Any], name: str, *, last: int | None = None) -> float:
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
    for v, runs in by_variant(results).items():
        cells = []
        for name, last, _ in MECHANISM:
            vals = [x for x in (series_mean(r, name, last=last) for r in runs.values()) if np.isfinite(x)]
            cells.append(f"{np.mean(vals):.3f}" if vals else "-")
        lines.append(f"| {v} | {len(runs)} | " + " | ".join(cells) + " |")
    return lines


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = by_variant(results)
    keys = split_keys(results)
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4), sharey=False, squeeze=False)
    for ax, (key, label) in zip(axes[0], keys, strict=True):
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
        ax.set_ylabel(f"{label} accuracy on data.eval (mean ± std over seeds)")
    axes[0][0].legend(fontsize=7)
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
        for v, runs in by_variant(results).items():
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
