"""Step 4 of the loop (docs/architecture.md, "One step"): each replay group's slot 0.

Every replayed question's stored trajectory with the lowest entropy under the current learner weights goes
into slot 0 of its group (`replay.trajectory_selection`; "random" picks one uniformly). The learners score and
pick inside the update call (`TrainBatch.select`, `exgrpo.core.selection.fill_slots`), so the scores are taken
under the weights of the updates queued before it; the `Mixer` sends the replay groups with their candidates
and, once the update landed, rebuilds the batch the learners trained from the picks they return.

Every replay group's candidates go to `observer.on_candidates` (the run's `candidates.jsonl`: entropy where
scored, age, which one was chosen). With a `trace_check` (measurement only: is a response's reasoning trace fully
valid?) every candidate is scored (also under "random") and checked, and the step gets the shares of valid
chosen and candidate traces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exgrpo.core import metric_names as M
from exgrpo.core.config import Config
from exgrpo.core.records import Group, Prompt, Selection, TrainBatch, UpdateResult
from exgrpo.core.roles import RunObserver
from exgrpo.core.selection import place_picks, replay_candidates
from exgrpo.loop.steps import candidate_rows


@dataclass(frozen=True)
class MixedGroups:
    """A step's groups as they go to the update (`Mixer.mix`)."""

    groups: tuple[Group, ...]  # replay groups still carry their candidates
    select: Selection | None  # the selection the learners apply inside the update; None: no replay group


class Mixer:
    """Slot 0 of a step's replay groups: left to the learners (`mix`) and read back from their picks
    (`trained`)."""

    def __init__(
        self,
        *,
        cfg: Config,
        prompts: Mapping[str, Prompt],
        observer: RunObserver,
        trace_check: Callable[[Prompt, str], bool] | None,
    ) -> None:
        self.mode: Selection = cfg.replay.trajectory_selection
        self.seed = cfg.trainer.seed
        self.prompts, self.observer, self.trace_check = prompts, observer, trace_check

    def batch_options(self) -> dict[str, Any]:
        """The `TrainBatch` fields of every batch: the seed of random picks, and whether the learners score
        the candidates under "random" too (a trace check logs every candidate's entropy)."""
        return {"select_seed": self.seed, "score_candidates": self.trace_check is not None}

    def mix(self, groups: Sequence[Group]) -> MixedGroups:
        """The step's groups for the update: with replay groups, the learners fill slot 0 (`MixedGroups.select`)."""
        replay = any(g.kind == "replay" for g in groups)
        return MixedGroups(groups=tuple(groups), select=self.mode if replay else None)

    def trained(
        self, batch: TrainBatch, result: UpdateResult, *, step: int
    ) -> tuple[TrainBatch, dict[str, float]]:
        """The batch the learners trained on (slot 0 filled from their picks) and its trace metrics."""
        if batch.select is None:
            return batch, {}
        mixed = place_picks(batch.groups, result.picks)
        trained = TrainBatch(groups=tuple(mixed), version=batch.version, clip=batch.clip)
        return trained, self._trace(step, batch.groups, result, mixed)

    def _trace(
        self, step: int, groups: Sequence[Group], result: UpdateResult, mixed: Sequence[Group]
    ) -> dict[str, float]:
        """Every candidate's row to `observer.on_candidates` (by request id; entropies None where nothing scored
        them); with a trace check, also the shares of valid chosen and candidate traces."""
        check = self.trace_check
        flat = replay_candidates(groups)
        valid = None if check is None else [check(self.prompts[c.qid], c.trajectory.text) for c in flat]
        self.observer.on_candidates(
            step=step, rows=candidate_rows(step, groups, result.picks, result.entropies or None, valid)
        )
        if check is None or valid is None:
            return {}
        chosen = [check(self.prompts[g.qid], g.trajectories[0].text) for g in mixed if g.kind == "replay"]
        return {M.CHOSEN_VALID: float(np.mean(chosen)), M.CANDIDATES_VALID: float(np.mean(valid))}
