"""One step's plan (`StepPlan`: the requests admitted for it) and the metrics of a step, as plain functions of what
the driver holds: `rollout/` of the batch, `replay/` occupancy, `eval/` of a held-out evaluation (docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exgrpo.core import metric_names as M
from exgrpo.core.records import (
    Group,
    Prompt,
    ReplayStats,
)


@dataclass
class StepPlan:
    """The requests admitted for one step."""

    step: int
    admitted_version: int
    request_ids: set[int]
    n_fresh: int
    n_replay: int
    available: int = 0  # replayable questions when the step was scheduled
    replaced: int = 0  # replay requests re-issued as fresh (question retired in flight)
    done: set[int] = field(default_factory=set)
    tokens: int = 0
    reward_failures: int = 0  # of the step's rollouts: rewards that timed out or raised (scored 0)


def solve_ratio(groups: Sequence[Group]) -> float:
    correct = [t.correct for g in groups for t in g.trajectories if not t.replayed]
    return float(np.mean(correct)) if correct else 0.0


def rollout_metrics(
    groups: Sequence[Group], plan: StepPlan, *, solve_ratio: float, wall_s: float
) -> dict[str, float]:
    """`rollout/` and the batch's mix (docs/metrics.md); `wall_s`: seconds since the previous step ended."""
    fresh = [t for g in groups for t in g.trajectories if not t.replayed]
    flat = [len({t.reward for t in g.trajectories}) == 1 for g in groups]
    flat_fresh = [f for f, g in zip(flat, groups, strict=True) if g.kind == "fresh"]
    return {
        M.MEAN_REWARD: float(np.mean([t.reward for t in fresh])) if fresh else 0.0,
        M.SOLVE_RATIO: solve_ratio,
        M.TOKENS: plan.tokens,
        M.REWARD_FAILURES: plan.reward_failures,
        M.TOKENS_PER_S: plan.tokens / max(wall_s, 1e-9),
        M.GROUPS_PER_S: len(groups) / max(wall_s, 1e-9),
        M.ZERO_VARIANCE_FRAC: float(np.mean(flat)),
        M.FRESH_ZERO_VARIANCE_FRAC: float(np.mean(flat_fresh)) if flat_fresh else float("nan"),
        M.RESPONSE_LEN: float(np.mean([len(t.response_ids) for t in fresh])) if fresh else 0.0,
        M.N_FRESH: plan.n_fresh,
        M.N_REPLAY: plan.n_replay,
        M.REPLAY_AVAILABLE: plan.available,
        M.REPLACED: plan.replaced,
    }


def replay_metrics(stats: ReplayStats, *, started: bool, k_rollouts: int) -> dict[str, float]:
    """`replay/` occupancy: started flag, replayable and retired questions, stored trajectories, buckets."""
    out: dict[str, float] = {
        M.REPLAY_STARTED: int(started),
        M.REPLAY_SIZE: stats.active,
        M.RETIRED: stats.retired,
        M.TRAJECTORIES: stats.trajectories,
    }
    for k in range(1, k_rollouts):
        out[M.REPLAY_BUCKET.format(k=k)] = stats.bucket_sizes.get(k, 0)
    return out


def eval_metrics(
    evaluation: Sequence[Prompt], scores: Sequence[Sequence[float]], *, version: int
) -> tuple[dict[str, float], dict[str, list[Any]]]:
    """`eval/` metrics of one held-out evaluation (Avg@n and Pass@n, per data source when there are several),
    and its per-question Avg@n in eval order with the sources: the paired standard error of a gain between
    two evaluations needs them."""
    out = {
        M.EVAL_ACCURACY: float(np.mean([np.mean(s) for s in scores])),
        M.EVAL_PASS: float(np.mean([max(s) for s in scores])),
        M.EVAL_VERSION: version,
    }
    sources = sorted({p.data_source for p in evaluation})
    if len(sources) > 1:  # e.g. in-distribution and out-of-distribution questions, scored separately
        for source in sources:
            mine = [np.mean(s) for p, s in zip(evaluation, scores, strict=True) if p.data_source == source]
            out[M.EVAL_ACCURACY_SOURCE.format(source=M.metric_safe(source))] = float(np.mean(mine))
    per_question: dict[str, list[Any]] = {
        "per_question": [float(np.mean(s)) for s in scores],
        "sources": [p.data_source for p in evaluation],
    }
    return out, per_question
