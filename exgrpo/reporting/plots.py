"""The run's plots (`plots/*.png`, inlined in report.html): reward, the held-out figure, replay buckets,
staleness, the step-time split and weight sync, drawn from metrics.jsonl's rows with matplotlib (Agg).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from exgrpo.core import metric_names as M

# the stacked step-time split: (name, metric key), in stacking order
TIME_SPLIT = (
    ("generation_wait", M.WAIT_TIME),
    ("update", M.UPDATE_TIME),
    ("sync", M.SYNC_TIME),
    ("idle", M.IDLE_TIME),
)


HELDOUT = "held-out accuracy"  # the held-out figure's name for a 0 / 1 reward (the summary's `heldout_name`)


def figure_titles(heldout: str = HELDOUT) -> dict[str, tuple[str, str]]:
    """Figures of the report: name -> (title, what it shows); PNG names in plots/ are the keys. `heldout`: the
    held-out figure's name as the summary gives it (a custom reward's is "held-out mean reward")."""
    return {
        "reward": (
            f"Reward and {heldout}",
            "fresh rollouts' mean reward and solve ratio per step; "
            "held-out Avg@n after each evaluation (x = policy version = steps done)",
        ),
        "eval_accuracy": (
            heldout[0].upper() + heldout[1:],
            "Avg@n (mean reward) and Pass@n: share of questions with a sample of reward > 0.5, on the held-out "
            "set by policy version (docs/metrics.md)",
        ),
        "buckets": ("Replay buckets", "questions per correctness bucket k/K (stacked) and retired questions"),
        "staleness": ("Staleness", "training version minus sampling version over each batch"),
        "step_time": ("Step-time split", "where each step's wall time went (stacked)"),
        "weight_sync": ("Weight sync", "driver-side broadcast time and the samplers' mean weight-load time"),
    }


FIGURES = figure_titles()


def render_figures(
    records: Sequence[dict[str, Any]], evals: Sequence[dict[str, float]], *, heldout: str = HELDOUT
) -> dict[str, bytes]:
    """The run's plots as PNG bytes (matplotlib, Agg); `heldout`: the held-out figure's name (`figure_titles`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r[M.STEP] for r in records]

    def series(key: str) -> list[float]:
        return [float(r.get(key) or 0) for r in records]

    def png(fig: Any, ax: Any, ylabel: str, xlabel: str = "step") -> bytes:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        return buf.getvalue()

    out: dict[str, bytes] = {}
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, series(M.MEAN_REWARD), label=M.MEAN_REWARD)
    ax.plot(steps, series(M.SOLVE_RATIO), label=M.SOLVE_RATIO)
    if evals:
        ax.plot(
            [e.get("eval/version", 0) for e in evals],
            [e[M.EVAL_ACCURACY] for e in evals],
            marker="o",
            label=f"{M.EVAL_ACCURACY} ({heldout})",
        )
    out["reward"] = png(fig, ax, "reward")
    if evals:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        versions = [e.get("eval/version", 0) for e in evals]
        ax.plot(versions, [e[M.EVAL_ACCURACY] for e in evals], marker="o", label=M.EVAL_ACCURACY)
        if all(M.EVAL_PASS in e for e in evals):
            ax.plot(versions, [e[M.EVAL_PASS] for e in evals], marker="s", label=M.EVAL_PASS)
        out["eval_accuracy"] = png(fig, ax, heldout, "policy version")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bucket_keys = sorted(
        (k for k in records[-1] if k.startswith("replay/bucket_")), key=lambda k: int(k.rsplit("_", 1)[-1])
    )
    if bucket_keys:
        ax.stackplot(steps, [series(k) for k in bucket_keys], labels=bucket_keys, alpha=0.8)
    ax.plot(steps, series(M.RETIRED), color="black", label=M.RETIRED)
    out["buckets"] = png(fig, ax, "questions")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, series(M.STALENESS_MEAN), label=M.STALENESS_MEAN)
    ax.plot(steps, series(M.STALENESS_MAX), label=M.STALENESS_MAX, drawstyle="steps-mid")
    out["staleness"] = png(fig, ax, "versions")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.stackplot(
        steps, [series(key) for _, key in TIME_SPLIT], labels=[key for _, key in TIME_SPLIT], alpha=0.85
    )
    out["step_time"] = png(fig, ax, "seconds")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, series(M.SYNC_TIME), label=M.SYNC_TIME)
    ax.plot(steps, series(M.WEIGHT_LOAD), label=M.WEIGHT_LOAD)
    out["weight_sync"] = png(fig, ax, "seconds")
    return out
