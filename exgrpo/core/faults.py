"""Fault points: named moments at which a test (or an operator rehearsing a failure) makes a process die hard.

`fault_point(name)` SIGKILLs the process when ``EXGRPO_FAULTS`` names that point (``[ACTOR:]POINT[@HIT][!ACTION],...``),
no cleanup, as a crash or a lost node would (``!hang``: the calling thread blocks for good instead, as a collective
whose peer is gone does; ``!sleepS``: it sleeps S seconds and goes on, as a long call does); unset, a point costs
one dict lookup. A misspelt point is refused
(`POINTS`), and each entry fires at most once per run (a marker under ``EXGRPO_FAULTS_DIR``), so an actor Ray
restarts does not die again. `exgrpo.runtime.env.remote_actor` copies both variables (`fault_env`) into every
actor. More: docs/failures.md ("Fault points", the fault matrix); tests: tests/exgrpo/core/test_faults.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULTS_VAR = "EXGRPO_FAULTS"
FAULTS_DIR_VAR = "EXGRPO_FAULTS_DIR"
LOAD_FAULT_VAR = "EXGRPO_LOAD_FAULT"  # a sampler's weight loads go silently wrong (actors/load_faults.py)

# Every fault point in the code, and where it is. A new point is added here and documented in
# docs/failures.md (the fault points, the fault matrix).
POINTS = {
    "sampler.generate": "actors/sampler.py: engine output in hand, nothing pushed yet (with overlapped verification some of it is scored)",
    "sampler.push": "actors/sampler.py: the groups are in their shards, the result not yet returned",
    "sampler.evaluate": "actors/sampler.py: inside a held-out evaluation call",
    "sampler.transfer_init": "actors/sampler.py: a new weight-transfer world acknowledged, not yet joined",
    "sampler.update_weights": "actors/sampler.py: inside vLLM's update_weights (a weight update's data plane)",
    "shard.push.before_log": "buffers/shard.py: a push with new groups, before its log frame",
    "shard.push.logged": "buffers/shard.py: a push logged (fsync'd), not applied, not answered",
    "shard.take.before_log": "buffers/shard.py: a take, before its log frame",
    "shard.take.logged": "buffers/shard.py: a take logged (fsync'd), not applied, not answered",
    "learner.update": "learners/learner.py: the optimiser stepped, the update not yet answered",
    "learner.broadcast": "learners/learner.py: exporting or sending the weights to the samplers",
    "learner.save": "learners/learner.py: a checkpoint's HF weights written, the DeepSpeed state not",
    "controller.desired_samplers": "exgrpo/runtime/controller.py: answering the driver's poll",
}


class FaultSpecError(ValueError):
    """An `EXGRPO_FAULTS` value that names no known point, or lacks its `EXGRPO_FAULTS_DIR`."""


@dataclass(frozen=True)
class Fault:
    """One entry: die (or hang) at the `hit`-th arrival at `point` in the actor named `actor` (any if None)."""

    entry: str  # as written, the name of its marker file
    point: str
    actor: str | None
    hit: int
    hang: bool = False  # block the calling thread for good instead of dying
    sleep_s: float = 0.0  # sleep this long and go on instead of dying


@dataclass
class _Armed:
    by_point: dict[str, list[Fault]] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)  # point -> arrivals in this process
    directory: Path | None = None
    me: str | None = None  # this process's actor name (looked up once, at the first armed point)


def parse(spec: str) -> list[Fault]:
    """The entries of an `EXGRPO_FAULTS` value (see the module docstring)."""
    faults = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        body, bang, action = entry.partition("!")
        sleep = action.removeprefix("sleep")
        if (
            bang
            and action != "hang"
            and not (action.startswith("sleep") and sleep.replace(".", "", 1).isdigit())
        ):
            raise FaultSpecError(
                f"{FAULTS_VAR}: unknown action {action!r} in {entry!r}; known: hang, sleepS (S seconds)"
            )
        actor, _, rest = body.rpartition(":")
        point, _, hit = rest.partition("@")
        if point not in POINTS:
            raise FaultSpecError(
                f"{FAULTS_VAR}: unknown fault point {point!r} in {entry!r}; known: {', '.join(sorted(POINTS))}"
            )
        if hit and (not hit.isdigit() or int(hit) < 1):
            raise FaultSpecError(f"{FAULTS_VAR}: the hit count of {entry!r} must be an integer >= 1")
        faults.append(
            Fault(
                entry=entry.replace("!", "-"),
                point=point,
                actor=_short(actor) if actor else None,
                hit=int(hit or 1),
                hang=action == "hang",
                sleep_s=float(sleep) if action.startswith("sleep") else 0.0,
            )
        )
    return faults


def _short(name: str) -> str:
    return name.removeprefix("exgrpo-")


def _arm(environ: dict[str, str] | os._Environ[str]) -> _Armed:
    spec = environ.get(FAULTS_VAR, "")
    armed = _Armed()
    for f in parse(spec):
        armed.by_point.setdefault(f.point, []).append(f)
    if armed.by_point:
        directory = environ.get(FAULTS_DIR_VAR)
        if not directory:
            raise FaultSpecError(
                f"{FAULTS_VAR}={spec!r} needs {FAULTS_DIR_VAR} (a directory for the fire-once markers)"
            )
        armed.directory = Path(directory)
    return armed


_ARMED = _arm(os.environ)


def reload() -> None:
    """Re-read the environment (for tests in one process; actors read it once, at import)."""
    global _ARMED
    _ARMED = _arm(os.environ)


def fault_env() -> dict[str, str]:
    """The fault variables of this process's environment, for an actor's runtime env ({} when unset)."""
    return {k: os.environ[k] for k in (FAULTS_VAR, FAULTS_DIR_VAR, LOAD_FAULT_VAR) if os.environ.get(k)}


def fault_point(point: str) -> None:
    """Die here (SIGKILL) if `EXGRPO_FAULTS` arms `point` for this process and this arrival; else nothing."""
    faults = _ARMED.by_point.get(point)
    if faults is None:
        return
    _maybe_die(point, faults)


def _maybe_die(point: str, faults: list[Fault]) -> None:
    armed = _ARMED
    hit = armed.hits[point] = armed.hits.get(point, 0) + 1
    if armed.me is None:
        armed.me = _actor_name()
    for f in faults:
        if f.hit != hit or (f.actor is not None and f.actor != armed.me):
            continue
        assert armed.directory is not None  # _arm insists on it
        armed.directory.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(armed.directory / f.entry, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue  # this entry already fired (in an earlier incarnation of this actor)
        record = {"entry": f.entry, "actor": armed.me, "pid": os.getpid(), "time": time.time()}
        os.write(fd, json.dumps(record).encode())
        os.fsync(fd)
        os.close(fd)
        while f.hang:
            time.sleep(3600)
        if f.sleep_s:
            time.sleep(f.sleep_s)
            return
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(137)  # not reached


def _actor_name() -> str:
    """This process's Ray actor name without the `exgrpo-` prefix ("driver" outside an actor). Ray is
    read from `sys.modules` (an actor has always imported it), so this module imports nothing above it."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return "driver"
    try:
        name = ray.get_runtime_context().get_actor_name()
    except Exception:  # noqa: BLE001 - not inside an actor
        name = None
    return _short(name) if name else "driver"


def fired(directory: str | Path) -> list[dict[str, Any]]:
    """The markers of the faults that fired under `directory` (entry, actor, pid, time), oldest first."""
    path = Path(directory)
    if not path.is_dir():
        return []
    rows = [json.loads(p.read_text()) for p in path.iterdir() if p.is_file()]
    return sorted(rows, key=lambda r: float(r["time"]))
