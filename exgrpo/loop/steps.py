"""One step's plan (`StepPlan`: the requests admitted for it, and its checkpoint form), what its record needs
from the moment its update started (`StepNotes`, over the scheduler's `BatchStart`) and its driver timings (`StepTimes`, mapped to metric names in
`StepTimes.metrics`), the held-out evaluations (`Evaluations`), the cadence rules (`checkpoint_due`, `eval_due`),
and the metrics of a step as plain
functions of what the driver holds: `rollout/` of the batch, `replay/` occupancy, `eval/` of a held-out
evaluation (docs/metrics.md), and the rows of the replay candidates a trace check scored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exgrpo.core import metric_names as M
from exgrpo.core.config import TrainerConfig
from exgrpo.core.records import (
    CORRECT_ABOVE,
    Group,
    Prompt,
    ReplayStats,
)
from exgrpo.core.roles import Rollouts


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

    def state_dict(self) -> dict[str, Any]:
        """JSON-able; a checkpoint holds only drained plans (every request done)."""
        return {
            "step": self.step,
            "admitted_version": self.admitted_version,
            "request_ids": sorted(self.request_ids),
            "n_fresh": self.n_fresh,
            "n_replay": self.n_replay,
            "available": self.available,
            "replaced": self.replaced,
            "tokens": self.tokens,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> StepPlan:
        """A drained plan back from `state_dict` (its requests all done)."""
        ids = set(state["request_ids"])
        return cls(
            step=state["step"],
            admitted_version=state["admitted_version"],
            request_ids=ids,
            n_fresh=state["n_fresh"],
            n_replay=state["n_replay"],
            available=state["available"],
            replaced=state.get("replaced", 0),
            done=set(ids),
            tokens=state["tokens"],
        )


@dataclass(frozen=True)
class BatchStart:
    """What the scheduler says of a step as its update starts (`exgrpo.loop.scheduler.Scheduler.start_batch`)."""

    plan: StepPlan
    solve: float  # the fresh solve ratio
    clip: bool  # PPO clipping on fresh tokens: on until the step after the delayed start
    replay: dict[str, float]  # replay/ metrics as the step's groups were pulled


@dataclass(frozen=True)
class StepNotes:
    """What a step's record takes from the moment its update started (its update may finish steps later)."""

    start: BatchStart  # the scheduler's
    staleness: list[int]  # per group: the batch's version minus the group's oldest version


@dataclass
class StepTimes:
    """A step's driver timings in seconds (docs/metrics.md), filled as the step goes: `metrics` is the one place
    that names them. The `*_at` fields are `time.perf_counter()` instants."""

    started_at: float  # when the step started
    wait_s: float  # from the step's start until its groups were pulled
    issued_at: float  # when its update started
    landed_at: float | None = None  # when the update was first seen finished
    gap_s: float = math.nan  # the learners' idle time before this update (NaN for the first)
    sync_s: float = 0.0  # the broadcast of the weights it made
    step_s: float = 0.0  # wall time since the previous step's record

    @property
    def loop_s(self) -> float:
        """From the step's start until its update started: the driver's own time."""
        return self.issued_at - self.started_at

    @property
    def update_s(self) -> float:
        assert self.landed_at is not None, "an update's time before it was seen finished"
        return self.landed_at - self.issued_at

    def metrics(self) -> dict[str, float]:
        """The `system/` timing metrics of the step's record."""
        return {
            M.STEP_TIME: self.step_s,
            M.WAIT_TIME: self.wait_s,
            M.UPDATE_TIME: self.update_s,
            M.UPDATE_GAP: self.gap_s,
            M.SYNC_TIME: self.sync_s,
            M.IDLE_TIME: max(0.0, self.loop_s - self.wait_s),
        }


def _every_and_last(every: int, *, done: int, steps: int) -> bool:
    return bool(every and done % every == 0) or done == steps


def checkpoint_due(trainer: TrainerConfig, *, done: int, steps: int) -> bool:
    """Whether a checkpoint follows the step that completes `done` steps of `steps`: every
    `trainer.checkpoint_every` steps (0: none on the way) and after the last."""
    return _every_and_last(trainer.checkpoint_every, done=done, steps=steps)


def eval_due(trainer: TrainerConfig, *, done: int, steps: int) -> bool:
    """Whether the held-out evaluation runs with the record of the step that completes `done` steps of `steps`:
    every `trainer.eval_every` steps (0: none on the way) and after the last."""
    return _every_and_last(trainer.eval_every, done=done, steps=steps)


def solve_ratio(groups: Sequence[Group]) -> float:
    correct = [t.correct for g in groups for t in g.trajectories if not t.replayed]
    return float(np.mean(correct)) if correct else 0.0


def zero_variance_share(groups: Sequence[Group], *, default: float) -> float:
    """Share of the fresh groups whose rewards are all equal (no signal); `default` when there are none."""
    flat = [len({t.reward for t in g.trajectories}) == 1 for g in groups if g.kind == "fresh"]
    return float(np.mean(flat)) if flat else default


def rollout_metrics(
    groups: Sequence[Group], plan: StepPlan, *, solve_ratio: float, wall_s: float
) -> dict[str, float]:
    """`rollout/` and the batch's mix (docs/metrics.md); `wall_s`: seconds since the previous step ended."""
    fresh = [t for g in groups for t in g.trajectories if not t.replayed]
    flat = [len({t.reward for t in g.trajectories}) == 1 for g in groups]
    return {
        M.MEAN_REWARD: float(np.mean([t.reward for t in fresh])) if fresh else 0.0,
        M.SOLVE_RATIO: solve_ratio,
        M.TOKENS: plan.tokens,
        M.REWARD_FAILURES: plan.reward_failures,
        M.ROLLOUTS: len(fresh),
        M.REWARD_FAILURE_SHARE: min(plan.reward_failures / len(fresh), 1.0) if fresh else 0.0,
        M.TOKENS_PER_S: plan.tokens / max(wall_s, 1e-9),
        M.GROUPS_PER_S: len(groups) / max(wall_s, 1e-9),
        M.ZERO_VARIANCE_FRAC: float(np.mean(flat)),
        M.FRESH_ZERO_VARIANCE_FRAC: zero_variance_share(groups, default=float("nan")),
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


@dataclass
class Evaluations:
    """The run's held-out questions, scored with `n` samples each (`run`), and every evaluation so far."""

    prompts: tuple[Prompt, ...]
    n: int
    history: list[dict[str, Any]] = field(default_factory=list)  # eval/ metrics + per-question Avg@n, sources

    def run(self, rollouts: Rollouts, *, version: int) -> dict[str, float]:
        """Score the held-out questions on the samplers at `version`: the eval/ metrics ({} without questions)."""
        if not self.prompts:
            return {}
        scores = rollouts.evaluate(prompts=self.prompts, n=self.n)
        out, per_question = eval_metrics(self.prompts, scores, version=version)
        self.history.append({**out, **per_question})
        return out


def eval_metrics(
    evaluation: Sequence[Prompt], scores: Sequence[Sequence[float]], *, version: int
) -> tuple[dict[str, float], dict[str, list[Any]]]:
    """`eval/` metrics of one held-out evaluation (Avg@n: the mean reward; Pass@n: the share of questions with
    a sample whose reward is above `CORRECT_ABOVE`; Avg@n per data source when there are several), and its
    per-question Avg@n in eval order with the sources: the paired standard error of a gain between two
    evaluations needs them."""
    out = {
        M.EVAL_ACCURACY: float(np.mean([np.mean(s) for s in scores])),
        M.EVAL_PASS: float(np.mean([max(s) > CORRECT_ABOVE for s in scores])),
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


def candidate_rows(
    step: int,
    groups: Sequence[Group],
    picks: Sequence[int],
    entropies: Sequence[float] | None,
    valid: Sequence[bool] | None,
) -> list[dict[str, Any]]:
    """One row per candidate of the replay groups (`entropies` and `valid` in `replay_candidates` order, None
    where not measured), sorted by request id then candidate: what `RunObserver.on_candidates` receives.
    `picks[j]`: the candidate the learners put in slot 0 of the j-th replay group; its row has `chosen` true."""
    replay = [g for g in groups if g.kind == "replay"]
    if len(picks) != len(replay):
        raise ValueError(f"{len(picks)} picks for {len(replay)} replay groups")
    rows, i = [], 0
    for g, pick in zip(replay, picks, strict=True):
        for j, c in enumerate(g.candidates):
            rows.append(
                {
                    "step": step,
                    "request_id": g.request_id,
                    "qid": g.qid,
                    "candidate": j,
                    "entropy": None if entropies is None else float(entropies[i]),
                    "valid": None if valid is None else bool(valid[i]),
                    "chosen": j == pick,
                    "tokens": len(c.response_ids),
                    "policy_version": c.policy_version,
                }
            )
            i += 1
    return sorted(rows, key=lambda r: (r["request_id"], r["candidate"]))
