"""In-process fakes of the roles in `exgrpo/core/roles.py` (no Ray, no model) for driver tests.

FakeRollouts "generates" a request when it is polled (or at once), with rewards scripted by a
function of (request, rollout index, weights version), pushes the groups into a real replay
(`ShardedReplay` over in-process `ReplayShard`s) and reports `RolloutResult`s, like a sampler does.
`Recorder` is an observer (`exgrpo.core.roles.RunObserver`) that keeps what the driver reports.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from buffers.shard import ReplayShard
from buffers.sharded import ShardedReplay, local_invoke
from exgrpo.core.records import (
    GenerationRequest,
    Group,
    Prompt,
    ReplayCandidate,
    RolloutResult,
    TrainBatch,
    Trajectory,
    UpdateResult,
)
from exgrpo.core.roles import Done, Learners, Pending, Replay, Rollouts, RunObserver, WeightTransport
from exgrpo.core.selection import fill_slots
from exgrpo.loop.observer import Observer

# reward(request, index, version) -> 0.0 or 1.0
RewardFn = Callable[[GenerationRequest, int, int], float]


def prompts(n: int) -> list[Prompt]:
    return [Prompt(qid=f"q{i}", question=f"question {i}", answer=str(i)) for i in range(n)]


def make_replay(
    k_rollouts: int, num_shards: int = 2, *, retire: bool = True
) -> tuple[ShardedReplay, list[ReplayShard]]:
    shards = [ReplayShard(k_rollouts=k_rollouts, retire=retire) for _ in range(num_shards)]
    return ShardedReplay(shards=shards, k_rollouts=k_rollouts, invoke=local_invoke), shards


def sampleable(shards: Sequence[ReplayShard]) -> int:
    """Replayable questions right now (bucket 1..K-1 with a stored trajectory), read from the shards."""
    return sum(len(s.pool) for s in shards)


class FakeWeights:
    """`events` lists ("prepare", version) and ("broadcast", version) as they are called."""

    def __init__(self, *, events: list[tuple[str, int]] | None = None) -> None:
        self.version = 0
        self.broadcasts: list[int] = []
        self.caught_up: list[Any] = []
        self.events = events if events is not None else []

    def prepare(self, *, version: int) -> None:
        self.events.append(("prepare", version))

    def broadcast(self, *, version: int) -> dict[str, float]:
        self.version = version
        self.broadcasts.append(version)
        self.events.append(("broadcast", version))
        return {}

    def catch_up(self, handle: Any) -> None:
        self.caught_up.append(handle)


@dataclass
class Submission:
    """One `submit` call as the samplers saw it."""

    version: int  # weights version at the time of the call
    requests: list[GenerationRequest]
    sampleable: int  # replayable questions in the shards at that moment


@dataclass
class FakeRollouts:
    replay: ShardedReplay
    shards: list[ReplayShard]
    weights: FakeWeights
    reward: RewardFn
    version_at: str = (
        "poll"  # "poll": weights when generated; "submit": weights when submitted (max staleness)
    )
    hold: Callable[[GenerationRequest], int] = lambda r: 0  # polls to hold a request back
    duplicate: Callable[[GenerationRequest], bool] = lambda r: False  # push a second, re-generated copy
    before_push: Callable[[FakeRollouts, GenerationRequest], None] | None = None
    restarts: int = 0
    preemptions: int = 0
    # reward failures a sampler reports with a request: (count, the first-of-kind notes it sends)
    failures: Callable[[GenerationRequest], tuple[int, tuple[tuple[str, str], ...]]] = lambda r: (0, ())
    submissions: list[Submission] = field(default_factory=list)
    pending: list[list[Any]] = field(default_factory=list)  # [request, polls left, version at submit]
    pushed: dict[int, Group] = field(default_factory=dict)  # request id -> the copy pushed first
    duplicates: dict[int, Group] = field(default_factory=dict)  # request id -> the second copy
    reported: list[int] = field(default_factory=list)
    polls: int = 0

    def submit(self, *, requests: Sequence[GenerationRequest]) -> None:
        self.submissions.append(Submission(self.weights.version, list(requests), sampleable(self.shards)))
        self.pending += [[r, self.hold(r), self.weights.version] for r in requests]

    def poll(self, *, timeout_s: float) -> list[RolloutResult]:
        self.polls += 1
        ready: list[list[Any]] = []
        still: list[list[Any]] = []
        for item in self.pending:
            (ready if item[1] <= 0 else still).append(item)
            item[1] -= 1
        self.pending = still
        out = []
        for request, _, submitted_at in ready:
            version = submitted_at if self.version_at == "submit" else self.weights.version
            if self.before_push is not None:
                self.before_push(self, request)
            group = self.generate(request, version)
            self.replay.push(groups=[group])
            self.pushed[request.request_id] = group
            if self.duplicate(request):  # a sampler died after pushing; the request ran again elsewhere
                again = self.generate(request, version, copy=1)
                self.replay.push(groups=[again])
                self.duplicates[request.request_id] = again
            self.reported.append(request.request_id)
            out.append(
                RolloutResult(
                    sampler="fake-0",
                    request_ids=(request.request_id,),
                    policy_version=version,
                    tokens=2 * len(group.trajectories),
                    gen_time_s=0.0,
                    verify_time_s=0.0,
                    reward_failures=self.failures(request)[0],
                    reward_failure_notes=self.failures(request)[1],
                )
            )
        return out

    def generate(self, request: GenerationRequest, version: int, copy: int = 0) -> Group:
        gid = f"r{request.request_id}" + (f"-copy{copy}" if copy else "")
        trajs = tuple(
            Trajectory(
                qid=request.prompt.qid,
                response_ids=(request.request_id, i, copy),
                logprobs=(-0.5, -0.25, -1.0),
                reward=self.reward(request, i, version) if not copy else 1.0,
                policy_version=version,
                text=f"{gid}/{i}",
                group_id=gid,
            )
            for i in range(request.n)
        )
        return Group(
            qid=request.prompt.qid,
            prompt_ids=(int(request.prompt.qid[1:]), 0),
            trajectories=trajs,
            kind=request.kind,
            gold=request.prompt.answer,
            group_id=gid,
            request_id=request.request_id,
            policy_version=version,
            admitted_version=request.admitted_version,
            candidates=request.candidates if request.kind == "replay" else (),
        )

    def solved_group(self, qid: str, request_id: int) -> Group:
        """A fresh group of `qid` with all K rollouts correct (as if another sampler had finished it)."""
        trajs = tuple(
            Trajectory(
                qid=qid,
                response_ids=(request_id, i, 0),
                logprobs=(-0.5, -0.25, -1.0),
                reward=1.0,
                policy_version=self.weights.version,
                group_id=f"r{request_id}",
            )
            for i in range(self.replay.k_rollouts)
        )
        return Group(
            qid=qid,
            prompt_ids=(int(qid[1:]), 0),
            trajectories=trajs,
            group_id=f"r{request_id}",
            request_id=request_id,
            policy_version=self.weights.version,
        )

    def evaluate(self, *, prompts: Sequence[Prompt], n: int) -> list[tuple[float, ...]]:
        return [(0.0,) * n for _ in prompts]

    def scale(self, *, num: int) -> None:
        pass

    def size(self) -> int:
        return 1

    def members(self) -> dict[str, Any]:
        return {"fake-sampler-0": self}

    def num_pending(self) -> int:
        return len(self.pending)

    def idle_seconds(self) -> float:
        return 0.0  # the fake's sampler is never counted idle: an autoscale policy would see no surplus


class Recorder(Observer):
    """Keeps every batch, step record, evaluation record and candidate row the driver reports, in order."""

    def __init__(self) -> None:
        self.batches: list[TrainBatch] = []
        self.records: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.candidates: list[tuple[int, list[dict[str, Any]]]] = []

    def on_batch(self, *, batch: TrainBatch) -> None:
        self.batches.append(batch)

    def on_step(self, *, record: dict[str, Any]) -> None:
        self.records.append(record)

    def on_eval(self, *, record: dict[str, Any]) -> None:
        self.evals.append(record)

    def on_candidates(self, *, step: int, rows: list[dict[str, Any]]) -> None:
        self.candidates.append((step, rows))


def score(t: Trajectory) -> float:
    """The fake learner's entropy of a candidate: deterministic, distinct per trajectory."""
    rid, i, copy = t.response_ids
    return ((rid * 7 + i * 3) % 11) + 0.01 * i + copy


T = TypeVar("T")


class Lagging(Generic[T]):
    """A learner call that finishes at its `lag`-th `wait`, or at a `result` (which blocks until it is there)."""

    def __init__(self, value: T, *, lag: int, on_done: Callable[[], None]) -> None:
        self._value, self._left, self._on_done = value, lag, on_done

    def wait(self, *, timeout_s: float) -> bool:
        self._left -= 1
        if self._left == 0:
            self._on_done()
        return self._left <= 0

    def result(self) -> T:
        if self._left > 0:
            self._left = 0
            self._on_done()
        return self._value


class FakeLearners:
    """Calls finish at once (`Done`), or with `lag` > 0 at their lag-th wait (`Lagging`). `events` lists
    ("update", step) as calls start and ("updated", step) as updates finish."""

    def __init__(self, *, lag: int = 0, events: list[tuple[str, int]] | None = None) -> None:
        self.batches: list[TrainBatch] = []
        self.scored: list[list[ReplayCandidate]] = []
        self.loaded: dict | None = None
        self.lag = lag
        self.events = events if events is not None else []

    def _pending(self, value: T, *, done: tuple[str, int] | None = None) -> Pending[T]:
        if self.lag == 0:
            if done is not None:
                self.events.append(done)
            return Done(value)

        def finished() -> None:
            if done is not None:
                self.events.append(done)

        return Lagging(value, lag=self.lag, on_done=finished)

    def start_update(self, *, batch: TrainBatch) -> Pending[UpdateResult]:
        """`batches` holds what is trained: with `batch.select`, slot 0 filled as the learners fill it
        (`exgrpo.core.selection.fill_slots`; the scored candidates in `scored`)."""
        step = len(self.batches)
        self.events.append(("update", step))

        def scores(flat: Sequence[ReplayCandidate]) -> list[float]:
            self.scored.append(list(flat))
            return [score(c.trajectory) for c in flat]

        groups, entropies, picks = fill_slots(batch, scores)
        if batch.select is not None:  # the batch as trained
            batch = TrainBatch(groups=tuple(groups), version=batch.version, clip=batch.clip)
        self.batches.append(batch)
        metrics = {"learner/loss": float(len(self.batches))}
        result = UpdateResult(metrics=metrics, entropies=entropies, picks=picks)
        return self._pending(result, done=("updated", step))

    def save(self, *, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "learner.json").write_text(json.dumps({"updates": len(self.batches)}))

    def load(self, *, path: str) -> None:
        self.loaded = json.loads((Path(path) / "learner.json").read_text())


def _conforms(
    rollouts: FakeRollouts,
    learners: FakeLearners,
    weights: FakeWeights,
    replay: ShardedReplay,
    observer: Recorder,
) -> tuple[Rollouts, Learners, WeightTransport, Replay, RunObserver]:
    """Never called: mypy checks here that each fake (and the in-process replay) has its role's surface."""
    return rollouts, learners, weights, replay, observer
