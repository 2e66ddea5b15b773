"""Step 5 of the loop (docs/architecture.md, "One step"): the learners' updates in flight, from issue to landing.

`UpdatePipeline.issue` shuffles a step's groups (seeded, checkpointed), starts the update on the learners and
queues the export of the weights it makes right behind it (`WeightTransport.prepare`), without waiting. Later
calls hand back the results of earlier updates once they finished, oldest first (`land`), and `broadcast`
sends the samplers the version an update made. With `async.overlap_update` several updates may be in flight: the
learners run them in the order they were started, so update t + 1 starts from the weights update t makes. The
version arithmetic is explicit: `version` counts the updates landed, `version_after_inflight` is the version
the next update starts from.

It also times each update (`StepTimes`): when it was started, when it was first seen finished
(`note_landed`, also called while the driver waits for other things), the learners' idle gap before it, the
broadcast, and the wall time between two broadcasts. Imports no Ray.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exgrpo.core.records import Group, Selection, TrainBatch, UpdateResult
from exgrpo.core.roles import Learners, Pending, WeightTransport
from exgrpo.loop.steps import StepNotes, StepTimes


@dataclass
class Update:
    """One step's update: started, then landed (`result` set) once the learners finished it."""

    step: int
    batch: TrainBatch  # as started: with `select`, its replay groups still carry their candidates
    pending: Pending[UpdateResult]
    times: StepTimes
    notes: StepNotes
    result: UpdateResult | None = None


class UpdatePipeline:
    """The updates started and not yet landed, oldest first, and the learners' version."""

    def __init__(
        self,
        *,
        learners: Learners,
        weights: WeightTransport,
        seed: int,
        batch_options: dict[str, Any] | None = None,
    ) -> None:
        """`batch_options`: `TrainBatch` fields every batch carries (the weight checks' asks of the learners)."""
        self.learners, self.weights = learners, weights
        self.version = 0  # the learners' version: updates landed (what the samplers get at `broadcast`)
        self.shuffle_rng = np.random.default_rng([seed, 1])  # mini-batch shuffle
        self._inflight: list[Update] = []
        self._last_landed: float | None = None  # when the previous update was seen finished
        self._last_broadcast = time.perf_counter()
        self.batch_options = dict(batch_options or {})

    @property
    def in_flight(self) -> int:
        """Updates started and not yet landed."""
        return len(self._inflight)

    @property
    def version_after_inflight(self) -> int:
        """The version the next update starts from: every update in flight lands before it on the learners."""
        return self.version + len(self._inflight)

    def issue(self, *, step: int, groups: Sequence[Group], clip: bool, select: Selection | None,
              started_at: float, wait_s: float, notes: StepNotes) -> TrainBatch:  # fmt: skip
        """Shuffle `groups` into a batch at `version_after_inflight` (which `notes.staleness` was computed
        against), start its update and queue the export of the version it makes; the batch as started. The
        update's timings start here (`StepTimes`: the step began at `started_at`, its groups came `wait_s` later)."""
        order = self.shuffle_rng.permutation(len(groups))
        version = self.version_after_inflight
        batch = TrainBatch(
            groups=tuple(groups[i] for i in order),
            version=version,
            clip=clip,
            select=select,
            **self.batch_options,
        )
        times = StepTimes(started_at=started_at, wait_s=wait_s, issued_at=time.perf_counter())
        pending = self.learners.start_update(batch=batch)
        self.weights.prepare(version=version + 1)
        self._inflight.append(Update(step=step, batch=batch, pending=pending, times=times, notes=notes))
        return batch

    def oldest_done(self, *, timeout_s: float) -> bool:
        """Whether the oldest update in flight finished (waiting up to `timeout_s` for it); False when none."""
        return bool(self._inflight) and self._inflight[0].pending.wait(timeout_s=timeout_s)

    def land(self) -> Update | None:
        """The oldest update in flight, out of flight with its result and times, if it finished; None when it
        is still running (the driver waits with `oldest_done`). version += 1."""
        update = self._inflight[0]
        if not update.pending.wait(timeout_s=0.0):
            return None
        self.note_landed()
        update.result = update.pending.result()
        self._inflight.pop(0)
        self.version += 1
        times = update.times
        assert times.landed_at is not None
        # the learners' idle time between the previous update and this one, as the driver sees it: none when
        # this one was queued before the previous one finished
        last, self._last_landed = self._last_landed, times.landed_at
        if last is not None:
            times.gap_s = max(0.0, times.issued_at - last)
        return update

    def broadcast(self, update: Update) -> dict[str, float]:
        """Broadcast the version `update` made (the current one) and time it; the transport's metrics."""
        t0 = time.perf_counter()
        metrics = self.weights.broadcast(version=self.version)
        update.times.sync_s = time.perf_counter() - t0
        now = time.perf_counter()
        update.times.step_s, self._last_broadcast = now - self._last_broadcast, now
        return metrics

    def note_landed(self) -> None:
        """Record when each update in flight was first seen finished (`system/update_gap_s` counts from it);
        they finish in the order they started."""
        for update in self._inflight:
            if update.times.landed_at is not None:
                continue
            if not update.pending.wait(timeout_s=0.0):
                break
            update.times.landed_at = time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        """JSON-able; call it with nothing in flight. The keys are the driver checkpoint's (`Driver.state_dict`)."""
        return {"version": self.version, "shuffle_rng": self.shuffle_rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = int(state["version"])
        self.shuffle_rng.bit_generator.state = state["shuffle_rng"]
