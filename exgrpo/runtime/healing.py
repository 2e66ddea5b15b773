"""Self-healing runs: restart the whole system from the latest checkpoint when an actor it cannot lose dies.

`supervise` catches `exgrpo.loop.checkpoint.RunInterrupted` (a dead learner rank, or a replay shard Ray could not
restart) and starts a fresh `TrainingRecipe` with `resume=True` over the same run dir, as `--resume` would.
`recover` is the policy, pure: at most `trainer.max_failures` recoveries (`resolve_max_failures` for null), none
after an attempt that trained no step or after the last step's checkpoint; nothing but `RunInterrupted` is ever
retried. More: docs/architecture.md ("Learner and driver death"); tests: tests/exgrpo/runtime/test_healing.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from exgrpo.core.config import Config
from exgrpo.loop.checkpoint import RunInterrupted, checkpoint_step, interrupted_message, latest_checkpoint
from exgrpo.loop.observer import Observer

log = logging.getLogger("exgrpo")
T = TypeVar("T")

# the auto value of trainer.max_failures on an existing cluster
CLUSTER_MAX_FAILURES = 3


def attached_to_cluster(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the run attaches to an existing Ray cluster (RAY_ADDRESS set, as in a `ray job submit` entrypoint)
    rather than starting a local throwaway one (`exgrpo.runtime.env.init_ray`)."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("RAY_ADDRESS") or environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"))


def resolve_max_failures(cfg: Config, environ: Mapping[str, str] | None = None) -> int:
    """`trainer.max_failures`, or for null: 3 on an existing cluster, 0 on a local one."""
    if cfg.trainer.max_failures is not None:
        return cfg.trainer.max_failures
    return CLUSTER_MAX_FAILURES if attached_to_cluster(environ) else 0


@dataclass(frozen=True)
class Attempt:
    """One start of the system within a job: the first (`recovery` 0) or recovery `recovery`."""

    recovery: int = 0
    resume: bool = False  # restore the run dir's latest checkpoint (a --resume, or a recovery that has one)
    run_dir: Path | None = None  # a recovery's run dir: the failed attempt's (None: the config's own)
    from_step: int = 0  # the step a recovery restarts at (its checkpoint's, or 0)

    def config(self, cfg: Config, *, samplers: int | None = None) -> Config:
        """`cfg` pointed at the failed attempt's run dir (a run dir left to runs/<time> must not move), starting
        `samplers` sampler actors when given: the count the operator last set with `exgrpo.scale`."""
        if self.run_dir is None:
            return cfg
        cfg = dataclasses.replace(cfg, logging=dataclasses.replace(cfg.logging, run_dir=str(self.run_dir)))
        if samplers is not None and samplers != cfg.samplers.num:
            log.info(
                "recovery %d starts %d samplers (the count last set with exgrpo.scale)",
                self.recovery,
                samplers,
            )
            cfg = dataclasses.replace(cfg, samplers=dataclasses.replace(cfg.samplers, num=samplers))
        return cfg


@dataclass
class Job(Observer):
    """What one `train()` call keeps across its attempts: its start time and, as an observer of every attempt's
    driver, the step records it trained, each step once (an attempt that restarts at step s first drops the
    records of steps >= s, which it trains again)."""

    t_start: float = field(default_factory=time.perf_counter)
    records: list[dict[str, Any]] = field(default_factory=list)
    samplers: int | None = None  # the desired sampler count when the last attempt stopped (exgrpo.scale's)

    def rewind(self, step: int) -> None:
        self.records = [r for r in self.records if r["step"] < step]

    def on_step(self, *, record: dict[str, Any]) -> None:
        self.records.append(record)

    def wall_s(self) -> float:
        return time.perf_counter() - self.t_start


@dataclass
class RunResult:
    """What one `train()` call ends with, over all its attempts (the recipe's `report` stage builds it)."""

    run_dir: Path
    records: list[dict[str, Any]]
    evals: list[dict[str, float]]
    wall_s: float  # the whole job, every attempt
    # seconds of every checkpoint write (of the last attempt)
    checkpoint_s: list[float] = field(default_factory=list)
    recoveries: int = 0  # in-job restarts from a checkpoint (trainer.max_failures)
    stopped: str | None = None  # stopped early by SIGINT / SIGTERM at a step boundary (checkpointed)
    resume_command: str | None = None  # how to continue a stopped run


def stop(err: RunInterrupted, why: str) -> RunInterrupted:
    """`err` as the run's final RunInterrupted: the usual message and resume command, and why it stopped."""
    message = interrupted_message(err.run_dir, what=err.what, step=err.step, why=why)
    return RunInterrupted(
        message, run_dir=err.run_dir, checkpoint=latest_checkpoint(err.run_dir), what=err.what, step=err.step
    )


def recover(current: Attempt, err: RunInterrupted, *, max_failures: int, steps: int) -> Attempt:
    """The attempt that recovers from `err` (which ended `current`), or raises the run's final RunInterrupted
    when the policy (module docstring) refuses; `steps` is `trainer.steps`."""
    n = current.recovery + 1
    if current.recovery >= max_failures:
        raise stop(
            err,
            f"trainer.max_failures={max_failures} reached"
            if max_failures
            else "trainer.max_failures=0: no recovery inside the job",
        ) from err
    if current.recovery > 0 and err.step <= current.from_step:
        raise stop(
            err,
            f"not recovered again: it died before training a step since recovery {current.recovery} restarted at "
            f"step {current.from_step}, so a restart would most likely fail the same way",
        ) from err
    ckpt = latest_checkpoint(err.run_dir)
    start = checkpoint_step(ckpt) if ckpt is not None else 0
    if start >= steps:
        raise stop(
            err, f"its last checkpoint holds all {steps} steps; its model/ is the trained policy"
        ) from err
    log.warning(
        "recovery %d of %d: %s at step %d; %s",
        n,
        max_failures,
        err.what or "an actor of the run died",
        err.step,
        f"restoring {ckpt} (step {start})" if ckpt else "no checkpoint yet: restarting from step 0",
    )
    return Attempt(recovery=n, resume=ckpt is not None, run_dir=Path(err.run_dir), from_step=start)


def supervise(start: Callable[[Attempt], T], *, first: Attempt, max_failures: int, steps: int) -> T:
    """`start(first)`; while an attempt ends in RunInterrupted and `recover` allows it, `start` the next."""
    attempt = first
    while True:
        try:
            return start(attempt)
        except RunInterrupted as err:
            attempt = recover(attempt, err, max_failures=max_failures, steps=steps)
