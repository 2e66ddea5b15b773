"""The sampler fleet's size (`samplers.autoscale`): `Policy`, pure, over each step's `Signals`, and `Fleet`,
which applies it (or the operator's fixed count, `python -m exgrpo.scale`) once per step. No Ray.
Grow when the learners waited for generation more than `autoscale_up_wait` of the step (the first step of a
run, which has no update before it: its wait for its groups, so a starved start grows at once); shrink when the
samplers sat blocked by the staleness bound more than `autoscale_down_idle` and the learners did not wait.
Either needs `autoscale_hysteresis` steps in a row and stays in [`autoscale_min`, `autoscale_max`]; after a
change none for `autoscale_cooldown` steps, and none in a run's last eta + 1 steps (`Fleet.last_step`). Each
`Decision` is logged as a warning; a policy that holds says why (`Policy.hold`) in an info line after its first
`autoscale_hysteresis` steps without a change, every `HOLD_EVERY` such steps after that and at its last step, and
`make_fleet` logs the policy's range and window at the start (a warning when the run is too short for any
decision). The targets' formulas: docs/operating.md ("Elastic and spot samplers"); tests:
tests/exgrpo/loop/test_autoscale_policy.py, tests/exgrpo/loop/test_autoscale_hold.py.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from exgrpo.loop.steps import StepTimes

log = logging.getLogger("exgrpo.loop.driver")  # the driver's decisions, where its scaling lines always were

HEADROOM = 1.1  # a shrink keeps 10% more samplers than the idle share alone would leave
HOLD_EVERY = 10  # steps without a change between two of the policy's "holds" lines


@dataclass(frozen=True)
class Settings:
    """The policy's settings (the `samplers.autoscale_*` fields, checked when the config loads:
    `exgrpo.core.config_checks.BOUNDS`)."""

    min: int = 1
    max: int = 8
    up_wait: float = 0.15
    down_idle: float = 0.35
    hysteresis: int = 2
    cooldown: int = 3
    requests_per_call: int = 1

    @classmethod
    def from_config(cls, samplers: Any) -> Settings:
        """From a `SamplerConfig`."""
        return cls(
            min=samplers.autoscale_min,
            max=samplers.autoscale_max,
            up_wait=samplers.autoscale_up_wait,
            down_idle=samplers.autoscale_down_idle,
            hysteresis=samplers.autoscale_hysteresis,
            cooldown=samplers.autoscale_cooldown,
            requests_per_call=samplers.requests_per_call,
        )


@dataclass(frozen=True)
class Signals:
    """One step as the policy sees it."""

    step: int
    step_s: float  # the step's wall time
    learner_wait_s: float  # the learners without an update in that time (waiting for generation)
    sampler_idle: float  # share of the live samplers' time blocked by the staleness bound, 0..1
    in_flight: int  # requests queued or generating

    @property
    def wait_share(self) -> float:
        if not self.step_s > 0 or math.isnan(self.learner_wait_s):  # NaN: a run's first step has no gap
            return 0.0
        return min(1.0, max(0.0, self.learner_wait_s / self.step_s))


@dataclass(frozen=True)
class Decision:
    step: int
    old: int
    new: int
    reason: str


class Policy:
    """Hysteresis and cool-down around the grow / shrink rules (module docstring); pure, plain numbers."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.up_streak = 0
        self.down_streak = 0
        self.last_change: int | None = None  # the step of the last change
        self.hold = ""  # why the last `decide` changed nothing

    def decide(self, signals: Signals, *, current: int) -> Decision | None:
        """The new target after `signals`, or None (no change). `current`: the target now."""
        s, step = self.settings, signals.step
        clamped = min(s.max, max(s.min, current))
        if clamped != current:  # e.g. the operator's count was outside the bounds when --auto handed back
            return self._change(step, current, clamped, f"{current} is outside [{s.min}, {s.max}]")
        wait, idle = signals.wait_share, signals.sampler_idle
        starved, surplus = wait > s.up_wait, idle > s.down_idle and wait <= s.up_wait
        self.up_streak = self.up_streak + 1 if starved else 0
        self.down_streak = self.down_streak + 1 if surplus else 0
        if self.last_change is not None and step - self.last_change <= s.cooldown:
            self.hold = (
                f"cooling down after the change at step {self.last_change} (autoscale_cooldown={s.cooldown})"
            )
            return None
        if self.up_streak >= s.hysteresis:
            useful = max(1, math.ceil(signals.in_flight / s.requests_per_call))
            new = min(
                s.max, max(current + 1, math.ceil(current / max(1.0 - wait, 0.05))), max(useful, current)
            )
            if new > current:
                return self._change(
                    step, current, new, f"learners waited {wait:.0%} of the step for {self.up_streak} steps"
                )
            self.hold = f"the learners waited {wait:.0%} of the step, but " + (
                f"{current} is autoscale_max"
                if current >= s.max
                else f"{signals.in_flight} requests in flight keep no more samplers busy "
                f"(one per requests_per_call={s.requests_per_call})"
            )
            return None
        if self.down_streak >= s.hysteresis:
            new = max(
                s.min, (current + 1) // 2, min(current - 1, math.ceil(current * (1.0 - idle) * HEADROOM))
            )
            if new < current:
                return self._change(
                    step,
                    current,
                    new,
                    f"samplers blocked {idle:.0%} of the step for {self.down_streak} steps",
                )
            self.hold = f"the samplers were blocked {idle:.0%} of the step, but {current} is autoscale_min"
            return None
        self.hold = self._quiet(wait, idle)
        return None

    def _quiet(self, wait: float, idle: float) -> str:
        """Why a step with no streak long enough changes nothing."""
        s = self.settings
        if self.up_streak:
            return (
                f"the learners waited {wait:.0%} of the step for {self.up_streak} of "
                f"autoscale_hysteresis={s.hysteresis} steps"
            )
        if self.down_streak:
            return (
                f"the samplers were blocked {idle:.0%} of the step for {self.down_streak} of "
                f"autoscale_hysteresis={s.hysteresis} steps"
            )
        return (
            f"nothing asks for a change: the learners waited {wait:.0%} of the step (it grows above "
            f"autoscale_up_wait={s.up_wait:g}), the samplers were blocked {idle:.0%} (it shrinks above "
            f"autoscale_down_idle={s.down_idle:g} while the learners do not wait)"
        )

    def _change(self, step: int, old: int, new: int, reason: str) -> Decision:
        self.last_change, self.up_streak, self.down_streak = step, 0, 0
        return Decision(step=step, old=old, new=new, reason=reason)


class Pool(Protocol):
    """What `Fleet` reads and sets of the samplers (`actors.pool.SamplerPool`; `exgrpo.core.roles.Rollouts`
    has all of it)."""

    preemptions: int  # samplers lost to a drained or vanished node, since the start

    def scale(self, *, num: int) -> None:
        """Grow to `num` samplers or drain the newest."""

    def size(self) -> int:
        """Samplers that count towards the target (live and starting)."""

    def members(self) -> Mapping[str, Any]:
        """The live samplers that take requests."""

    def num_pending(self) -> int:
        """Requests queued or generating."""

    def idle_seconds(self) -> float:
        """Sampler-seconds so far with nothing queued or in flight."""


class Fleet:
    """Sets the samplers' count once per step: the operator's fixed count (`scaling.desired_samplers()`), or,
    while the run sizes itself (`samplers.autoscale`, not overridden by `exgrpo.scale --samplers`; `--auto`
    hands it back), the policy's target, on the pool `rollouts` (`Pool`)."""

    def __init__(
        self,
        *,
        rollouts: Pool,
        scaling: Any = None,
        policy: Policy | None = None,
        clock: Callable[[], float] | None = None,
        last_step: int | None = None,
    ) -> None:
        import time

        self.rollouts, self.scaling, self.policy = rollouts, scaling, policy
        self.last_step = last_step  # the policy decides up to this step (the run's tail drains, see above)
        self.clock = clock or time.monotonic
        self.target: int = rollouts.size()
        self.decisions: list[Decision] = []
        self._idle_mark = self._idle_now()
        self._time_mark = self.clock()
        self._quiet: list[
            tuple[int, float, float]
        ] = []  # (step, wait, blocked) since the last change or line
        self._quiet_total = 0  # steps since the last change

    @property
    def auto(self) -> bool:
        """Whether the policy sets the count now (on in the config, and no fixed count set by an operator)."""
        if self.policy is None:
            return False
        return bool(getattr(self.scaling, "auto", True))

    def apply(self, step: int, scaling: Any = None) -> None:
        """Follow the operator's count (`scaling`: the driver's, read each step); in auto mode the policy's target
        (set in `observe`)."""
        self.scaling = scaling if scaling is not None else self.scaling
        desired = self.scaling.desired_samplers() if self.scaling is not None else None
        if not self.auto:
            if desired is None:  # no new count read (or no operator): the pool's count stands
                if self.scaling is None:
                    self.target = self.rollouts.size()
                return
            self.target = desired
        if self.target != self.rollouts.size():
            # a warning, so it reaches the job's output whatever the logging level (python -m exgrpo.scale)
            log.warning("step %d: scaling samplers %d -> %d", step, self.rollouts.size(), self.target)
            self.rollouts.scale(num=self.target)

    def observe(self, *, step: int, times: StepTimes) -> dict[str, float]:
        """A landed step (its number and the pipeline's timings of it): feed the policy (auto mode) and return the
        fleet's metrics for the step's record."""
        from exgrpo.core import metric_names as M

        idle, now = self._idle_now(), self.clock()
        live = max(1, self.rollouts.size())
        window = max(now - self._time_mark, 1e-9)
        idle_share = min(1.0, max(0.0, (idle - self._idle_mark) / (live * window)))
        self._idle_mark, self._time_mark = idle, now
        if self.auto and self.policy is not None and (self.last_step is None or step <= self.last_step):
            # the first update has no gap: the learners, with nothing to do before it, waited the step's whole
            # wait for its groups
            wait = times.wait_s if math.isnan(times.gap_s) else times.gap_s
            signals = Signals(
                step=step,
                step_s=times.step_s,
                learner_wait_s=wait,
                sampler_idle=idle_share,
                in_flight=int(self._pending()),
            )
            decision = self.policy.decide(signals, current=self.target)
            if decision is not None:
                self.decisions.append(decision)
                self.target = decision.new
                self._quiet, self._quiet_total = [], 0
                log.warning(
                    "step %d: autoscale samplers %d -> %d: %s",
                    decision.step,
                    decision.old,
                    decision.new,
                    decision.reason,
                )
            else:
                self._held(signals)
        return {
            M.SAMPLERS_TARGET: float(self.target),
            M.SAMPLERS_LIVE: float(len(self._members())),
            M.SAMPLERS_BLOCKED: idle_share,
            M.SAMPLER_PREEMPTIONS: float(self.rollouts.preemptions),
        }

    def _held(self, signals: Signals) -> None:
        """A step the policy changed nothing: an info line saying why after its first `autoscale_hysteresis`
        such steps, every `HOLD_EVERY` after that, and at the policy's last step."""
        assert self.policy is not None
        self._quiet.append((signals.step, signals.wait_share, signals.sampler_idle))
        self._quiet_total += 1
        n, h, last = self._quiet_total, self.policy.settings.hysteresis, signals.step == self.last_step
        if not (n == h or (n > h and (n - h) % HOLD_EVERY == 0) or last):
            return
        first, wait, idle = self._quiet[0][0], max(q[1] for q in self._quiet), max(q[2] for q in self._quiet)
        since = f"steps {first}-{signals.step}" if first != signals.step else f"step {first}"
        tail = (
            f"; its last step (the run's last steps admit no new request): {self.target} samplers to the end, "
            f"{len(self.decisions)} change(s) in this run"
            if last
            else ""
        )
        log.info(
            "step %d: autoscale holds at %d samplers: %s (%s: the learners waited at most %.0f%% of a step, "
            "the samplers were blocked at most %.0f%%)%s",
            signals.step,
            self.target,
            self.policy.hold,
            since,
            100 * wait,
            100 * idle,
            tail,
        )
        self._quiet = []

    def _idle_now(self) -> float:
        return float(self.rollouts.idle_seconds())

    def _pending(self) -> int:
        return self.rollouts.num_pending()

    def _members(self) -> Mapping[str, Any]:
        return self.rollouts.members()


def make_fleet(cfg: Any, *, rollouts: Pool, scaling: Any) -> Fleet:
    """The driver's `Fleet`: with the policy when `samplers.autoscale` is on."""
    s = cfg.samplers
    policy = Policy(Settings.from_config(s)) if getattr(s, "autoscale", False) else None
    last = cfg.trainer.steps - 2 - cfg.async_.max_staleness  # the run's last eta + 1 steps admit nothing new
    fleet = Fleet(rollouts=rollouts, scaling=scaling, policy=policy, last_step=last)
    if policy is not None:
        log_window(policy.settings, last=last, eta=cfg.async_.max_staleness, now=fleet.target)
    return fleet


def log_window(s: Settings, *, last: int, eta: int, now: int) -> None:
    """The start's line on what the policy will do in this run; a warning when it can decide at no step."""
    if last + 1 < s.hysteresis:
        log.warning(
            "samplers.autoscale: the policy can change nothing in this run: it needs autoscale_hysteresis=%d "
            "steps in a row and decides up to step %d only (the last %d steps admit no new request); "
            "trainer.steps=%d or more gives it a step",
            s.hysteresis,
            last,
            eta + 1,
            s.hysteresis + eta + 1,
        )
        return
    log.info(
        "samplers.autoscale: samplers now %d; the policy keeps %d..%d and decides at steps 0-%d: it grows when "
        "the learners wait more than %.0f%% of a step, shrinks when the samplers are blocked more than %.0f%% "
        "(%d step(s) in a row)",
        now,
        s.min,
        s.max,
        last,
        100 * s.up_wait,
        100 * s.down_idle,
        s.hysteresis,
    )
