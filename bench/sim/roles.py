"""A simulated cluster's roles: `SimSampler` and `SimLearner` sleep per a `CostModel` behind the real plumbing
(driver, replay shards, sampler pool, object-store transport, every Ray call between them;
`bench/sim/cluster.py::sim_system` wires them with `exgrpo.runtime.parts`). A `SimSampler` sleeps for its
rollouts, builds `Group`s with the real `actors/sampling.py::build_groups` and pushes them to the real shards;
`SimLearner` ranks sleep under the real `LearnerGroup`. Rewards follow a seeded per-question `Difficulty`, so
buckets fill and questions retire. Both take `num_cpus=0` (64 samplers fit 2 cores). Cost model and results:
docs/benchmarks.md ("Simulated cluster"); tests: tests/integration/test_sim_cluster.py.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from actors.sampling import build_groups
from exgrpo.core import metric_names as M
from exgrpo.core.config import LearnerConfig, LossConfig
from exgrpo.core.names import sampler_name
from exgrpo.core.records import (
    GenerationRequest,
    Group,
    Prompt,
    ReplayCandidate,
    RolloutResult,
    TrainBatch,
    UpdateResult,
)
from exgrpo.core.selection import fill_slots
from learners.group import LearnerGroup


@dataclass(frozen=True)
class CostModel:
    """Simulated seconds of the two phases of one training step, and how fast simulated time runs.

    Source: ExGRPO (arXiv 2510.02245) reports about 155 s per training step for its 7B model on 8 GPUs
    (the official verl code: generation and training colocated on the same 8 GPUs, run one after the
    other, B = 128 questions x K = 8 rollouts). The paper gives no split; we *assume* 100 s of generation
    and 55 s of update (old/ref log-probs, the replay candidates' entropy forward, the backward and the
    optimiser), about 65/35, the usual shape of a synchronous colocated RLVR step with long reasoning
    responses where decoding dominates. Re-expressed per device for a disaggregated cluster (a sampler =
    one GPU engine, a learner = one GPU, linear scaling assumed): one sampler needs 8 x 100 = 800 s for a
    whole step's batch, one learner 8 x 55 = 440 s for the update. So with S samplers and L learners the
    phases take gen_s / S and update_s / L; at S = 64, L = 8: 12.5 s and 55 s.

    `time_scale` (real seconds per simulated second) shrinks the run so a bench fits in minutes.
    """

    gen_s: float = 800.0  # one sampler generating one step's batch (`batch_rollouts` rollouts), simulated s
    update_s: float = (
        440.0  # one learner updating on one step's batch, simulated s (L learners: update_s / L)
    )
    time_scale: float = 0.01  # real seconds per simulated second
    batch_rollouts: int = 128 * 8  # rollouts in the batch `gen_s` is for (B x K)
    entropy_s: float = 0.0  # one learner scoring one replay candidate (0: folded into update_s)
    weight_load_s: float = 0.0  # a sampler applying new weights (0: not modelled; the broadcast is real)

    def rollout_real_s(self, rollouts: int) -> float:
        """Real seconds one sampler sleeps to generate `rollouts` rollouts."""
        return self.gen_s / self.batch_rollouts * rollouts * self.time_scale

    def update_real_s(self, learners: int) -> float:
        """Real seconds each of `learners` learners sleeps in one update."""
        return self.update_s / learners * self.time_scale

    def ideal_step_s(self, *, samplers: int, learners: int, rollouts: float, eta: int) -> float:
        """Real seconds of a step with zero overhead: max(generation / S, update / L) when generation overlaps
        the update (eta >= 1), their sum when it cannot (eta = 0)."""
        gen = self.rollout_real_s(1) * rollouts / samplers
        upd = self.update_real_s(learners)
        return gen + upd if eta == 0 else max(gen, upd)


@dataclass(frozen=True)
class Difficulty:
    """P(correct) of question q at policy version v: sigmoid(z_q + gain * v), z_q ~ N(mean, std) seeded by qid."""

    mean: float = -0.3  # logit of the median question's solve rate at version 0 (about 0.43)
    std: float = 1.5  # spread over questions: some never solved, some solved K/K and retired
    gain: float = 0.02  # logit gained per policy version (the model "learns")
    seed: int = 0

    def p_correct(self, qid: str, version: int) -> float:
        digest = hashlib.blake2b(f"{self.seed}:{qid}".encode(), digest_size=8).digest()
        z = np.random.default_rng(int.from_bytes(digest, "little")).normal(self.mean, self.std)
        return 1.0 / (1.0 + math.exp(-(z + self.gain * version)))


@dataclass(frozen=True)
class SimCompletion:
    """The fields `build_groups` reads of an `actors.engines.Completion` (whose module imports torch, which
    64 sleeping sampler processes need not load)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    version_spans: tuple[tuple[int, int], ...] = ()


def _tokens(rng: np.random.Generator, n: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    ids = rng.integers(3, 30000, size=n)
    logprobs = -rng.exponential(0.7, size=n)
    return tuple(int(i) for i in ids), tuple(float(x) for x in logprobs)


class SimSampler:
    """The `actors/sampler.py::Sampler` remote surface, with a sleeping engine (run as `exgrpo-sampler-<i>`)."""

    def __init__(
        self,
        *,
        index: int,
        cost: CostModel,
        replay: Any = None,
        difficulty: Difficulty = Difficulty(),
        response_len: int = 32,
        seed: int = 0,
    ) -> None:
        self.name = sampler_name(index)
        self.cost, self.replay, self.difficulty = cost, replay, difficulty
        self.response_len, self._seed = response_len, seed
        self._version = 0
        self.weight_load_s = 0.0
        self.busy_s = 0.0  # seconds spent "generating" (sleeping for the cost model)

    # the hooks of ray.rllib's FaultTolerantActorManager
    def ping(self) -> str:
        return "pong"

    def apply(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return func(self, *args, **kwargs)

    def generate(self, *, requests: Sequence[GenerationRequest]) -> RolloutResult:
        """Sleep for the requested rollouts, build verified-looking groups, push them; returns the summary."""
        t0 = time.perf_counter()
        version = self._version
        groups = [self._group(r, version) for r in requests]
        rollouts = sum(r.n for r in requests)
        time.sleep(max(0.0, t0 + self.cost.rollout_real_s(rollouts) - time.perf_counter()))
        t1 = time.perf_counter()
        self.busy_s += t1 - t0
        if self.replay is not None:
            self.replay.push(groups=groups)
        return RolloutResult(
            sampler=self.name,
            request_ids=tuple(r.request_id for r in requests),
            policy_version=version,
            tokens=rollouts * self.response_len,
            gen_time_s=t1 - t0,
            verify_time_s=0.0,
            groups=tuple(groups) if self.replay is None else (),
        )

    def _group(self, req: GenerationRequest, version: int) -> Group:
        """The request's group, built as the real samplers build theirs (`actors/sampling.py::build_groups`)."""
        rng = np.random.default_rng([self._seed, req.request_id])  # a re-issued request repeats its group
        p = self.difficulty.p_correct(req.prompt.qid, version)
        completions, rewards = [], []
        for _ in range(req.n):
            correct = bool(rng.random() < p)
            ids, logprobs = _tokens(rng, self.response_len)
            answer = req.prompt.answer if correct else f"{req.prompt.answer}1"
            completions.append(SimCompletion(ids, logprobs, f"... so the answer is \\boxed{{{answer}}}"))
            rewards.append(float(correct))
        prompt_ids = tuple(int(b) for b in hashlib.blake2b(req.prompt.qid.encode(), digest_size=16).digest())
        outs = [completions]  # build_groups reads the four fields a SimCompletion has
        return build_groups([req], [prompt_ids], outs, rewards, versions=[version])[0]  # type: ignore[arg-type]

    def evaluate(
        self,
        *,
        prompts: Sequence[Prompt],
        n: int = 1,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> list[tuple[float, ...]]:
        """n rewards per prompt at the current version (sleeps for n rollouts each); nothing is pushed."""
        time.sleep(self.cost.rollout_real_s(n * len(prompts)))
        rng = np.random.default_rng([self._seed, self._version, 7])
        return [
            tuple(float(rng.random() < self.difficulty.p_correct(p.qid, self._version)) for _ in range(n))
            for p in prompts
        ]

    def load_weights(self, *, weights: Any, version: int) -> float:
        """Object-store transport: take the (tiny) simulated weights as `version`; returns seconds spent."""
        t0 = time.perf_counter()
        time.sleep(self.cost.weight_load_s * self.cost.time_scale)
        self._version = int(version)
        self.weight_load_s = time.perf_counter() - t0
        return self.weight_load_s

    def version(self) -> int:
        return self._version

    def checksum(self) -> float:
        return float(self._version)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        pass


class SimLearner:
    """One simulated rank: `update` sleeps update_s / L; busy intervals are kept on CLOCK_MONOTONIC."""

    def __init__(self, *, rank: int, world_size: int, cost: CostModel, **_rank: Any) -> None:
        # `_rank`: the rest of what `LearnerGroup` gives every rank (model path, configs, seed, dtype), unread
        self.rank, self.world_size, self.cost = rank, world_size, cost
        self.reset()

    def rendezvous(self) -> tuple[str, int]:
        return "", 0  # no torch.distributed world

    def setup(self, *, rendezvous: tuple[str, int] | None = None) -> None:
        pass

    def reset(self) -> None:
        self._version = 0
        # (start, end) of every update/entropy, time.monotonic()
        self.intervals: list[tuple[float, float]] = []
        self.update_starts: list[float] = []  # when each update call began, time.monotonic()

    def ping(self) -> str:
        return "pong"

    def _sleep(self, seconds: float) -> float:
        t0 = time.monotonic()
        time.sleep(max(0.0, seconds))
        self.intervals.append((t0, time.monotonic()))
        return self.intervals[-1][1] - t0

    def entropies(self, *, candidates: Sequence[ReplayCandidate]) -> list[float]:
        """Mean negative log-prob of each candidate (a stand-in for its mean token entropy)."""
        self._sleep(self.cost.entropy_s * len(candidates) * self.cost.time_scale)
        return [float(-np.mean(c.trajectory.logprobs)) for c in candidates]

    def update(self, batch: TrainBatch) -> UpdateResult:
        """`learners/learner.py::Learner.update`: slot 0 filled as the learner fills it
        (`exgrpo.core.selection.fill_slots`), then a sleep for the update."""
        groups, entropies, picks = fill_slots(batch, lambda flat: self.entropies(candidates=flat))
        return UpdateResult(
            metrics=self._train(groups, version=batch.version), entropies=entropies, picks=picks
        )

    def set_cost(self, cost: CostModel) -> None:  # e.g. the learners become the bottleneck mid-run
        self.cost = cost

    def _train(self, groups: Sequence[Group], *, version: int) -> dict[str, float]:
        self.update_starts.append(time.monotonic())
        seconds = self._sleep(self.cost.update_real_s(self.world_size))
        self._version = version + 1
        rewards = [t.reward for g in groups for t in g.trajectories]
        return {
            M.LEARNER_TOKENS: float(sum(len(t.response_ids) for g in groups for t in g.trajectories)),
            M.LEARNER_UPDATE_TIME: seconds,
            "learner/sim_reward_mean": float(np.mean(rewards)) if rewards else 0.0,
        }

    def get_weights(self) -> dict[str, np.ndarray]:
        return {"sim.version": np.array([self._version], dtype=np.int64)}

    def version(self) -> int:
        return self._version

    def busy(self) -> list[tuple[float, float]]:
        return list(self.intervals)

    def starts(self) -> list[float]:
        return list(self.update_starts)

    def pid(self) -> int:
        return os.getpid()


class SimLearnerGroup(LearnerGroup):
    """L `SimLearner` actors: `learners/group.py::LearnerGroup` with `learner_cls=SimLearner`, so the batch
    is split, checked (rows per mini-batch) and combined as the real group does it; the ranks reserve no CPU,
    run concurrently, and an update is finished when the slowest rank has finished.
    """

    def __init__(self, *, num: int, cost: CostModel, make_actor: Callable[..., Any]) -> None:
        import functools

        import ray

        self._ray = ray
        super().__init__(
            num=num,
            make_actor=functools.partial(make_actor, cost=cost),
            model_path="",
            learner_cfg=LearnerConfig(num=num, num_cpus=0.0),
            loss_cfg=LossConfig(),
            max_response_len=0,
            learner_cls=SimLearner,
        )

    def busy(self) -> list[list[tuple[float, float]]]:
        """Every rank's busy intervals (time.monotonic(), comparable across processes of one machine)."""
        return self._ray.get([a.busy.remote() for a in self.actors])

    def update_starts(self) -> list[float]:
        """When each update began on rank 0 since the last reset, in order (time.monotonic())."""
        return list(self._ray.get(self.rank0.starts.remote()))

    def set_cost(self, cost: CostModel) -> None:
        self._ray.get([a.set_cost.remote(cost) for a in self.actors])

    def reset(self) -> None:
        """Version 0 and no busy intervals on every rank (a bench reuses the group across runs)."""
        self._ray.get([a.reset.remote() for a in self.actors])

    def save(self, *, path: str) -> None:
        from pathlib import Path

        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "sim_learner.txt").write_text(str(self.version()))

    def load(self, *, path: str) -> None:
        pass  # the simulated learners have no state beyond their version, which the driver re-broadcasts


def sampler_factory(
    cost: CostModel,
    *,
    replay: Any,
    difficulty: Difficulty = Difficulty(),
    response_len: int = 32,
    seed: int = 0,
    num_cpus: float = 0.0,
) -> Callable[[int], Any]:
    """`make_samplers(spawn=...)`: index -> a `SimSampler` actor pushing to `replay` (1 CPU: each needs a node)."""
    from exgrpo.runtime.env import remote_actor

    def make(index: int) -> Any:
        return remote_actor(
            SimSampler,
            name=sampler_name(index),
            num_cpus=num_cpus,
            index=index,
            cost=cost,
            replay=replay,
            difficulty=difficulty,
            response_len=response_len,
            seed=seed,
        )

    return make


def sim_prompts(n: int, *, prefix: str = "sim") -> list[Prompt]:
    """n questions with distinct qids and answers (the text is never read by the simulated samplers)."""
    return [Prompt(qid=f"{prefix}-{i}", question=f"simulated question {i}", answer=str(i)) for i in range(n)]


def busy_fraction(intervals: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Share of [start, end] covered by the (disjoint) intervals."""
    covered = sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)
    return covered / max(end - start, 1e-9)
