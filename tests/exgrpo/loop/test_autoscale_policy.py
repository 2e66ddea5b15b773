"""The autoscale policy on plain numbers (`exgrpo/loop/autoscale.py`) and `Fleet` over a fake pool."""

from __future__ import annotations

import math
from typing import Any

import pytest

from exgrpo.core import metric_names as M
from exgrpo.core.config import ConfigError, from_dict
from exgrpo.loop.autoscale import Fleet, Policy, Settings, Signals
from exgrpo.loop.steps import StepTimes


def sig(step: int, *, wait: float = 0.0, idle: float = 0.0, in_flight: int = 100) -> Signals:
    return Signals(step=step, step_s=10.0, learner_wait_s=10.0 * wait, sampler_idle=idle, in_flight=in_flight)


def test_grows_after_hysteresis_to_hide_the_wait():
    p = Policy(Settings(min=1, max=16, hysteresis=2, cooldown=0))
    assert p.decide(sig(0, wait=0.5), current=2) is None  # one step is not enough
    d = p.decide(sig(1, wait=0.5), current=2)
    assert d is not None and (d.old, d.new, d.step) == (2, 4, 1)  # ceil(2 / (1 - 0.5))
    assert "waited 50%" in d.reason


def test_growth_capped_by_max_and_by_work_in_flight():
    p = Policy(Settings(min=1, max=5, hysteresis=1, cooldown=0))
    assert p.decide(sig(0, wait=0.9), current=2).new == 5
    p = Policy(Settings(min=1, max=50, hysteresis=1, cooldown=0, requests_per_call=4))
    assert p.decide(sig(0, wait=0.9, in_flight=12), current=2).new == 3  # 12 requests / 4 per call


def test_shrinks_when_blocked_and_learners_busy_never_below_min():
    p = Policy(Settings(min=2, max=16, hysteresis=2, cooldown=0))
    assert p.decide(sig(0, idle=0.6), current=8) is None
    d = p.decide(sig(1, idle=0.6), current=8)
    assert d is not None and d.new == math.ceil(8 * 0.4 * 1.1) and "blocked 60%" in d.reason
    p = Policy(Settings(min=3, max=16, hysteresis=1, cooldown=0))
    assert p.decide(sig(0, idle=0.95), current=4).new == 3
    p = Policy(Settings(min=1, max=16, hysteresis=1, cooldown=0))
    assert p.decide(sig(0, idle=0.95), current=8).new == 4  # at most half fewer in one decision


def test_no_shrink_while_learners_wait_and_streaks_reset():
    p = Policy(Settings(hysteresis=2, cooldown=0))
    assert p.decide(sig(0, idle=0.6, wait=0.5), current=4) is None  # waiting: not a surplus
    assert p.decide(sig(1, idle=0.6), current=4) is None  # the streak restarted
    assert p.decide(sig(2, wait=0.5), current=4) is None  # a grow streak breaks the shrink streak


def test_cooldown_after_a_change():
    p = Policy(Settings(max=32, hysteresis=1, cooldown=3))
    assert p.decide(sig(0, wait=0.5), current=2).new == 4
    for step in (1, 2, 3):
        assert p.decide(sig(step, wait=0.5), current=4) is None
    assert p.decide(sig(4, wait=0.5), current=4).new == 8


def test_clamps_an_operator_count_outside_the_bounds():
    p = Policy(Settings(min=2, max=4))
    d = p.decide(sig(0), current=9)
    assert d is not None and d.new == 4 and "outside" in d.reason


def test_nan_gap_is_no_wait_and_bad_settings_refused():
    assert (
        Signals(step=0, step_s=1.0, learner_wait_s=float("nan"), sampler_idle=0, in_flight=0).wait_share == 0
    )
    for bad in (dict(min=0), dict(min=5, max=4), dict(up_wait=1.0), dict(hysteresis=0)):  # refused at load
        with pytest.raises(ConfigError, match="samplers.autoscale_"):
            from_dict({"samplers": {f"autoscale_{k}": v for k, v in bad.items()}})


class FakePool:
    def __init__(self, n: int) -> None:
        self.n, self.idle, self.scaled, self.preemptions = n, 0.0, [], 0

    def size(self) -> int:
        return self.n

    def scale(self, *, num: int) -> None:
        self.scaled.append(num)
        self.n = num

    def idle_seconds(self) -> float:
        return self.idle

    def num_pending(self) -> int:
        return 64

    def members(self) -> dict[str, int]:
        return {str(i): i for i in range(self.n)}


class FakeScaling:
    def __init__(self, n: int | None, auto: bool) -> None:
        self.n, self.auto = n, auto

    def desired_samplers(self) -> int | None:
        return self.n


def record(step: int, gap: float) -> dict[str, Any]:
    """`Fleet.observe`'s arguments for a landed step of 10 s whose update waited `gap` s for its batch."""
    return {
        "step": step,
        "times": StepTimes(started_at=0.0, wait_s=0.0, issued_at=0.0, gap_s=gap, step_s=10.0),
    }


def test_fleet_follows_the_policy_in_auto_mode_and_reports_metrics():
    now = [0.0]
    pool = FakePool(2)
    fleet = Fleet(
        rollouts=pool,
        scaling=FakeScaling(2, auto=True),
        policy=Policy(Settings(max=8, hysteresis=1, cooldown=0)),
        clock=lambda: now[0],
    )
    now[0] = 10.0
    out = fleet.observe(**record(0, gap=6.0))
    assert out[M.SAMPLERS_TARGET] == 5 and out[M.SAMPLERS_LIVE] == 2  # ceil(2 / 0.4)
    fleet.apply(1)
    assert pool.scaled == [5] and fleet.decisions[0].new == 5
    now[0], pool.idle = 20.0, 0.5 * 5 * 10.0  # half the samplers' time blocked
    out = fleet.observe(**record(1, gap=0.0))
    assert out[M.SAMPLERS_BLOCKED] == pytest.approx(0.5) and out[M.SAMPLERS_TARGET] == 3


def test_fleet_without_operator_nor_policy_leaves_the_pool_alone():
    pool = FakePool(2)
    fleet = Fleet(rollouts=pool)
    pool.n = 5  # scaled from outside (a bench, a test) after the fleet was made
    fleet.apply(0)
    assert pool.scaled == [] and fleet.target == 5
    fleet.apply(1, FakeScaling(None, auto=False))  # the controller's answer has not arrived yet
    assert pool.scaled == []


def test_fleet_decides_nothing_in_the_runs_tail():
    fleet = Fleet(rollouts=FakePool(2), policy=Policy(Settings(max=8, hysteresis=1, cooldown=0)), last_step=5)
    fleet.observe(**record(6, gap=9.0))
    assert not fleet.decisions
    fleet.observe(**record(5, gap=9.0))
    assert fleet.decisions


def test_fleet_operator_count_overrides_the_policy():
    pool = FakePool(2)
    scaling = FakeScaling(6, auto=False)
    fleet = Fleet(rollouts=pool, scaling=scaling, policy=Policy(Settings(max=8, hysteresis=1, cooldown=0)))
    fleet.apply(0)
    assert pool.n == 6
    fleet.observe(**record(0, gap=9.0))
    assert not fleet.decisions  # the policy is off until --auto
    scaling.auto = True
    fleet.observe(**record(1, gap=9.0))
    assert fleet.decisions and fleet.target == 8


def test_fleet_reads_the_first_steps_wait_for_its_groups_as_the_learners_wait():
    # the run's first update has no gap (NaN): the learners, idle until it, waited the step's whole wait for
    # its groups, so a starved start grows after step 0 instead of a step later
    fleet = Fleet(rollouts=FakePool(1), policy=Policy(Settings(max=8, hysteresis=1, cooldown=0)))
    first = StepTimes(started_at=0.0, wait_s=8.5, issued_at=8.5, step_s=10.0)  # gap_s: NaN
    out = fleet.observe(step=0, times=first)
    assert out[M.SAMPLERS_TARGET] == 7 and fleet.decisions[0].step == 0  # ceil(1 / (1 - 0.85))
    fleet = Fleet(rollouts=FakePool(1), policy=Policy(Settings(max=8, hysteresis=1, cooldown=0)))
    fleet.observe(step=0, times=StepTimes(started_at=0.0, wait_s=math.nan, issued_at=0.0, step_s=10.0))
    assert not fleet.decisions  # no wait recorded at all: no signal
