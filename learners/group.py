"""LearnerGroup: L learner actors (DeepSpeed data-parallel ranks) in one Ray placement group.

It implements ``exgrpo.core.roles.Learners`` plus what the weight transports need; the ranks are ``learner_cls``
actors (the DeepSpeed ``Learner``, or ``bench/sim/roles.py::SimLearner``, which reuses this fan-out and checks).
Invariants: a batch is split into L equal contiguous slices of whole groups in the order given (``learners/split.py``;
the group never reorders); ``start_update`` refuses slices with different rows per mini-batch (every rank must run
the same micro-batches); optimiser step m uses the m-th mini-batch of every rank's slice. More: docs/architecture.md
("One step, hop by hop", hop 9; "Learner and driver death"); tests: tests/learners/test_split.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Generic, TypeVar

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from exgrpo.core.config import LearnerConfig, LossConfig
from exgrpo.core.names import learner_name
from exgrpo.core.records import Group, ReplayCandidate, TrainBatch, UpdateResult
from learners.split import combine_updates, concat, split_candidates, split_groups

T = TypeVar("T")


# after the first rank's call failed with an error other than its death, how long the other ranks get to
# report theirs (a rank whose peer was killed fails in the collective with a connection error, or blocks)
DEATH_GRACE_S = 10.0


def gather(refs: Sequence[Any], *, grace_s: float = DEATH_GRACE_S) -> list[Any]:
    """`ray.get(refs)` of one call on every rank, except that a rank that died is reported as its death
    (`ray.exceptions.RayActorError`, which the training recipe recovers from) as soon as Ray knows it.

    A plain `ray.get` waits for the ranks in order: the peers of a killed rank block in their collective for
    it (until torch's timeout) or fail first with a connection error that hides the death. Here the first
    other error waits `grace_s` for a death among the remaining ranks, then is raised itself.
    """
    pending, error = list(refs), None
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=grace_s if error is not None else None)
        if not done:  # the grace ran out: no rank reported a death
            break
        try:
            ray.get(done[0])
        except ray.exceptions.RayActorError:
            raise
        except Exception as err:  # raised below unless a death comes in first
            error = error if error is not None else err
    if error is not None:
        raise error
    return ray.get(list(refs))


class RayPending(Generic[T]):
    """One call on every rank, in flight (``exgrpo.core.roles.Pending``): ``combine`` turns the ranks' values
    into the call's value; ``result`` reports a dead rank like ``gather``."""

    def __init__(self, refs: Sequence[Any], combine: Callable[[list[Any]], T]) -> None:
        self._refs, self._combine = list(refs), combine
        self._value: tuple[T] | None = None

    def wait(self, *, timeout_s: float) -> bool:
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=timeout_s, fetch_local=False)
        return len(ready) == len(self._refs) or any(_failed(r) for r in ready)

    def result(self) -> T:
        if self._value is None:
            self._value = (self._combine(gather(self._refs)),)
        return self._value[0]


def _failed(ref: Any) -> bool:
    """Whether a finished call raised (a failed rank ends the wait for its peers, which may block on it)."""
    try:
        ray.get(ref, timeout=0)
    except Exception:  # noqa: BLE001 - reported by ``result``
        return True
    return False


def _minibatch_rows(groups: Sequence[Group], minibatches: int) -> tuple[int, ...]:
    per = len(groups) // minibatches
    return tuple(sum(g.group_size for g in groups[m * per : (m + 1) * per]) for m in range(minibatches))


class LearnerGroup:
    """L ``learner_cls`` actors named ``exgrpo-learner-<i>`` (``exgrpo.core.roles.Learners``); by default the
    DeepSpeed ``learners.learner.Learner`` (imported only then: the simulated group's ranks load no torch)."""

    def __init__(
        self,
        *,
        num: int,
        make_actor: Callable[..., Any],
        model_path: str,
        learner_cfg: LearnerConfig,
        loss_cfg: LossConfig,
        max_response_len: int,
        seed: int = 0,
        dtype: str = "float32",
        wait: bool = True,
        learner_cls: type | None = None,
    ) -> None:
        if num < 1:
            raise ValueError(f"a learner group needs at least one learner, got num={num}")
        if learner_cls is None:
            from learners.learner import Learner

            learner_cls = Learner
        self.num, self.cfg = num, learner_cfg
        bundle = {"CPU": float(learner_cfg.num_cpus)}
        if learner_cfg.num_gpus > 0:
            bundle["GPU"] = float(learner_cfg.num_gpus)
        # one bundle per rank; ranks that reserve nothing (the simulated ones) need no placement group
        self._pg = (
            placement_group([dict(bundle) for _ in range(num)], strategy="PACK")
            if any(bundle.values())
            else None
        )
        if self._pg is not None:
            ray.get(self._pg.ready())

        def strategy(i: int) -> PlacementGroupSchedulingStrategy | None:
            if self._pg is None:
                return None
            return PlacementGroupSchedulingStrategy(placement_group=self._pg, placement_group_bundle_index=i)

        self.actors = [
            make_actor(
                learner_cls,
                name=learner_name(i),
                num_cpus=learner_cfg.num_cpus,
                num_gpus=learner_cfg.num_gpus,
                scheduling_strategy=strategy(i),
                model_path=model_path,
                learner=learner_cfg,
                loss=loss_cfg,
                max_response_len=max_response_len,
                rank=i,
                world_size=num,
                seed=seed,
                dtype=dtype,
            )
            for i in range(num)
        ]
        # every rank's process starts at once; rank 0 (on bundle 0's node) names the rendezvous address, which
        # Ray hands to each rank's setup when it is known (nothing here waits for it)
        rendezvous = self.actors[0].rendezvous.remote()
        self.compute: str | None = None  # what rank 0's forwards and backwards compute in, once set up
        self._setup: list[Any] = [a.setup.remote(rendezvous=rendezvous) for a in self.actors]
        if wait:
            self.ready()

    def ready(self) -> None:
        """Wait until every rank has set up (a group made with ``wait=False`` sets up in the background, e.g.
        while the samplers build their engines); a rank that died is reported as its death (``gather``)."""
        if self._setup:
            self.compute = gather(self._setup)[0]
            self._setup = []

    @property
    def rank0(self) -> Any:
        """Handle of learner rank 0 (weights export, collective sync sender)."""
        return self.actors[0]

    def entropies(self, *, candidates: Sequence[ReplayCandidate]) -> list[float]:
        return self.start_entropies(candidates=candidates).result()

    def update(self, *, batch: TrainBatch) -> UpdateResult:
        return self.start_update(batch=batch).result()

    def start_entropies(self, *, candidates: Sequence[ReplayCandidate]) -> RayPending[list[float]]:
        """Mean response-token entropy of each candidate, computed in L contiguous chunks, in order."""
        chunks = split_candidates(candidates, self.num)
        refs = [a.entropies.remote(candidates=c) for a, c in zip(self.actors, chunks, strict=True)]
        return RayPending(refs, concat)

    def start_update(self, *, batch: TrainBatch) -> RayPending[UpdateResult]:
        """One step: batch.groups split into L equal contiguous slices, each rank's `update` on its slice;
        rank metrics averaged. With `batch.select`, each rank scores and picks the candidates of its own slice's
        replay groups first; their entropies come back in batch order."""
        slices = split_groups(batch.groups, self.num)
        per = len(slices[0])
        if per % self.cfg.minibatches:
            raise ValueError(
                f"{per} groups per learner cannot form learners.minibatches={self.cfg.minibatches}"
            )
        rows = {_minibatch_rows(s, self.cfg.minibatches) for s in slices}
        if len(rows) > 1:
            raise ValueError(
                f"learner slices hold different row counts per mini-batch {sorted(rows)}; every "
                "rank must run the same number of micro-batches (give every group K trajectories)"
            )
        refs = [
            a.update.remote(replace(batch, groups=tuple(s))) for a, s in zip(self.actors, slices, strict=True)
        ]
        return RayPending(refs, combine_updates)

    def get_weights_ref(self) -> ray.ObjectRef:
        """Rank 0's packed weights (``PackedWeights``), left in the object store (all ranks gather under ZeRO-3)."""
        if self.cfg.zero_stage == 3:
            return [a.get_weights.remote() for a in self.actors][0]
        return self.rank0.get_weights.remote()

    def start_push_weights(
        self, *, version: int, members: Mapping[str, Any], timeout_s: float | None = None
    ) -> RayPending[dict[str, Any]]:
        """Rank 0 sends the weights to ``members`` through vLLM's weight-transfer API (every rank takes part
        under ZeRO-3); the value is rank 0's report (``send_s``, each sampler's ``apply_s``)."""
        refs = [self.rank0.push_weights.remote(version=version, members=dict(members), timeout_s=timeout_s)]
        if self.cfg.zero_stage == 3:
            refs += [
                a.push_weights.remote(version=version, members=None, timeout_s=timeout_s)
                for a in self.actors[1:]
            ]
        return RayPending(refs, lambda reports: reports[0])

    def num_parameters(self) -> int:
        return int(ray.get(self.rank0.num_parameters.remote()))

    def version(self) -> int:
        """Rank 0's policy version: the tag of weights exported now (the last update's version + 1)."""
        return int(ray.get(self.rank0.version.remote()))

    def checksums(self) -> list[float]:
        """Each rank's float64 parameter sum (equal across ranks after every step)."""
        return gather([a.checksum.remote() for a in self.actors])

    def save(self, *, path: str) -> None:
        """Checkpoint on all ranks (HF safetensors from rank 0, DeepSpeed state from every rank)."""
        gather([a.save.remote(path=path) for a in self.actors])

    def load(self, *, path: str) -> None:
        gather([a.load.remote(path=path) for a in self.actors])

    def shutdown(self) -> None:
        """Kill the learner actors and release the placement group."""
        for a in self.actors:
            ray.kill(a)
        self.actors = []
        if self._pg is not None:
            remove_placement_group(self._pg)
