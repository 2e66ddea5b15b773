"""Each line of the loop is a call on the object that owns what it changes (exgrpo/loop/driver.py): the driver
writes no field of the Scheduler, and the broadcast is a step of landing an update, not a side effect of a wait.
Wider: the loop, the samplers (actors/) and the transport write no field of an object they do not own (`OWNED`
lists the exceptions, each with its reason), and the Driver keeps at most 15 attributes.

The loop on in-process fakes (tests/exgrpo/loop/loop_harness.py) and the sources read as trees.
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


def _targets(node: ast.AST) -> list[ast.expr]:
    """What an assignment or deletion writes (each element of a tuple target on its own); [] for other nodes."""
    if isinstance(node, ast.Assign | ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    else:
        return []
    return [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]


def _through_scheduler(node: ast.expr) -> bool:
    return any(name in SCHEDULER for name in _chain(node))


def scheduler_writes(source: str) -> list[str]:
    """Assignments and deletions into the scheduler, and calls on its members (`sched.delayed_start.update()`,
    `self.scheduler.plans.get()`) rather than on the scheduler itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = _targets(node)
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


# Writes into another object's fields that the loop, the samplers and the transport may make, keyed by (file,
# the object written through): each is an object the module made itself, or a library object it configures.
OWNED = {
    ("exgrpo/loop/pipeline.py", "update"): "the pipeline makes each Update (issue) and fills it as it lands",
    ("exgrpo/loop/pipeline.py", "times"): "the pipeline makes each update's StepTimes and fills them",
    ("exgrpo/loop/scheduler.py", "plan"): "the scheduler makes its StepPlans and fills them",
    ("exgrpo/loop/scheduler.py", "first"): "one of the scheduler's StepPlans",
    ("actors/continuous_engine.py", "params"): "the vLLM SamplingParams it builds",
    ("actors/engines.py", "self.model"): "its own HF model's generation config",
    ("actors/load_faults.py", "engine"): "a fault injected on purpose for the weight checks' tests",
    ("actors/vllm_load.py", "module"): "vLLM's model modules it loads weights into",
    ("actors/vllm_load.py", "param"): "vLLM's model parameters it loads weights into",
    ("actors/vllm_load.py", "info"): "vLLM's per-layer load bookkeeping",
    ("exgrpo/transport/gloo.py", "opts"): "torch's BroadcastOptions it builds",
    ("exgrpo/transport/gloo.py", "engine"): "the weight-transfer engine it builds for vLLM's factory",
}
FOLDERS = ("exgrpo/loop", "actors", "exgrpo/transport")


def foreign_writes(source: str) -> list[tuple[str, str]]:
    """Assignments and deletions into a field of an object other than `self` (`x.field = ...`,
    `self.member.field = ...`), as (the object written through, the target); restoring an own numpy
    generator (`self.rng.bit_generator.state = ...`) is its own state."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for t in _targets(node):
            names = _chain(t) if isinstance(t, ast.Attribute) else []
            if (
                not names
                or (names[0] == "self" and len(names) == 2)
                or names[-2:] == ["bit_generator", "state"]
            ):
                continue
            owner = "self." + names[1] if names[0] == "self" else names[0]
            found.append((owner, ast.unparse(t)))
    return found


def test_the_loop_samplers_and_transport_write_only_what_they_own():
    root = Path(driver_module.__file__).parents[2]
    found = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for owner, target in foreign_writes(path.read_text()):
                found.setdefault((rel, owner), []).append(target)
    assert not {key: targets for key, targets in found.items() if key not in OWNED}
    assert set(OWNED) <= set(found), "an OWNED entry no longer matches a write: drop it"
    # the check sees what the sampler, the transport and the weight client used to do
    planted = (
        "self.gate.session_loaded = True\n"
        "gate.on_busy = lender.mark\n"
        "self._loads.failed_in_a_row = 0\n"
        "self._engine.client.version = version\n"
        "self.rng.bit_generator.state = state['rng']\n"  # its own generator: allowed
        "self.version = 3\n"  # its own field: allowed
    )
    assert [t for _, t in foreign_writes(planted)] == [
        "self.gate.session_loaded",
        "gate.on_busy",
        "self._loads.failed_in_a_row",
        "self._engine.client.version",
    ]


def test_the_driver_keeps_at_most_15_attributes():
    tree = ast.parse(Path(driver_module.__file__).read_text())
    driver = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Driver")
    fields = {
        t.attr
        for node in ast.walk(driver)
        for t in _targets(node)
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    assert len(fields) <= 15, sorted(fields)
