"""Admission, requests and pulls (steps 1-3 of the loop) and the delayed start of replay. Imports no Ray.

`Scheduler` admits step t once the learner version v >= t - eta (a group is trained at most eta versions
after the weights that sampled it), draws replay questions after the delayed start and fresh ones for the
rest, receives the samplers' results (`receive`) and takes a step's groups out of Replay (`pull`: a replay
request whose question retired in flight is re-issued fresh). It owns its state (plans, delayed start,
`steps`); the driver only calls it. Read: docs/architecture.md, "One step, hop by hop" (hops 1-3 and 7);
tests/exgrpo/loop/test_admission.py and tests/exgrpo/loop/test_delayed_start.py.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from exgrpo.core.algorithm import DelayedStart
from exgrpo.core.config import Config
from exgrpo.core.records import GenerationRequest, Group, Prompt, ReplayPick, ReplayStats, RolloutResult
from exgrpo.core.roles import Replay, Rollouts
from exgrpo.data.stream import OutOfQuestions, PromptStream
from exgrpo.loop.steps import BatchStart, StepPlan, replay_metrics, solve_ratio, zero_variance_share

log = logging.getLogger(__name__)


class Scheduler:
    """Admission, requests and pulls over `Rollouts` and `Replay`. Admission is paced (AReaL-style), so nothing
    stale is ever dropped; a retired question is never replayed."""

    def __init__(
        self,
        *,
        cfg: Config,
        rollouts: Rollouts,
        replay: Replay,
        train: Sequence[Prompt],
        watch: Callable[[RolloutResult], None] | None = None,
    ) -> None:
        """`watch`: sees every sampler result first (the weight checks, `exgrpo.loop.weight_checks`)."""
        self.cfg = cfg
        self.rollouts, self.replay = rollouts, replay
        self.K = cfg.trainer.rollouts_per_question
        self.B = cfg.trainer.questions_per_step
        self.eta = cfg.async_.max_staleness
        self.rng = np.random.default_rng(cfg.trainer.seed)  # replay question selection (at admission)
        self.prompts = {p.qid: p for p in train}
        self.stream = PromptStream(list(train), seed=cfg.data.seed, retired=replay.retired)
        # with replay off (on-policy GRPO: disabled or rho 0) the threshold is 1: a solve ratio never exceeds
        # it, so nothing is ever stored
        self.delayed_start = DelayedStart(cfg.replay.start_solve_ratio if cfg.replay.on else 1.0)
        if self.delayed_start.started:
            replay.set_collect(on=True)
        self._steps = cfg.trainer.steps  # the steps to train: trainer.steps, or fewer once the data ran out
        self.next_schedule = 0  # next step to admit
        self.next_request_id = 0
        self.plans: dict[int, StepPlan] = {}
        self.owner: dict[int, int] = {}  # request id -> step
        self.replay_stats = ReplayStats(bucket_sizes={}, active=0, retired=0, trajectories=0, ready=0)
        self.fresh_zero_var = 0.5  # last pulled step's share of all-equal fresh groups (replay.rho_mode)
        self._collect_from: tuple[int, float] | None = None  # (step, solve ratio) of a start not yet applied
        self.reward_failure_notes: dict[str, str] = {}  # kind -> the first reward failure of that kind
        self.out_of_work: str | None = None  # why training ended before trainer.steps (no questions left)
        self.watch = watch

    @property
    def steps(self) -> int:
        """The steps to train: `trainer.steps`, or fewer once the data ran out (`run_out`)."""
        return self._steps

    def plan(self, step: int) -> StepPlan | None:
        """Step `step`'s plan: admitted and not yet retired (`retire_plan`), else None."""
        return self.plans.get(step)

    # -- 1-2. admission and scheduling -----------------------------------------------------------------
    def admit(self, *, version: int) -> None:
        """Schedule every step the learner version admits; when the data runs out, training ends after the
        steps already admitted."""
        try:
            while self.next_schedule < self.steps and self.next_schedule <= version + self.eta:
                self.schedule(self.next_schedule, version=version)
                self.next_schedule += 1
        except OutOfQuestions as err:
            self.run_out(err, steps=self.next_schedule)

    def schedule(self, step: int, *, version: int) -> StepPlan:
        """Admit step `step`'s B requests at learner version `version`."""
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
        requests = [self._request(p, kind="fresh", n=self.K, version=version) for p in fresh]
        requests += [self.replay_request(p, version=version) for p in picks]
        plan = StepPlan(
            step=step,
            admitted_version=version,
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

    def replay_request(self, pick: ReplayPick, *, version: int) -> GenerationRequest:
        """K - 1 fresh rollouts plus a stored trajectory in slot 0; with `replay.replay_trajectories=false`,
        or when `replay.max_age` leaves no stored trajectory young enough (age = the admitting version minus
        the version that sampled it), the question is revisited with K fresh rollouts instead."""
        r = self.cfg.replay
        candidates = pick.candidates
        if r.max_age is not None:
            candidates = tuple(c for c in candidates if version - c.oldest_version <= r.max_age)
        prompt = self.prompts[pick.qid]
        if not r.replay_trajectories or not candidates:
            return self._request(prompt, kind="fresh", n=self.K, version=version)
        return self._request(prompt, kind="replay", n=self.K - 1, version=version, candidates=candidates)

    def _request(
        self, prompt: Prompt, *, kind: str, n: int, version: int, candidates: tuple = ()
    ) -> GenerationRequest:
        self.next_request_id += 1
        return GenerationRequest(
            request_id=self.next_request_id,
            prompt=prompt,
            n=n,
            kind=kind,  # type: ignore[arg-type]
            admitted_version=version,
            candidates=candidates,
        )

    def _submit(self, plan: StepPlan, requests: Sequence[GenerationRequest]) -> None:
        plan.request_ids |= {r.request_id for r in requests}
        for r in requests:
            self.owner[r.request_id] = plan.step
        self.rollouts.submit(requests=requests)

    def run_out(self, err: OutOfQuestions, *, steps: int) -> None:
        """Training ends after `steps` steps (fewer than `trainer.steps`): the data ran out."""
        self.out_of_work = f"{err}: training ends after {steps} of {self.cfg.trainer.steps} steps"
        log.warning("%s", self.out_of_work)
        self._steps = steps

    # -- 3. results and pulls --------------------------------------------------------------------------
    def receive(self, *, timeout_s: float) -> bool:
        """Receive the samplers' finished results (at most `timeout_s` for the first) and mark them done in
        their steps' plans; whether there were any."""
        results = self.rollouts.poll(timeout_s=timeout_s)
        for result in results:
            if self.watch is not None:
                self.watch(result)
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

    def pull(self, plan: StepPlan, *, wanted: set[int], version: int) -> tuple[list[Group], set[int]]:
        """The groups of the `wanted` requests of `plan` (all done), taken out of Replay, and the requests still
        wanted: replay requests dropped by Replay (their question retired in flight) are re-issued as fresh ones
        at learner version `version`, to be waited for and pulled next. Raises `OutOfQuestions` when the stream
        has no replacement."""
        pulled = self.replay.pull_batch(request_ids=sorted(wanted))
        self.replay_stats = pulled.stats
        if not pulled.dropped:
            return list(pulled.groups), set()
        dropped = len(pulled.dropped)
        log.info("step %d: %d replay questions retired in flight; re-issued as fresh", plan.step, dropped)
        plan.request_ids -= set(pulled.dropped)
        plan.done -= set(pulled.dropped)
        plan.n_replay -= dropped
        plan.n_fresh += dropped
        plan.replaced += dropped
        requests = [
            self._request(p, kind="fresh", n=self.K, version=version) for p in self.stream.next(dropped)
        ]
        self._submit(plan, requests)
        return list(pulled.groups), {r.request_id for r in requests}

    # -- 5. the update of a step starts, later its record ----------------------------------------------
    def start_batch(self, step: int, groups: Sequence[Group]) -> BatchStart:
        """Step `step`'s groups go to the update: its fresh solve ratio advances the delayed start, its fresh
        groups' zero-variance share sizes the next admissions (`replay_slots`). Clipping follows the delayed
        start *before* this step's ratio: removed from the step after the start (official `loss_remove_clip`,
        with `loss.remove_clip_after_replay`). Replay collects once `apply_delayed_start` is called."""
        solve = solve_ratio([g for g in groups if g.kind == "fresh"])
        self.fresh_zero_var = zero_variance_share(groups, default=self.fresh_zero_var)
        started_before = self.delayed_start.started
        clip = not (started_before and self.cfg.loss.remove_clip_after_replay)
        started = self.delayed_start.update(solve_ratio=solve)
        if started and not started_before:
            self._collect_from = (step, solve)
        return BatchStart(
            plan=self.plans[step],
            solve=solve,
            clip=clip,
            replay=replay_metrics(self.replay_stats, started=started, k_rollouts=self.K),
        )

    def apply_delayed_start(self) -> None:
        """When the step `start_batch` last saw fired the delayed start: Replay stores correct trajectories from
        now on (`Replay.set_collect`). The driver calls it right after that step's update started."""
        if self._collect_from is None:
            return
        (step, solve), self._collect_from = self._collect_from, None
        self.replay.set_collect(on=True)
        log.info("replay started at step %d (fresh solve ratio %.3f)", step, solve)

    def retire_plan(self, step: int) -> None:
        """Step `step` is recorded: its plan is done with."""
        del self.plans[step]

    def drained(self) -> None:
        """Every admitted request is done (a checkpoint): read the replay statistics a resumed scheduler reads
        first, so both continue alike."""
        self.replay_stats = self.replay.stats()

    # -- checkpoint state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-able; call it drained. The keys are the driver checkpoint's (`Driver.state_dict`)."""
        return {
            "next_schedule": self.next_schedule,
            "next_request_id": self.next_request_id,
            "rng": self.rng.bit_generator.state,
            "stream": self.stream.state_dict(),
            "delayed_start": self.delayed_start.state_dict(),
            "plans": [p.state_dict() for p in self.plans.values()],
            "fresh_zero_var": self.fresh_zero_var,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The state `state_dict` wrote, into a scheduler over restored roles: Replay collects again when the
        delayed start had fired."""
        self.next_schedule, self.next_request_id = int(state["next_schedule"]), int(state["next_request_id"])
        self.rng.bit_generator.state = state["rng"]
        self.stream.load_state_dict(state["stream"])
        self.delayed_start.load_state_dict(state["delayed_start"])
        self.fresh_zero_var = float(state.get("fresh_zero_var", 0.5))  # older checkpoints: the start value
        self.plans = {p["step"]: StepPlan.from_state_dict(p) for p in state["plans"]}
        self.replay_stats = self.replay.stats()
        self.replay.set_collect(on=self.delayed_start.started)
