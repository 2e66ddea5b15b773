"""Each line of the loop is a call on the object that owns what it changes (exgrpo/loop/driver.py): the driver
writes no field of the Scheduler, and the broadcast is a step of landing an update, not a side effect of a wait.

The loop on in-process fakes (tests/exgrpo/loop/loop_harness.py) and the driver's source read as a tree.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from loop_harness import build, check_batches, config, qnum

import exgrpo.loop.driver as driver_module

SCHEDULER = ("scheduler", "sched")  # the driver's names for its Scheduler: `self.scheduler`, `sched`


def _chain(node: ast.expr) -> list[str]:
    """`self.scheduler.plans[step]` -> ["self", "scheduler", "plans"]: the names an expression goes through."""
    names: list[str] = []
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def _through_scheduler(node: ast.expr) -> bool:
    return any(name in SCHEDULER for name in _chain(node))


def scheduler_writes(source: str) -> list[str]:
    """Assignments and deletions into the scheduler, and calls on its members (`sched.delayed_start.update()`,
    `self.scheduler.plans.get()`) rather than on the scheduler itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        found += [ast.unparse(t) for t in targets if _through_scheduler(t) and _chain(t)[-1] not in SCHEDULER]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if _through_scheduler(owner) and _chain(owner)[-1] not in SCHEDULER:
                found.append(ast.unparse(node))
    return found


def test_the_driver_writes_no_scheduler_field():
    assert scheduler_writes(Path(driver_module.__file__).read_text()) == []
    # the check sees what the driver used to do
    planted = (
        "sched.steps = self.cfg.trainer.steps\n"
        "sched.fresh_zero_var = 0.5\n"
        "del self.scheduler.plans[step]\n"
        "sched.delayed_start.update(solve_ratio=solve)\n"
        "sched = self.scheduler\n"  # a name for it, not a write into it
        "sched.admit(version=0)\n"  # a call on the scheduler itself
    )
    assert scheduler_writes(planted) == [
        "sched.steps",
        "sched.fresh_zero_var",
        "self.scheduler.plans[step]",
        "sched.delayed_start.update(solve_ratio=solve)",
    ]


def test_the_scheduler_keeps_its_steps():
    driver, *_ = build(config("trainer.steps=3"), lambda r, i, v: 1.0)
    assert driver.scheduler.steps == 3
    with pytest.raises(AttributeError):
        driver.scheduler.steps = 5  # type: ignore[misc]


def test_a_wait_broadcasts_nothing_and_the_mix_is_a_frozen_record():
    # with overlap, updates finish while the driver waits for the next step's groups: the wait hands them
    # back (False) and the driver lands them (broadcast, record) before waiting on
    cfg = config("async.max_staleness=1", "async.overlap_update=true", "trainer.steps=6")
    driver, _, learners, _ = build(
        cfg, lambda r, i, v: float(i < 1 + qnum(r) % 2), version_at="submit", lag=3
    )
    weights, wait, answers = driver.weights, driver.wait, []

    def watched(step: int) -> bool:
        before = list(weights.broadcasts)
        answers.append(wait(step))
        assert weights.broadcasts == before, "a wait broadcast"
        return answers[-1]

    driver.wait = watched  # type: ignore[method-assign]
    mixes = []
    mix = driver.mixer.mix
    driver.mixer.mix = lambda *a, **k: mixes.append(mix(*a, **k)) or mixes[-1]  # type: ignore[method-assign]
    records = driver.train()
    check_batches(records, learners)
    assert weights.broadcasts == list(range(1, 7))
    assert False in answers and True in answers  # updates finished during waits, and landed outside them
    assert len(mixes) == 6 and all(dataclasses.is_dataclass(m) for m in mixes)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mixes[0].select = None
