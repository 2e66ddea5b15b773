"""Step 4 of the loop (docs/architecture.md, "One step"): each replay group's slot 0.

Every replayed question's stored trajectory with the lowest entropy under the current learner weights goes
into slot 0 of its group (`replay.trajectory_selection`; "random" picks one uniformly). By default the
learners score and pick inside the update call (`TrainBatch.select`, `async.select_on_learners`): the
`Mixer` leaves slot 0 empty, and once the update finished it rebuilds the batch the learners trained from
the scores they return, with the same deterministic argmin. Otherwise it scores the candidates itself,
through `Learners.start_entropies` (queued behind the updates in flight, so under the weights they produce).

Every replay group's candidates go to `observer.on_candidates` (the run's `candidates.jsonl`: entropy where
scored, age, which one was chosen). With a `trace_check` (measurement only: is a response's reasoning trace fully
valid?) every candidate is scored and checked, and the step gets the shares of valid chosen and candidate traces.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exgrpo.core import metric_names as M
from exgrpo.core.config import Config
from exgrpo.core.records import Group, Prompt, Selection, TrainBatch
from exgrpo.core.roles import Learners, Pending, RunObserver
from exgrpo.core.selection import fill_replay_slots, replay_candidates
from exgrpo.loop.steps import candidate_rows


@dataclass(frozen=True)
class MixedGroups:
    """A step's groups as they go to the update (`Mixer.mix`)."""

    groups: tuple[Group, ...]  # slot 0 filled here, or (with `select`) still carrying their candidates
    select: Selection | None  # the selection the learners apply inside the update; None: slot 0 is filled
    scoring_s: float  # the driver's scoring of the candidates (0 when the learners score them)
    trace_metrics: Mapping[str, float]  # with a trace check: the shares of valid chosen and candidate traces


class Mixer:
    """Slot 0 of a step's replay groups: filled here, or left to the learners and read back (`trained`)."""

    def __init__(
        self,
        *,
        cfg: Config,
        learners: Learners,
        prompts: Mapping[str, Prompt],
        observer: RunObserver,
        trace_check: Callable[[Prompt, str], bool] | None,
    ) -> None:
        self.mode = cfg.replay.trajectory_selection
        self.on_learners = cfg.async_.select_on_learners
        self.learners, self.prompts, self.observer, self.trace_check = (
            learners,
            prompts,
            observer,
            trace_check,
        )
        # its own stream, so draws do not depend on how admissions and mixes interleave (which the overlap
        # of updates and the samplers' timing change); checkpointed with the driver
        self.rng = np.random.default_rng([cfg.trainer.seed, 2])

    def mix(self, groups: Sequence[Group], *, step: int, wait: Callable[[Pending[Any]], Any]) -> MixedGroups:
        """Fill slot 0 of each replay group, or leave that to the learners (`MixedGroups.select`). `wait` awaits
        a learner call (the driver's, which receives the samplers' results meanwhile)."""
        if not any(g.kind == "replay" for g in groups):
            return MixedGroups(groups=tuple(groups), select=None, scoring_s=0.0, trace_metrics={})
        if self.mode != "random" and self.on_learners:
            return MixedGroups(groups=tuple(groups), select=self.mode, scoring_s=0.0, trace_metrics={})
        t0 = time.perf_counter()
        flat = replay_candidates(groups)
        scored = self.mode != "random" or self.trace_check is not None  # a trace check reports every entropy
        ent = wait(self.learners.start_entropies(candidates=flat)) if scored else [0.0] * len(flat)
        mixed = fill_replay_slots(groups, ent, mode=self.mode, rng=self.rng)
        seconds = time.perf_counter() - t0
        trace = self._trace(step, groups, ent if scored else None, mixed)
        return MixedGroups(groups=tuple(mixed), select=None, scoring_s=seconds, trace_metrics=trace)

    def trained(
        self, batch: TrainBatch, *, step: int, entropies: Sequence[float]
    ) -> tuple[TrainBatch, dict[str, float]]:
        """The batch the learners trained on, for a batch sent with `select` (slot 0 filled from their scores,
        as they filled it), and its trace metrics."""
        assert batch.select is not None
        mixed = fill_replay_slots(batch.groups, entropies, mode=batch.select)  # as the learners did
        trained = TrainBatch(groups=tuple(mixed), version=batch.version, clip=batch.clip)
        return trained, self._trace(step, batch.groups, entropies, mixed)

    def _trace(
        self, step: int, groups: Sequence[Group], ent: Sequence[float] | None, mixed: Sequence[Group]
    ) -> dict[str, float]:
        """Every candidate's row to `observer.on_candidates` (by request id; `ent` None where nothing scored
        them); with a trace check, also the shares of valid chosen and candidate traces."""
        check = self.trace_check
        flat = replay_candidates(groups)
        valid = None if check is None else [check(self.prompts[c.qid], c.trajectory.text) for c in flat]
        self.observer.on_candidates(step=step, rows=candidate_rows(step, groups, mixed, ent, valid))
        if check is None or valid is None:
            return {}
        chosen = [check(self.prompts[g.qid], g.trajectories[0].text) for g in mixed if g.kind == "replay"]
        return {M.CHOSEN_VALID: float(np.mean(chosen)), M.CANDIDATES_VALID: float(np.mean(valid))}
