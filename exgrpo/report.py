"""Terminal progress, the end-of-run summary table and the PNG plots of a run directory."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exgrpo import metrics as M
from exgrpo.fileio import atomic_write_text


class Progress:
    """A tqdm bar showing reward, solve ratio, replay size and held-out accuracy."""

    def __init__(self, *, total: int, enabled: bool = True) -> None:
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc="exgrpo", unit="step", dynamic_ncols=True)

    def update(self, record: dict[str, Any]) -> None:
        if self._bar is None:
            return
        post = {"reward": f"{record.get(M.MEAN_REWARD, 0):.3f}", "solve": f"{record.get(M.SOLVE_RATIO, 0):.3f}",
                "buffer": record.get(M.REPLAY_SIZE, 0), "v": record.get(M.VERSION, 0)}
        if M.EVAL_ACCURACY in record:
            post["eval"] = f"{record[M.EVAL_ACCURACY]:.3f}"
        self._bar.set_postfix(post, refresh=False)
        self._bar.update(1)

    def skip(self, n: int) -> None:
        """Steps already done before a resume."""
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def summary(records: Sequence[dict[str, Any]], evals: Sequence[dict[str, float]], wall_s: float) -> dict[str, Any]:
    last = records[-1] if records else {}
    buckets = {k: v for k, v in last.items() if k.startswith("replay/bucket_")}

    def total(key: str) -> float:
        return float(sum(r.get(key) or 0 for r in records))

    return {
        "steps": len(records),
        "eval_accuracy_before": evals[0][M.EVAL_ACCURACY] if evals else None,
        "eval_accuracy_after": evals[-1][M.EVAL_ACCURACY] if evals else None,
        "tokens": int(total(M.TOKENS)),
        "tokens_per_s": total(M.TOKENS) / max(total(M.STEP_TIME), 1e-9),
        "retired": last.get(M.RETIRED, 0),
        "replay_size": last.get(M.REPLAY_SIZE, 0),
        "buckets": buckets,
        "replay_started": bool(last.get(M.REPLAY_STARTED, 0)),
        "wall_s": wall_s,
        "time_split_s": {k: total(key) for k, key in (("generation_wait", M.WAIT_TIME), ("entropy", M.ENTROPY_TIME),
                                                      ("update", M.UPDATE_TIME), ("sync", M.SYNC_TIME),
                                                      ("idle", M.IDLE_TIME))},
    }


def format_summary(s: dict[str, Any]) -> str:
    def f(x: Any) -> str:
        return f"{x:.3f}" if isinstance(x, float) else str(x)

    rows = [("steps", s["steps"]), ("held-out accuracy before", f(s["eval_accuracy_before"])),
            ("held-out accuracy after", f(s["eval_accuracy_after"])), ("generated tokens", s["tokens"]),
            ("tokens/s (per step time)", f(s["tokens_per_s"])), ("replay started", s["replay_started"]),
            ("replayable questions", s["replay_size"]), ("retired questions", s["retired"]),
            ("buffer per bucket", " ".join(f"{k.split('_')[-1]}:{v}" for k, v in s["buckets"].items()) or "-"),
            ("wall time (s)", f(s["wall_s"]))]
    rows += [(f"  time in {k} (s)", f(v)) for k, v in s["time_split_s"].items()]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def write_report(run_dir: Path, *, records: Sequence[dict[str, Any]], evals: Sequence[dict[str, float]],
                 wall_s: float, plots: bool = True) -> dict[str, Any]:
    s = summary(records, evals, wall_s)
    atomic_write_text(Path(run_dir) / "summary.json", json.dumps(s, indent=2))
    text = format_summary(s)
    atomic_write_text(Path(run_dir) / "summary.txt", text + "\n")
    print(text)
    if plots and records:
        write_plots(Path(run_dir), records, evals)
    return s


def write_plots(run_dir: Path, records: Sequence[dict[str, Any]], evals: Sequence[dict[str, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    steps = [r[M.STEP] for r in records]

    def line(keys: Sequence[str], name: str, ylabel: str) -> None:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key in keys:
            ax.plot(steps, [r.get(key) or 0 for r in records], label=key)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=100)
        plt.close(fig)

    line([M.MEAN_REWARD, M.SOLVE_RATIO], "reward", "reward")
    line(sorted(k for k in records[-1] if k.startswith("replay/bucket_")) + [M.RETIRED], "buckets", "questions")
    line([M.STALENESS_MEAN, M.STALENESS_MAX], "staleness", "versions")
    if evals:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([e["eval/version"] for e in evals], [e[M.EVAL_ACCURACY] for e in evals], marker="o")
        ax.set_xlabel("policy version")
        ax.set_ylabel("held-out accuracy")
        fig.tight_layout()
        fig.savefig(out / "eval_accuracy.png", dpi=100)
        plt.close(fig)
