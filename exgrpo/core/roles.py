"""The roles of the system on one page (docs/architecture.md).

The driver (`exgrpo/loop/driver.py`) is written against these Protocols only, so the training loop runs
on in-process fakes in unit tests and on Ray actors in production; `exgrpo/runtime/parts.py` is the one
module that builds the Ray-backed implementations:

    Rollouts         actors/pool.py::SamplerPool        samplers: generate, verify, push to replay
    Replay           buffers/sharded.py::ShardedReplay  question statistics, trajectories, finished groups
    Learners         learners/group.py::LearnerGroup    DeepSpeed ranks: entropies and updates
    WeightTransport  exgrpo/transport/broadcast.py      learner weights -> every sampler
    Scaling          exgrpo/runtime/controller.py       the operator's desired sampler count
    RunObserver      exgrpo/loop/observer.py            what the run reports (logger, step bar, tests)

Data between roles are the frozen records of `exgrpo/core/records.py`. Every verb takes keyword arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from exgrpo.core.records import (
    GenerationRequest,
    Prompt,
    PulledBatch,
    ReplayPick,
    ReplayStats,
    RolloutResult,
    TrainBatch,
    UpdateResult,
)


class Rollouts(Protocol):
    """Samplers: turn requests into verified groups, pushed to Replay before the result is reported."""

    restarts: int  # samplers replaced after a failure, since the start
    preemptions: int  # samplers lost to a drained or vanished node (replaced too), since the start

    def submit(self, *, requests: Sequence[GenerationRequest]) -> None:
        """Queue requests; each is reported by `poll` exactly once, after its group reached Replay."""

    def poll(self, *, timeout_s: float) -> list[RolloutResult]:
        """Results finished since the last call (waits at most `timeout_s` for the first)."""

    def evaluate(self, *, prompts: Sequence[Prompt], n: int) -> list[tuple[float, ...]]:
        """n rewards per prompt at the sampling temperature (nothing reaches Replay)."""

    def scale(self, *, num: int) -> None:
        """Grow to `num` samplers (newcomers get the current weights first) or drain the newest."""

    def size(self) -> int:
        """Live samplers that take new requests."""

    def members(self) -> Mapping[str, Any]:
        """The live samplers that take requests: stable id -> handle."""

    def num_pending(self) -> int:
        """Requests queued or generating."""

    def idle_seconds(self) -> float:
        """Sampler-seconds so far with nothing queued or in flight (the autoscale policy's signal)."""


class Replay(Protocol):
    """The experience pool and the queue of finished groups (sharded by question id)."""

    def set_collect(self, *, on: bool) -> None:
        """Start storing correct trajectories (the delayed start switches it on for good)."""

    def sample_questions(self, *, n: int, rng: np.random.Generator) -> list[ReplayPick]:
        """Up to n distinct questions by bucket weight, each with its stored candidates at this moment."""

    def pull_batch(self, *, request_ids: Sequence[int]) -> PulledBatch:
        """Take the named finished groups; replay groups whose question has retired come back as `dropped`."""

    def stats(self) -> ReplayStats:
        """Bucket sizes, retired and stored counts (also returned by every `pull_batch`)."""

    def retired(self) -> frozenset[str]:
        """Questions solved K/K (the prompt stream skips them from its next epoch)."""

    def snapshot(self, *, path: str) -> None:
        """Write every shard's pool and queue under the directory `path`."""

    def restore(self, *, path: str) -> None:
        """Load what `snapshot` wrote."""


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Pending(Protocol[T_co]):
    """A learner call in flight."""

    def wait(self, *, timeout_s: float) -> bool:
        """True once the call finished (or failed); blocks at most `timeout_s`."""

    def result(self) -> T_co:
        """The call's value, blocking until it is there; raises what the call raised."""


class Done(Generic[T]):
    """A `Pending` whose value is already there (in-process learners)."""

    def __init__(self, value: T) -> None:
        self._value = value

    def wait(self, *, timeout_s: float) -> bool:
        return True

    def result(self) -> T:
        return self._value


class Learners(Protocol):
    """The learner group (L data-parallel ranks). Calls start without waiting and run in the order they were
    started, so an update started after another scores its candidates under the weights that one produces."""

    def start_update(self, *, batch: TrainBatch) -> Pending[UpdateResult]:
        """One optimiser step (or `minibatches` of them) on the batch; its value holds the `learner/` metrics.
        With `batch.select`, slot 0 of each replay group is filled first (`exgrpo.core.selection.fill_slots`:
        the candidates scored under the weights at the call's turn, or a seeded random pick) and the value holds
        the picks and every scored candidate's entropy."""

    def save(self, *, path: str) -> None:
        """HF safetensors (rank 0) and optimiser state (every rank) under `path`."""

    def load(self, *, path: str) -> None:
        """Restore what `save` wrote."""


class WeightTransport(Protocol):
    """Moves the learner's weights to every live sampler (chosen once, at build time)."""

    def prepare(self, *, version: int) -> None:
        """Called just after the update that makes `version` started, before any later learner call: queue on
        the learners what must read exactly those weights (their export), without waiting."""

    def broadcast(self, *, version: int) -> dict[str, float]:
        """Once the update that makes `version` finished: publish its weights to every live sampler (what
        `prepare(version=version)` queued; without it, the learners' current weights); returns `system/`
        timing metrics."""

    def catch_up(self, handle: Any) -> None:
        """Bring a sampler the pool just added to the last published weights, before its first request
        (the pool calls it through `SamplerPool.on_new`)."""


class Scaling(Protocol):
    """Where an operator's sampler count comes from (`python -m exgrpo.scale`)."""

    def desired_samplers(self) -> int | None:
        """The requested count, or None when there is no (new) answer; never blocks."""


class RunObserver(Protocol):
    """What a run reports as it goes; an observer only watches (what it returns is ignored, what it raises
    ends the run). The driver calls `on_batch`, `on_step`, `on_eval` and `on_candidates`; the training recipe
    (`exgrpo/runtime/recipe.py`) calls `on_train_start` and `on_train_end` with the system it built.
    `exgrpo/loop/observer.py` has a no-op base to subclass and `Observers`, several as one."""

    def on_train_start(self, *, system: Any, driver: Any) -> None:
        """Before the first step (after a resume's restore): the actors (`System`) and the `Driver`."""

    def on_batch(self, *, batch: TrainBatch) -> None:
        """Every step's shuffled batch as trained (slot 0 filled), once its update finished, right before the
        step's `on_step`."""

    def on_step(self, *, record: dict[str, Any]) -> None:
        """Every step's metrics record (docs/metrics.md), after its evaluation, before its checkpoint."""

    def on_eval(self, *, record: dict[str, Any]) -> None:
        """The held-out evaluation before the first step, as a record of its own: step -1, eval/ keys only."""

    def on_candidates(self, *, step: int, rows: list[dict[str, Any]]) -> None:
        """One row per replay candidate scored at `step` (entropy, trace validity); only with a trace check."""

    def on_train_end(self, *, system: Any, driver: Any) -> None:
        """After the last step and the final save, before the actors stop (not when the run fails)."""
