"""What replay did in each run of a sweep: its reach, read from the run directories.

    python -m bench.analysis.reach runs/sweeps/e1-2ep [more sweep dirs] [--json reach.json]

Per variant: replay groups, distinct questions replayed, replays per question, trajectory ages, w*, token entropy,
the fresh zero-variance share, the rare-success questions (k = 1..2 at first sight) and how many were revisited and
later solved, and the bucket histogram; where each comes from: docs/benchmarks.md, "Sweep analyses".
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.analysis.sweeps import refuse_missing, run_dir_of, sweeps_parser
from exgrpo.core import metric_names as M

SNAPSHOTS = (25, 50, 75)  # steps whose bucket histogram is shown (and the last one)
RARE = (1, 2)  # a rare success: this many of the first group's rollouts correct
CORRECT_ABOVE = 0.5  # a rollout is correct when its reward is above this (the runs' rule)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def buckets_at(record: dict[str, Any], k_rollouts: int) -> str:
    """`1:57 2:18 ...`: questions per bucket k (the replay/bucket_k keys of one step record)."""
    return " ".join(f"{k}:{record.get(M.REPLAY_BUCKET.format(k=k), 0)}" for k in range(1, k_rollouts))


def replayed_from_wal(run_dir: Path) -> Counter[str]:
    """qid -> replay requests that asked it, from the pushes in the replay shards' write-ahead logs (a run
    without `candidates.jsonl`). Counts what the logs still hold: a shard that
    compacted its log into a snapshot (`replay.wal_compact_mb`) keeps only the pushes after it."""
    from buffers.wal import read_frames

    requests: dict[int, str] = {}
    for path in sorted((run_dir / "replay-wal").rglob("log-*.wal")):
        for table in read_frames(path)[0]:
            if (table.schema.metadata or {}).get(b"exgrpo.op") != b"push" or "kind" not in table.column_names:
                continue
            rows = zip(*(table.column(c).to_pylist() for c in ("request_id", "qid", "kind")), strict=True)
            requests.update((rid, qid) for rid, qid, kind in rows if kind == "replay")
    return Counter(requests.values())


def groups_from_wal(run_dir: Path) -> dict[str, list[tuple[str, int, int]]]:
    """qid -> its groups in request order, each (kind, correct rollouts, rollouts), counting the rollouts sampled
    for the group (role `trajectory`), not a replayed stored trajectory. Empty for logs without rewards."""
    from buffers.wal import read_frames

    groups: dict[int, tuple[str, str, list[float]]] = {}
    for path in sorted((run_dir / "replay-wal").rglob("log-*.wal")):
        for table in read_frames(path)[0]:
            if (table.schema.metadata or {}).get(b"exgrpo.op") != b"push":
                continue
            if not {"reward", "role", "kind"} <= set(table.column_names):
                return {}
            cols = (table.column(c).to_pylist() for c in ("request_id", "qid", "kind", "role", "reward"))
            for rid, qid, kind, role, reward in zip(*cols, strict=True):
                if role == "trajectory":
                    groups.setdefault(rid, (qid, kind, []))[2].append(reward)
    out: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for rid in sorted(groups):
        qid, kind, rewards = groups[rid]
        out[qid].append((kind, sum(r > CORRECT_ABOVE for r in rewards), len(rewards)))
    return dict(out)


def rare_successes(groups: dict[str, list[tuple[str, int, int]]]) -> dict[str, int | None]:
    """The questions asked more than once; those whose first group had a rare success (`RARE`), how many of them
    were asked again, and how many of those had at least half of their last group's rollouts correct."""
    if not groups:
        return {"asked_again": None, "rare": None, "rare_revisited": None, "rare_later_solved": None}
    rare = [g for g in groups.values() if g[0][1] in RARE]
    again = [g for g in rare if len(g) > 1]
    solved = [g for g in again if 2 * g[-1][1] >= g[-1][2]]
    return {
        "asked_again": sum(len(g) > 1 for g in groups.values()),  # replayed, revisited, or a later epoch's
        "rare": len(rare),
        "rare_revisited": len(again),
        "rare_later_solved": len(solved),
    }


def _series_mean(records: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in records if r.get(key) is not None]
    return float(np.mean(vals)) if vals else None


def run_reach(run_dir: Path, k_rollouts: int) -> dict[str, Any]:
    """The reach of one run (see the module doc)."""
    records = [r for r in _jsonl(run_dir / "metrics.jsonl") if M.STEP in r and M.N_REPLAY in r]
    chosen: dict[tuple[int, int], tuple[float, int, str]] = {}  # (step, request) -> (entropy, age, qid)
    for c in _jsonl(run_dir / "candidates.jsonl"):
        key = (c["step"], c["request_id"])
        age = c["step"] - c["policy_version"]  # the step's update starts from version = step
        if "chosen" in c:  # logged with the pick
            if c["chosen"]:
                chosen[key] = (c["entropy"] or 0.0, age, c["qid"])
        elif key not in chosen or c["entropy"] < chosen[key][0]:  # older logs: entropy selection's pick
            chosen[key] = (c["entropy"], age, c["qid"])
    per_q = Counter(qid for _, _, qid in chosen.values()) if chosen else replayed_from_wal(run_dir)
    ages = np.array([a for _, a, _ in chosen.values()], dtype=float)
    ratios = np.array([r.get(M.RATIO_REPLAY) for r in records if r.get(M.N_REPLAY)], dtype=float)  # None: NaN
    ratios = ratios[np.isfinite(ratios)]
    by_step = {r[M.STEP]: r for r in records}
    last = max(by_step) if by_step else None
    return {
        "run_dir": str(run_dir),
        "replay_groups": int(sum(r[M.N_REPLAY] for r in records)),
        "distinct_replayed": len(per_q) if per_q else None,
        "replays_per_question": float(np.mean(list(per_q.values()))) if per_q else None,
        "max_replays_of_a_question": max(per_q.values()) if per_q else None,
        "age_p50": float(np.percentile(ages, 50)) if ages.size else None,
        "age_p90": float(np.percentile(ages, 90)) if ages.size else None,
        "age_max": float(ages.max()) if ages.size else None,
        "ratio_p10": float(np.percentile(ratios, 10)) if ratios.size else None,
        "ratio_p50": float(np.percentile(ratios, 50)) if ratios.size else None,
        "ratio_p90": float(np.percentile(ratios, 90)) if ratios.size else None,
        "retired": records[-1].get(M.RETIRED) if records else None,
        "entropy": _series_mean(records, M.ENTROPY),
        "fresh_zero_var": _series_mean(records, M.FRESH_ZERO_VARIANCE_FRAC),
        **rare_successes(groups_from_wal(run_dir)),
        "buckets": {
            str(s): buckets_at(by_step[s], k_rollouts)
            for s in (*SNAPSHOTS, last)
            if s is not None and s in by_step
        },
    }


def sweep_reach(sweep: Path) -> dict[str, list[dict[str, Any]]]:
    """variant -> the reach of each of its runs, from a compare sweep's results.json (a run directory that is
    missing raises)."""
    from exgrpo.core.config_files import load_config

    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in json.loads((sweep / "results.json").read_text()):
        overrides = [o for o in r["overrides"] if not o.startswith("logging.run_dir=")]
        k = load_config(r.get("config"), overrides).trainer.rollouts_per_question
        out[r["variant"]].append({"seed": r["seed"], **run_reach(run_dir_of(sweep, r), k)})
    return dict(out)


def _mean(runs: list[dict[str, Any]], key: str) -> str:
    vals = [r[key] for r in runs if r.get(key) is not None]
    if not vals:
        return "-"
    mean = float(np.mean(vals))
    return f"{mean:.0f}" if abs(mean) >= 100 else f"{mean:.3g}"


def format_reach(name: str, reach: dict[str, list[dict[str, Any]]]) -> str:
    cols = ("replay_groups", "distinct_replayed", "replays_per_question", "max_replays_of_a_question",
            "age_p50", "age_p90", "age_max", "ratio_p10", "ratio_p50", "ratio_p90", "retired", "entropy",
            "fresh_zero_var", "asked_again", "rare", "rare_revisited", "rare_later_solved")  # fmt: skip
    lines = [
        f"### {name}",
        "",
        "| variant | seeds | " + " | ".join(cols) + " | buckets (seed 0) |",
        "|---|---|" + "---|" * (len(cols) + 1),
    ]
    for variant, runs in reach.items():
        first = min(runs, key=lambda r: r["seed"])["buckets"]
        hist = "; ".join(f"step {s}: {h}" for s, h in first.items())
        lines.append(
            f"| {variant} | {len(runs)} | " + " | ".join(_mean(runs, c) for c in cols) + f" | {hist} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = sweeps_parser("python -m bench.analysis.reach", __doc__)
    parser.add_argument("--json", type=Path, help="also write every run's reach here")
    args = parser.parse_args(argv)
    if refuse_missing(args.sweeps):
        return 2
    everything = {str(s): sweep_reach(s) for s in args.sweeps}
    for name, reach in everything.items():
        print(format_reach(name, reach))
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
