"""The training loop: `Driver.train` reads top to bottom, each line a call on the object that owns its state.

Per step t: admit, collect its groups (`Scheduler`), fill slot 0 (`Mixer`), start the update (`UpdatePipeline`).
An update lands later (`Driver.land`): version += 1, broadcast, the step's record; then the steps it admits.
Invariants: a group is trained at most eta versions after the weights that sampled it; updates land, broadcast
and are recorded in step order; a checkpoint has no update in flight. Typed by `exgrpo/core/roles.py`; no Ray.
Read: docs/architecture.md, "One step, hop by hop" (the table, then `async.overlap_update` below it);
tests/exgrpo/loop/test_overlap.py and tests/exgrpo/loop/test_admission.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from exgrpo.core import metric_names as M
from exgrpo.core.config import Config
from exgrpo.core.records import Group, Prompt, TrainBatch
from exgrpo.core.roles import Learners, Replay, Rollouts, RunObserver, Scaling, WeightTransport
from exgrpo.data.stream import OutOfQuestions
from exgrpo.loop.autoscale import make_fleet
from exgrpo.loop.mixing import MixedGroups, Mixer
from exgrpo.loop.observer import Observer
from exgrpo.loop.pipeline import Update, UpdatePipeline
from exgrpo.loop.scheduler import Scheduler
from exgrpo.loop.steps import (
    Evaluations,
    StepNotes,
    StepPlan,
    checkpoint_due,
    eval_due,
    rollout_metrics,
)
from exgrpo.loop.weight_checks import WeightChecks

log = logging.getLogger(__name__)

# Seconds one `Rollouts.poll` may block. The sampler pool's poll (RLlib's actor manager) returns early only
# when *every* call in flight is done, so with eta >= 1 (the next step's requests in flight) each poll runs
# to its timeout and the step's last result is seen up to POLL_S late (0.05 s: ~25 ms per step on average;
# 0.01 s: ~5 ms). A poll costs the driver ~0.1 ms of CPU, so 100 polls/s stay under 1% of a core.
POLL_S = 0.01

# driver.json's keys, in the order written; older checkpoints may lack eval_history and fresh_zero_var (and
# may hold pick_rng, the driver's random picks before the learners made them, which is ignored)
STATE_KEYS = (
    "step",
    "next_schedule",
    "version",
    "next_request_id",
    "rng",
    "shuffle_rng",
    "stream",
    "delayed_start",
    "plans",
    "eval_history",
    "fresh_zero_var",
)


@dataclass(frozen=True)
class Roles:
    """The roles the loop drives (`exgrpo/core/roles.py`); `scaling`: the operator's sampler count, if any."""

    rollouts: Rollouts
    replay: Replay
    learners: Learners
    weights: WeightTransport
    scaling: Scaling | None = None


class Driver:
    """The loop over the roles (`Roles`). What it reports (every batch, every step's record, the scored replay
    candidates) goes to `observer` (`exgrpo.core.roles.RunObserver`; `exgrpo.loop.observer.Observers` for
    several), which only watches. `checkpointer` and `trace_check` are collaborators, not observers, so
    they stay arguments of their own: the checkpointer drains the driver and writes its state at the
    points the loop chooses (its failure must stop the loop), and the trace check's answers become the
    `replay/*_valid_frac` metrics and switch on the scoring of every replay candidate.
    """

    def __init__(
        self,
        *,
        cfg: Config,
        roles: Roles,
        train: Sequence[Prompt],
        evaluation: Sequence[Prompt] = (),
        observer: RunObserver | None = None,
        checkpointer: Callable[[Driver], object] | None = None,
        stall_timeout_s: float = 900.0,
        trace_check: Callable[[Prompt, str], bool] | None = None,
        recoveries: int = 0,
    ) -> None:
        self.cfg = cfg
        self.observer: RunObserver = observer if observer is not None else Observer()
        self.checkpointer = checkpointer  # callable(driver) that writes a checkpoint
        self.stall_timeout_s = stall_timeout_s
        self.recoveries = recoveries  # in-job recoveries before this driver started (reported, not used)
        # steps 1-3: admission, requests, pulls; step 5: the updates in flight and the learners' version
        # the run checks its own weights every step (`checks.*`): each sampler's served sums and log-prob gap
        self.weight_checks = checks = WeightChecks.from_config(cfg)
        self.scheduler = Scheduler(
            cfg=cfg, rollouts=roles.rollouts, replay=roles.replay, train=train, watch=checks.on_result
        )
        # the samplers' count: operator or policy
        self.fleet = make_fleet(cfg, rollouts=roles.rollouts, scaling=roles.scaling)
        # step 4, slot 0 of the replay groups (`trace_check`: measurement only, the reward stays outcome-only)
        self.mixer = Mixer(
            cfg=cfg, prompts=self.scheduler.prompts, observer=self.observer, trace_check=trace_check
        )
        options = {**checks.batch_options(), **self.mixer.batch_options()}  # what every TrainBatch carries
        self.pipeline = UpdatePipeline(learners=roles.learners, weights=roles.weights, seed=cfg.trainer.seed,
                                       batch_options=options)  # fmt: skip
        # the held-out questions and each evaluation's eval/ metrics, per-question Avg@n and sources
        self.evals = Evaluations(prompts=tuple(evaluation), n=cfg.trainer.eval_samples)
        self.step = 0  # next step to train (steps whose update started)
        # set from outside (the recipe's SIGINT / SIGTERM handler): stop at the next step boundary, checkpoint
        self.stop_requested: str | None = None
        self.stopped: str | None = None  # why training stopped early at a step boundary (a stop request)
        self._records: list[dict[str, Any]] = []  # this `train` call's step records

    # -- the roles and the run's state, as the recipe and the checkpointer read them --------------------
    @property
    def rollouts(self) -> Rollouts:
        return self.scheduler.rollouts

    @property
    def replay(self) -> Replay:
        return self.scheduler.replay

    @property
    def learners(self) -> Learners:
        return self.pipeline.learners

    @property
    def weights(self) -> WeightTransport:
        return self.pipeline.weights

    @property
    def version(self) -> int:
        """The learners' version: the updates landed."""
        return self.pipeline.version

    @property
    def out_of_work(self) -> str | None:
        """Why training ended before `trainer.steps` (no questions left), or None."""
        return self.scheduler.out_of_work

    @property
    def reward_failure_notes(self) -> dict[str, str]:
        """Kind -> the first reward failure of that kind the samplers reported."""
        return self.scheduler.reward_failure_notes

    # -- the loop --------------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Run (or, after `load_state_dict`, continue) until `trainer.steps`; returns this call's records. With
        `async.overlap_update` the next step's wait and pull run while an update runs (module docstring)."""
        sched, self._records = self.scheduler, []
        if self.step == 0 and not self.evals.history and (before := self.evaluate()):
            self.observer.on_eval(record={M.STEP: -1, **before})  # eval/version = step + 1, as in every row
        while self.step < sched.steps and self.stop_requested is None:  # a stop waits for a step boundary
            # --- step t: scale, admit, collect (updates that finish meanwhile land), mix, start the update ---
            step, t0 = self.step, time.perf_counter()
            self.apply_scaling()
            sched.admit(version=self.pipeline.version)
            groups = self.collect(step)
            if groups is None:  # the data ran out
                break
            self.update(step, self.mixer.mix(groups), started_at=t0, wait_s=time.perf_counter() - t0)
            # --- land (broadcast, record): what finished; everything before a checkpoint or without overlap ---
            if not self.cfg.async_.overlap_update or self._checkpoint_after(step + 1):
                self.land_all()
            else:
                self.land_ready()
                sched.admit(version=self.pipeline.version)
        # --- the end: land what is in flight, then a requested stop checkpoints ---
        self.land_all()
        if self.stop_requested is not None and self.stopped is None and self.step < sched.steps:
            self._stop()
        return self._records

    def collect(self, step: int) -> list[Group] | None:
        """Step 3: wait for step `step`'s requests and pull its groups, in request order; requests re-issued for
        replay questions retired in flight are waited for and pulled in turn. None: the data ran out."""
        plan = self.wait_and_land(step)
        if plan is None:  # the data ran out before this step was admitted
            return None
        groups: list[Group] = []
        wanted = set(plan.request_ids)
        try:
            while wanted:
                got, wanted = self.scheduler.pull(plan, wanted=wanted, version=self.pipeline.version)
                groups += got
                if wanted:
                    self.wait_and_land(step)
        except OutOfQuestions as err:  # a retired replay question found no fresh replacement
            self.scheduler.run_out(err, steps=step)
            return None
        return sorted(groups, key=lambda g: g.request_id)

    def update(self, step: int, mixed: MixedGroups, *, started_at: float, wait_s: float) -> None:
        """Step 5: the scheduler reads the step's groups (its delayed start, clipping), the update starts (it
        lands later; the step began at `started_at`, its groups came `wait_s` later), then a delayed start fired
        by this step switches on Replay's collecting."""
        start = self.scheduler.start_batch(step, mixed.groups)
        version = self.pipeline.version_after_inflight  # the weights this update starts from
        # a mid-response update: the oldest version counts
        notes = StepNotes(start=start, staleness=[version - g.oldest_version for g in mixed.groups])
        self.pipeline.issue(step=step, groups=mixed.groups, clip=start.clip, select=mixed.select,
                            started_at=started_at, wait_s=wait_s, notes=notes)  # fmt: skip
        self.step += 1
        self.scheduler.apply_delayed_start()

    def land_all(self) -> None:
        """Land every update in flight; when the last completes a checkpoint step, the checkpoint follows."""
        if not self.pipeline.in_flight:
            return
        while self.pipeline.in_flight:
            self.land(block=True)
        if self._checkpoint_after(self.step):
            assert self.checkpointer is not None
            self.checkpointer(self)

    def land_ready(self) -> None:
        """Land the updates that already finished, oldest first."""
        while self.pipeline.in_flight and self.land(block=False):
            pass

    def land(self, *, block: bool) -> bool:
        """Land the oldest update in flight if it finished (with `block`, once it has): version += 1, the batch
        as trained, the broadcast of the new version, the step's record, its plan retired. Whether it landed."""
        if block:
            self.wait_for_update()
        update = self.pipeline.land()
        if update is None:
            return False
        assert update.result is not None
        batch, trace = self.mixer.trained(update.batch, update.result, step=update.step)
        self.observer.on_batch(batch=batch)  # right before its step's record, also with overlap
        sync_metrics = self.pipeline.broadcast(update)
        self.record(update, batch, mix=trace, sync=sync_metrics)
        self.scheduler.retire_plan(update.step)
        self.weight_checks.on_update(update.batch, update.result)  # raises WeightCheckFailed
        return True

    def record(
        self, update: Update, batch: TrainBatch, *, mix: dict[str, float], sync: dict[str, float]
    ) -> None:
        """The record of a landed update's step (`batch`: as trained; `mix`: its trace metrics; `sync`: the
        broadcast's), with the evaluation when one is due, to `observer.on_step`."""
        assert update.result is not None
        step, start, staleness = update.step, update.notes.start, update.notes.staleness
        record = {
            M.STEP: step,
            **update.result.metrics,
            **rollout_metrics(
                list(batch.groups), start.plan, solve_ratio=start.solve, wall_s=update.times.step_s
            ),
            **start.replay,
            **mix,
            **sync,
            M.VERSION: self.pipeline.version,
            M.STALENESS_MEAN: float(np.mean(staleness)),
            M.STALENESS_MAX: int(max(staleness)),
            **update.times.metrics(),
            M.SAMPLERS: self.rollouts.size(),
            M.SAMPLER_RESTARTS: self.rollouts.restarts,
            M.RECOVERIES: self.recoveries,
        }
        record.update(self.fleet.observe(step=step, times=update.times))
        if eval_due(self.cfg.trainer, done=step + 1, steps=self.scheduler.steps):
            record.update(self.evaluate())
        self._records.append(record)
        self.observer.on_step(record=record)

    def _checkpoint_after(self, done: int) -> bool:
        """Whether a checkpoint follows the step that completes `done` steps (the step lands first)."""
        return self.checkpointer is not None and checkpoint_due(
            self.cfg.trainer, done=done, steps=self.scheduler.steps
        )

    def _stop(self) -> None:
        """Stop at this step boundary (nothing in flight): checkpoint, unless the last step just wrote one, so a
        `--resume` continues at `self.step` with nothing lost."""
        self.stopped = f"{self.stop_requested}: stopped after step {self.step} of {self.scheduler.steps}"
        log.warning("%s", self.stopped)
        if self.checkpointer is not None and self.step > 0 and not self._checkpoint_after(self.step):
            self.checkpointer(self)

    def apply_scaling(self) -> None:
        """The samplers' count: the operator's (`python -m exgrpo.scale`) or `samplers.autoscale`'s policy's."""
        self.fleet.apply(self.step)

    # -- waiting ---------------------------------------------------------------------------------------
    def wait_and_land(self, step: int) -> StepPlan | None:
        """Until step `step`'s requests are all done. An update in flight that finishes first lands (`land`:
        broadcast, record), then the steps its version admits are scheduled (with eta = 0 this step is one of
        them), and the wait goes on. None: the data ran out before the step was admitted."""
        while not self.wait(step):
            self.land(block=True)
            self.scheduler.admit(version=self.pipeline.version)
        return self.scheduler.plan(step)

    def wait(self, step: int) -> bool:
        """Receive the samplers' results until step `step`'s requests are all done or the step will never be
        admitted (True), or until the oldest update in flight finished (False: the caller lands it first)."""
        sched, last_progress = self.scheduler, time.monotonic()
        while True:
            plan = sched.plan(step)
            if plan is not None and plan.done == plan.request_ids:
                return True
            if plan is None and step >= sched.steps:
                return True
            if time.monotonic() - last_progress > self.stall_timeout_s:
                outstanding = len(plan.request_ids - plan.done) if plan is not None else "all"
                raise RuntimeError(
                    f"step {step}: no generation finished for {self.stall_timeout_s:.0f} s; "
                    f"{outstanding} requests outstanding, {self.rollouts.size()} live samplers"
                )
            if self.pipeline.oldest_done(timeout_s=POLL_S):
                return False
            if plan is None and not self.pipeline.in_flight:
                raise RuntimeError(
                    f"step {step} was never admitted (version {self.version}, eta {sched.eta})"
                )
            if sched.receive(timeout_s=0.0 if self.pipeline.in_flight else POLL_S):
                last_progress = time.monotonic()

    def wait_for_update(self) -> None:
        """Until the oldest update in flight finished; meanwhile the samplers' results are received every POLL_S
        (and the updates that finish are timed as they do)."""
        while not self.pipeline.oldest_done(timeout_s=POLL_S):
            self.scheduler.receive(timeout_s=0.0)
            self.pipeline.note_landed()

    # -- evaluation ------------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """The held-out evaluation at the learners' version ({} without held-out questions)."""
        return self.evals.run(self.rollouts, version=self.pipeline.version)

    @property
    def eval_history(self) -> list[dict[str, Any]]:
        """Every evaluation so far: eval/ metrics, per-question Avg@n and sources."""
        return self.evals.history

    # -- checkpoint state ------------------------------------------------------------------------------
    def drain(self) -> None:
        """Finish every admitted request (their groups wait in Replay), so a checkpoint is exact."""
        if self.pipeline.in_flight:
            raise RuntimeError("drain() with an update in flight: checkpoints follow a finished update")
        for step in sorted(self.scheduler.plans):
            done = self.wait(step)  # nothing in flight: no update finishes first
            assert done
        self.scheduler.drained()

    def state_dict(self) -> dict[str, Any]:
        """JSON-able driver state (the keys of `STATE_KEYS`); call `drain()` first."""
        state = {
            "step": self.step,
            "eval_history": self.evals.history,
            **self.scheduler.state_dict(),
            **self.pipeline.state_dict(),
        }
        return {key: state[key] for key in STATE_KEYS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.evals = replace(self.evals, history=list(state.get("eval_history", [])))
        self.pipeline.load_state_dict(state)
        self.scheduler.load_state_dict(state)
