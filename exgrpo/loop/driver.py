"""The training loop (docs/architecture.md, "One step"), top to bottom. Typed by `exgrpo/core/roles.py`; imports no Ray.

Per step t:
  1. admit: requests for step t may be issued once the learner version v >= t - eta, so every
     group is trained at most eta versions after the weights that sampled it (AReaL-style
     admission control; nothing stale is dropped, admission is paced instead);
  2. schedule: after the delayed start, n_replay = min(floor(rho * B), replayable questions) are
     drawn from replay (K - 1 fresh rollouts each; the request carries the question's stored
     candidates; `replay.replay_trajectories=false` or `replay.max_age` with no young enough candidate:
     K fresh rollouts of the replayed question instead), the rest are fresh questions (K rollouts);
  3. wait for step t's requests, pull their groups by request id; a replay request whose question
     retired in flight is re-issued as a fresh request (a retired question is never replayed);
  4. each replayed question's stored trajectory with the lowest entropy under the current learner weights
     goes into slot 0 of its group: by default the learners score and pick inside the update call
     (`TrainBatch.select`, `async.select_on_learners`), so nothing waits for the previous update here;
  5. shuffle the batch (seeded, checkpointed), start the learners' update; version += 1 and broadcast
     once it finished.

With `async.overlap_update=true` the update does not block the loop: update t + 1 is started as soon as step
t + 1's groups are pulled, queued on the learners behind update t (learner calls run in the order they were
started, so it scores its candidates under the weights update t produces and starts the moment update t
ends); update t is finished (version, broadcast, record) when it is seen done, while the driver waits for
the next step. The export `WeightTransport.prepare` queues right behind each update, so it reads exactly its
weights. With `async.select_on_learners=false` (or random selection with a trace check) the driver scores the
candidates itself; the scores wait behind the updates in flight, so the next update starts after they land.

Clipping: PPO clipping on fresh tokens holds until the delayed start; it is removed from the step
*after* the one whose fresh solve ratio triggers the start (official `loss_remove_clip`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exgrpo.core import metric_names as M
from exgrpo.core.algorithm import DelayedStart
from exgrpo.core.config import Config
from exgrpo.core.records import (
    GenerationRequest,
    Group,
    Prompt,
    ReplayPick,
    ReplayStats,
    TrainBatch,
    UpdateResult,
)
from exgrpo.core.roles import Learners, Pending, Replay, Rollouts, RunObserver, Scaling, WeightTransport
from exgrpo.data.stream import OutOfQuestions, PromptStream
from exgrpo.loop.mixing import Mixer
from exgrpo.loop.observer import Observer
from exgrpo.loop.steps import (
    StepPlan,
    eval_metrics,
    replay_metrics,
    rollout_metrics,
    solve_ratio,
    zero_variance_share,
)

log = logging.getLogger(__name__)

# Seconds one `Rollouts.poll` may block. The sampler pool's poll (RLlib's actor manager) returns early only
# when *every* call in flight is done, so with eta >= 1 (the next step's requests in flight) each poll runs
# to its timeout and the step's last result is seen up to POLL_S late (0.05 s: ~25 ms per step on average;
# 0.01 s: ~5 ms). A poll costs the driver ~0.1 ms of CPU, so 100 polls/s stay under 1% of a core.
POLL_S = 0.01


@dataclass
class _InFlight:
    """A step whose update started and has not been finished (version, broadcast, record)."""

    step: int
    plan: StepPlan
    pending: Pending[UpdateResult]
    batch: TrainBatch  # as started: with `select`, its replay groups still carry their candidates
    solve: float  # the fresh solve ratio
    replay: dict[str, float]  # replay/ metrics as the step's groups were pulled
    staleness: list[int]
    times: dict[str, float]  # driver timings (docs/metrics.md) and when the update started
    metrics: dict[str, float]  # the mix's


class Driver:
    """The loop over the roles. What it reports (every batch, every step's record, the scored replay
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
        rollouts: Rollouts,
        replay: Replay,
        learners: Learners,
        weights: WeightTransport,
        train: Sequence[Prompt],
        evaluation: Sequence[Prompt] = (),
        scaling: Scaling | None = None,
        observer: RunObserver | None = None,
        checkpointer: Callable[[Driver], None] | None = None,
        stall_timeout_s: float = 900.0,
        trace_check: Callable[[Prompt, str], bool] | None = None,
        recoveries: int = 0,
    ) -> None:
        self.cfg = cfg
        self.rollouts, self.replay, self.learners, self.weights = rollouts, replay, learners, weights
        self.scaling = scaling
        self.observer: RunObserver = observer if observer is not None else Observer()
        self.checkpointer = checkpointer  # callable(driver) that writes a checkpoint
        self.stall_timeout_s = stall_timeout_s
        self.recoveries = recoveries  # in-job recoveries before this driver started (reported, not used)
        self.K = cfg.trainer.rollouts_per_question
        self.B = cfg.trainer.questions_per_step
        self.eta = cfg.async_.max_staleness
        self.rng = np.random.default_rng(cfg.trainer.seed)  # replay question selection (at admission)
        self.shuffle_rng = np.random.default_rng([cfg.trainer.seed, 1])  # mini-batch shuffle
        self.prompts = {p.qid: p for p in train}
        # step 4, slot 0 of the replay groups (`trace_check`: measurement only, the reward stays outcome-only)
        self.mixer = Mixer(
            cfg=cfg, learners=learners, prompts=self.prompts, observer=self.observer, trace_check=trace_check
        )
        self.stream = PromptStream(list(train), seed=cfg.data.seed, retired=replay.retired)
        self.evaluation = list(evaluation)
        # with replay off (on-policy GRPO: disabled or rho 0) the threshold is 1: a solve ratio never exceeds
        # it, so nothing is ever stored
        self.delayed_start = DelayedStart(cfg.replay.start_solve_ratio if cfg.replay.on else 1.0)
        if self.delayed_start.started:
            replay.set_collect(on=True)
        self.step = 0  # next step to train
        self.next_schedule = 0  # next step to admit
        self.version = 0
        self.next_request_id = 0
        self.plans: dict[int, StepPlan] = {}
        self.owner: dict[int, int] = {}  # request id -> step
        self.eval_history: list[dict[str, Any]] = []  # eval/ metrics + per-question Avg@n and sources
        self.replay_stats = ReplayStats(bucket_sizes={}, active=0, retired=0, trajectories=0, ready=0)
        self.reward_failure_notes: dict[str, str] = {}  # kind -> the first reward failure of that kind
        self.out_of_work: str | None = None  # why training ended before trainer.steps (no questions left)
        # set from outside (the recipe's SIGINT / SIGTERM handler): stop at the next step boundary, checkpoint
        self.stop_requested: str | None = None
        self.stopped: str | None = None  # why training stopped early at a step boundary (a stop request)
        self.fresh_zero_var = 0.5  # last pulled step's share of all-equal fresh groups (replay.rho_mode)
        self._last_step_end = time.perf_counter()
        self._inflight: list[_InFlight] = []  # updates started and not yet finished, oldest first
        self._last_landed: float | None = None  # when the previous update was seen finished
        self._steps = cfg.trainer.steps  # trainer.steps, or fewer once the data ran out
        self._records: list[dict[str, Any]] = []

    # -- the loop --------------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Run (or, after `load_state_dict`, continue) until `trainer.steps`; returns this call's records.

        With `async.overlap_update` an update is started and left running: the next step's wait and pull
        happen while it runs, and the next update is queued behind it. An update is finished (version,
        broadcast, record) once it is seen done. Checkpoint steps and the last step finish their update before
        going on, so a checkpoint holds no update in flight.
        """
        self._steps, self._records = self.cfg.trainer.steps, []
        if self.step == 0 and not self.eval_history and (before := self.evaluate()):
            self.observer.on_eval(record={M.STEP: -1, **before})  # eval/version = step + 1, as in every row
        while self.step < self._steps:
            if self.stop_requested is not None:  # a step boundary: no update of this call is half done
                self._stop()
                break
            step, t0 = self.step, time.perf_counter()
            self.apply_scaling()
            self.admit()
            plan = self.wait(step)
            if plan is None:  # the data ran out before this step was admitted
                break
            try:
                groups = self.pull(plan)
            except OutOfQuestions as err:  # a retired replay question found no fresh replacement
                self._steps = self._out_of_work(err, steps=step)
                break
            t_wait = time.perf_counter()
            groups, select, t_entropy, mix_metrics = self.mixer.mix(groups, step=step, wait=self._await)
            solve = solve_ratio([g for g in groups if g.kind == "fresh"])
            self.fresh_zero_var = zero_variance_share(groups, default=self.fresh_zero_var)
            # clipping follows the state *before* this step's ratio: removed from the step after the start
            clip = not (self.delayed_start.started and self.cfg.loss.remove_clip_after_replay)
            started_before = self.delayed_start.started
            self.delayed_start.update(solve_ratio=solve)
            order = self.shuffle_rng.permutation(len(groups))
            version = self.version + len(self._inflight)  # the weights this update starts from
            batch = TrainBatch(
                groups=tuple(groups[i] for i in order), version=version, clip=clip, select=select
            )
            t_issue = time.perf_counter()
            pending = self.learners.start_update(batch=batch)
            self.weights.prepare(version=version + 1)
            self.step += 1
            if self.delayed_start.started and not started_before:
                self.replay.set_collect(on=True)
                log.info("replay started at step %d (fresh solve ratio %.3f)", step, solve)
            self._inflight.append(
                _InFlight(
                    step=step,
                    plan=plan,
                    pending=pending,
                    batch=batch,
                    solve=solve,
                    replay=replay_metrics(
                        self.replay_stats, started=self.delayed_start.started, k_rollouts=self.K
                    ),
                    # a mid-response update: a group's oldest version
                    staleness=[version - g.oldest_version for g in groups],
                    times={
                        M.WAIT_TIME: t_wait - t0,
                        M.ENTROPY_TIME: t_entropy,
                        "issued": t_issue,
                        "loop": t_issue - t0,  # the driver's own time until the update started
                    },
                    metrics=mix_metrics,
                )
            )
            if not self.cfg.async_.overlap_update or self._barrier(step):
                while self._inflight:
                    self._finish_next(block=True)
            else:  # what already finished (e.g. behind the scores awaited above), then what it admits
                while self._inflight and self._finish_next(block=False):
                    pass
                self.admit()
        while self._inflight:  # the data ran out with updates in flight
            self._finish_next(block=True)
        if self.stop_requested is not None and self.stopped is None and self.step < self._steps:
            self._stop()  # asked while the last updates finished
        return self._records

    def _stop(self) -> None:
        """Stop at this step boundary: finish the updates in flight, then checkpoint (unless the last step
        just wrote one), so a `--resume` continues at `self.step` with nothing lost."""
        while self._inflight:
            self._finish_next(block=True)
        self.stopped = f"{self.stop_requested}: stopped after step {self.step} of {self._steps}"
        log.warning("%s", self.stopped)
        every = self.cfg.trainer.checkpoint_every
        if self.checkpointer is not None and self.step > 0 and not (every and self.step % every == 0):
            self.checkpointer(self)

    def _barrier(self, step: int) -> bool:
        """Whether step `step` finishes its update before the loop goes on (a checkpoint follows it)."""
        every = self.cfg.trainer.checkpoint_every
        return self.checkpointer is not None and (
            bool(every and (step + 1) % every == 0) or step + 1 == self._steps
        )

    def _finish_next(self, *, block: bool) -> bool:
        """Finish the oldest update in flight (version, broadcast, record) if it is done, or, with `block`, once
        it is; whether it was finished."""
        flight = self._inflight[0]
        if block:
            self._await(flight.pending)
        elif not flight.pending.wait(timeout_s=0.0):
            return False
        self._note_landed()
        result = flight.pending.result()
        self._inflight.pop(0)
        times = flight.times
        times[M.UPDATE_TIME] = times["landed"] - times["issued"]
        # the learners' idle time between the previous update and this one, as the driver sees it: none when
        # this one was queued before the previous one finished
        last, self._last_landed = self._last_landed, times["landed"]
        times[M.UPDATE_GAP] = max(0.0, times["issued"] - last) if last is not None else math.nan
        if flight.batch.select is not None:  # the learners picked slot 0: the batch as they trained it
            flight.batch, metrics = self.mixer.trained(
                flight.batch, step=flight.step, entropies=result.entropies
            )
            flight.metrics.update(metrics)
        self.observer.on_batch(batch=flight.batch)  # right before its step's record, also with overlap
        self._finish(flight, result.metrics)
        return True

    def _await(self, pending: Pending[Any]) -> Any:
        """A learner call's value; until it is there, the samplers' results are taken every POLL_S (and updates
        in flight that finish meanwhile are timed then)."""
        while not pending.wait(timeout_s=POLL_S):
            self._take(timeout_s=0.0)
            self._note_landed()
        self._note_landed()
        return pending.result()

    def _note_landed(self) -> None:
        """Record when each update in flight was first seen finished (`system/update_gap_s` counts from it);
        they finish in the order they started."""
        for flight in self._inflight:
            if "landed" in flight.times:
                continue
            if not flight.pending.wait(timeout_s=0.0):
                break
            flight.times["landed"] = time.perf_counter()

    def _finish(self, flight: _InFlight, learner_metrics: dict[str, float]) -> None:
        """The update of `flight` finished: version += 1, broadcast, the step's record, evaluation, checkpoint."""
        step, plan, groups = flight.step, flight.plan, list(flight.batch.groups)
        self.version += 1
        t2 = time.perf_counter()
        sync_metrics = self.weights.broadcast(version=self.version)
        t_sync = time.perf_counter() - t2
        wall = self._since_last_step()
        times = flight.times
        record = {
            M.STEP: step,
            **learner_metrics,
            **rollout_metrics(groups, plan, solve_ratio=flight.solve, wall_s=wall),
            **flight.replay,
            **flight.metrics,
            **sync_metrics,
            M.VERSION: self.version,
            M.STALENESS_MEAN: float(np.mean(flight.staleness)),
            M.STALENESS_MAX: int(max(flight.staleness)),
            M.STEP_TIME: wall,
            M.WAIT_TIME: times[M.WAIT_TIME],
            M.ENTROPY_TIME: times[M.ENTROPY_TIME],
            M.UPDATE_TIME: times[M.UPDATE_TIME],
            M.UPDATE_GAP: times[M.UPDATE_GAP],
            M.SYNC_TIME: t_sync,
            M.IDLE_TIME: max(0.0, times["loop"] - times[M.WAIT_TIME] - times[M.ENTROPY_TIME]),
            M.SAMPLERS: self.rollouts.size(),
            M.SAMPLER_RESTARTS: self.rollouts.restarts,
            M.RECOVERIES: self.recoveries,
        }
        every = self.cfg.trainer.eval_every
        if (every and (step + 1) % every == 0) or step == self._steps - 1:
            record.update(self.evaluate())
        self._records.append(record)
        self.observer.on_step(record=record)
        del self.plans[step]
        every = self.cfg.trainer.checkpoint_every
        done = step + 1
        if self.checkpointer is not None and ((every and done % every == 0) or done == self._steps):
            assert not self._inflight and self.step == done, "a checkpoint with an update in flight"
            self.checkpointer(self)

    def apply_scaling(self) -> None:
        """Follow the sampler count an operator set through `python -m exgrpo.scale`."""
        desired = self.scaling.desired_samplers() if self.scaling is not None else None
        if desired is not None and desired != self.rollouts.size():
            # a warning, so it reaches the job's output whatever the logging level (python -m exgrpo.scale)
            log.warning("step %d: scaling samplers %d -> %d", self.step, self.rollouts.size(), desired)
            self.rollouts.scale(num=desired)

    # -- 1-2. admission and scheduling -----------------------------------------------------------------
    def admit(self) -> None:
        """Schedule every step the learner version admits; when the data runs out, training ends after the
        steps already admitted."""
        try:
            while self.next_schedule < self._steps and self.next_schedule <= self.version + self.eta:
                self.schedule(self.next_schedule)
                self.next_schedule += 1
        except OutOfQuestions as err:
            self._steps = self._out_of_work(err, steps=self.next_schedule)

    def schedule(self, step: int) -> StepPlan:
        """Admit step `step`'s B requests at the current learner version."""
        picks: list[ReplayPick] = []
        available = 0
        if self.delayed_start.started and self.cfg.replay.rho > 0:
            available = self.replay_stats.active
            picks = self.replay.sample_questions(n=self.replay_slots(), rng=self.rng)
        # official stream: B questions every step, the first B - n_replay used, so an epoch lasts the
        # same number of steps with or without replay ("batch"); "needed" draws only B - n_replay
        take = self.B if self.cfg.data.fresh_take == "batch" else self.B - len(picks)
        room, cap = self.B - len(picks), self.cfg.data.fresh_per_step
        if cap is not None:  # equal fresh data: the rest of the batch is replay or nothing
            take, room = cap, min(room, cap)
        fresh = self.stream.next(take)[:room]
        requests = [self._request(p, kind="fresh", n=self.K) for p in fresh]
        requests += [self._replay_request(p) for p in picks]
        plan = StepPlan(
            step=step,
            admitted_version=self.version,
            request_ids={r.request_id for r in requests},
            n_fresh=len(fresh),
            n_replay=len(picks),
            available=available,
        )
        self.plans[step] = plan
        self._submit(plan, requests)
        return plan

    def replay_slots(self) -> int:
        """Replay questions asked for the step being scheduled: floor(rho * B), or with `replay.rho_mode:
        zero_variance` the last pulled step's share of all-equal fresh groups times B (rounded), at most
        floor(rho * B) and B - 1 (a step keeps a fresh group, so the share stays measured)."""
        cap = int(math.floor(self.cfg.replay.rho * self.B))
        if self.cfg.replay.rho_mode == "fixed":
            return cap
        return min(cap, self.B - 1, int(round(self.fresh_zero_var * self.B)))

    def _replay_request(self, pick: ReplayPick) -> GenerationRequest:
        """K - 1 fresh rollouts plus a stored trajectory in slot 0; with `replay.replay_trajectories=false`,
        or when `replay.max_age` leaves no stored trajectory young enough (age = the admitting version minus
        the version that sampled it), the question is revisited with K fresh rollouts instead."""
        r = self.cfg.replay
        candidates = pick.candidates
        if r.max_age is not None:
            candidates = tuple(c for c in candidates if self.version - c.oldest_version <= r.max_age)
        if not r.replay_trajectories or not candidates:
            return self._request(self.prompts[pick.qid], kind="fresh", n=self.K)
        return self._request(self.prompts[pick.qid], kind="replay", n=self.K - 1, candidates=candidates)

    def _request(self, prompt: Prompt, *, kind: str, n: int, candidates: tuple = ()) -> GenerationRequest:
        self.next_request_id += 1
        return GenerationRequest(
            request_id=self.next_request_id,
            prompt=prompt,
            n=n,
            kind=kind,  # type: ignore[arg-type]
            admitted_version=self.version,
            candidates=candidates,
        )

    def _submit(self, plan: StepPlan, requests: Sequence[GenerationRequest]) -> None:
        plan.request_ids |= {r.request_id for r in requests}
        for r in requests:
            self.owner[r.request_id] = plan.step
        self.rollouts.submit(requests=requests)

    # -- 3. waiting and pulling ------------------------------------------------------------------------
    def wait(self, step: int) -> StepPlan | None:
        """Until step `step`'s requests are all done; an update in flight that finishes meanwhile is finished
        here and the steps it admits are scheduled (with eta = 0 this step is one of them). None: the data ran
        out before the step was admitted."""
        last_progress = time.monotonic()
        while True:
            plan = self.plans.get(step)
            if plan is not None and plan.done == plan.request_ids:
                return plan
            if plan is None and step >= self._steps:
                return None
            if time.monotonic() - last_progress > self.stall_timeout_s:
                outstanding = len(plan.request_ids - plan.done) if plan is not None else "all"
                raise RuntimeError(
                    f"step {step}: no generation finished for {self.stall_timeout_s:.0f} s; "
                    f"{outstanding} requests outstanding, {self.rollouts.size()} live samplers"
                )
            if self._inflight and self._inflight[0].pending.wait(timeout_s=POLL_S):
                self._finish_next(block=True)
                self.admit()
                last_progress = time.monotonic()
                continue
            if plan is None and not self._inflight:
                raise RuntimeError(f"step {step} was never admitted (version {self.version}, eta {self.eta})")
            if self._take(timeout_s=0.0 if self._inflight else POLL_S):
                last_progress = time.monotonic()

    def _take(self, *, timeout_s: float) -> bool:
        """Take the samplers' finished results (at most `timeout_s` for the first); whether there were any."""
        results = self.rollouts.poll(timeout_s=timeout_s)
        for result in results:
            # tokens are attributed to the step of the call's first request
            first = self.plans.get(self.owner.get(result.request_ids[0], -1))
            if first is not None:
                first.tokens += result.tokens
                first.reward_failures += result.reward_failures
            for kind, text in result.reward_failure_notes:
                if kind not in self.reward_failure_notes:  # the first of each kind, once per run
                    self.reward_failure_notes[kind] = text
                    log.warning("reward %s on a rollout (%s): %s; it scored 0", kind, result.sampler, text)
            for rid in result.request_ids:
                owner = self.plans.get(self.owner.pop(rid, -1))
                if owner is not None:
                    owner.done.add(rid)
        return bool(results)

    def pull(self, plan: StepPlan) -> list[Group]:
        """The step's groups; replay requests dropped by Replay are re-issued as fresh ones first."""
        groups: list[Group] = []
        wanted = set(plan.request_ids)
        while wanted:
            pulled = self.replay.pull_batch(request_ids=sorted(wanted))
            self.replay_stats = pulled.stats
            groups += pulled.groups
            wanted = set()
            if pulled.dropped:
                log.info(
                    "step %d: %d replay questions retired in flight; re-issued as fresh",
                    plan.step,
                    len(pulled.dropped),
                )
                plan.request_ids -= set(pulled.dropped)
                plan.done -= set(pulled.dropped)
                plan.n_replay -= len(pulled.dropped)
                plan.n_fresh += len(pulled.dropped)
                plan.replaced += len(pulled.dropped)
                requests = [
                    self._request(p, kind="fresh", n=self.K) for p in self.stream.next(len(pulled.dropped))
                ]
                self._submit(plan, requests)
                self.wait(plan.step)
                wanted = {r.request_id for r in requests}
        return sorted(groups, key=lambda g: g.request_id)

    # -- evaluation and metrics ------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        if not self.evaluation:
            return {}
        scores = self.rollouts.evaluate(prompts=self.evaluation, n=self.cfg.trainer.eval_samples)
        out, per_question = eval_metrics(self.evaluation, scores, version=self.version)
        self.eval_history.append({**out, **per_question})
        return out

    def _out_of_work(self, err: OutOfQuestions, *, steps: int) -> int:
        """Training ends after `steps` steps (fewer than `trainer.steps`): the data ran out."""
        self.out_of_work = f"{err}: training ends after {steps} of {self.cfg.trainer.steps} steps"
        log.warning("%s", self.out_of_work)
        return steps

    def _since_last_step(self) -> float:
        now = time.perf_counter()
        dt, self._last_step_end = now - self._last_step_end, now
        return dt

    # -- checkpoint state ------------------------------------------------------------------------------
    def drain(self) -> None:
        """Finish every admitted request (their groups wait in Replay), so a checkpoint is exact."""
        if self._inflight:
            raise RuntimeError("drain() with an update in flight: checkpoints follow a finished update")
        for step in sorted(self.plans):
            self.wait(step)
        self.replay_stats = self.replay.stats()  # what a resumed driver reads first, so both continue alike

    def state_dict(self) -> dict[str, Any]:
        """JSON-able driver state; call `drain()` first."""
        return {
            "step": self.step,
            "next_schedule": self.next_schedule,
            "version": self.version,
            "next_request_id": self.next_request_id,
            "rng": self.rng.bit_generator.state,
            "shuffle_rng": self.shuffle_rng.bit_generator.state,
            "pick_rng": self.mixer.rng.bit_generator.state,
            "stream": self.stream.state_dict(),
            "delayed_start": self.delayed_start.state_dict(),
            "plans": [p.state_dict() for p in self.plans.values()],
            "eval_history": self.eval_history,
            "fresh_zero_var": self.fresh_zero_var,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.next_schedule = int(state["step"]), int(state["next_schedule"])
        self.version, self.next_request_id = int(state["version"]), int(state["next_request_id"])
        self.rng.bit_generator.state = state["rng"]
        self.shuffle_rng.bit_generator.state = state["shuffle_rng"]
        if "pick_rng" in state:  # checkpoints before it had one stream for both selections
            self.mixer.rng.bit_generator.state = state["pick_rng"]
        self.stream.load_state_dict(state["stream"])
        self.delayed_start.load_state_dict(state["delayed_start"])
        self.fresh_zero_var = float(state.get("fresh_zero_var", 0.5))  # older checkpoints: the start value
        self.plans = {p["step"]: StepPlan.from_state_dict(p) for p in state["plans"]}
        self.eval_history = list(state.get("eval_history", []))
        self.replay_stats = self.replay.stats()
