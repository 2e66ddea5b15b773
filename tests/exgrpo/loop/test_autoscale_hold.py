"""The autoscale policy says why it holds (`Policy.hold`), `Fleet` logs that after its first hysteresis steps
without a change and at its last step, and `make_fleet` says at the start what the policy will do (a warning
when the run is too short for any decision)."""

from __future__ import annotations

import logging

from exgrpo.core.config import from_dict
from exgrpo.loop.autoscale import HOLD_EVERY, Fleet, Policy, Settings, Signals, make_fleet
from exgrpo.loop.steps import StepTimes


def sig(step: int, *, wait: float = 0.0, idle: float = 0.0, in_flight: int = 100) -> Signals:
    return Signals(step=step, step_s=10.0, learner_wait_s=10.0 * wait, sampler_idle=idle, in_flight=in_flight)


def test_each_hold_names_its_reason():
    p = Policy(Settings(min=1, max=4, hysteresis=2, cooldown=1))
    assert p.decide(sig(0, wait=0.05, idle=0.1), current=2) is None
    assert (
        "nothing asks for a change" in p.hold and "waited 5%" in p.hold and "autoscale_up_wait=0.15" in p.hold
    )
    assert p.decide(sig(1, wait=0.5), current=2) is None
    assert "for 1 of autoscale_hysteresis=2 steps" in p.hold
    assert p.decide(sig(2, wait=0.5), current=4) is None and "4 is autoscale_max" in p.hold
    assert p.decide(sig(3, wait=0.5, in_flight=2), current=2) is None
    assert "2 requests in flight keep no more samplers busy" in p.hold
    assert p.decide(sig(4, idle=0.9), current=1) is None and p.decide(sig(5, idle=0.9), current=1) is None
    assert "1 is autoscale_min" in p.hold
    assert p.decide(sig(6, wait=0.9), current=2) is None and p.decide(sig(7, wait=0.9), current=2) is not None
    assert (
        p.decide(sig(8, wait=0.9), current=4) is None and "cooling down after the change at step 7" in p.hold
    )


class Pool:
    """A fleet of `n` samplers that never idle, with nothing pending (`exgrpo.loop.autoscale.Pool`)."""

    def __init__(self, n: int) -> None:
        self.n, self.preemptions = n, 0

    def size(self) -> int:
        return self.n

    def scale(self, *, num: int) -> None:
        self.n = num

    def members(self) -> dict[str, int]:
        return {str(i): i for i in range(self.n)}

    def num_pending(self) -> int:
        return 0

    def idle_seconds(self) -> float:
        return 0.0


def observe(fleet: Fleet, step: int, gap: float) -> None:
    fleet.observe(
        step=step, times=StepTimes(started_at=0.0, wait_s=0.0, issued_at=0.0, gap_s=gap, step_s=10.0)
    )


def test_fleet_logs_a_hold_after_hysteresis_steps_every_hold_every_and_at_its_last_step(caplog):
    last = 2 + HOLD_EVERY + 3
    fleet = Fleet(rollouts=Pool(2), policy=Policy(Settings(max=8, hysteresis=2, cooldown=0)), last_step=last)
    with caplog.at_level(logging.INFO, logger="exgrpo.loop.driver"):
        for step in range(last + 3):
            observe(fleet, step, gap=0.3 if step == 0 else 0.0)
    holds = [r.getMessage() for r in caplog.records if "autoscale holds" in r.getMessage()]
    assert len(holds) == 3 and not fleet.decisions
    assert holds[0].startswith("step 1: autoscale holds at 2 samplers: nothing asks for a change")
    assert "steps 0-1: the learners waited at most 3% of a step" in holds[0]
    assert holds[1].startswith(f"step {1 + HOLD_EVERY}: ")
    assert holds[2].startswith(f"step {last}: ") and "its last step" in holds[2] and "0 change(s)" in holds[2]


def test_make_fleet_says_what_the_policy_will_do_and_warns_when_it_cannot_decide(caplog):
    cfg = from_dict({"samplers": {"autoscale": True, "autoscale_max": 4}, "trainer": {"steps": 20}})
    with caplog.at_level(logging.INFO, logger="exgrpo.loop.driver"):
        make_fleet(cfg, rollouts=Pool(2), scaling=None)
    assert "the policy keeps 1..4 and decides at steps 0-17" in caplog.text
    caplog.clear()
    short = from_dict({"samplers": {"autoscale": True}, "trainer": {"steps": 3}})
    with caplog.at_level(logging.INFO, logger="exgrpo.loop.driver"):
        make_fleet(short, rollouts=Pool(2), scaling=None)
    warn = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warn) == 1 and "can change nothing in this run" in warn[0].getMessage()
    assert "trainer.steps=4 or more" in warn[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="exgrpo.loop.driver"):
        make_fleet(from_dict({"trainer": {"steps": 3}}), rollouts=Pool(2), scaling=None)
    assert "samplers.autoscale" not in caplog.text  # the policy off: nothing said
