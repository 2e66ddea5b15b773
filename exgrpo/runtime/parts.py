"""Builder parts: each starts one role of a run from the config and returns it typed by the Protocols of
`exgrpo/core/roles.py` (plus what a run's owner needs beyond them: `shutdown`, the replay's shard handles),
and mypy checks that it still does: `make_replay` (`ShardedReplay`), `make_learners` (`LearnerGroup`),
`make_samplers` over a `SamplerSpawner` (`SamplerPool`), `make_transport`, `make_controller`.
`exgrpo.runtime.assembly.build_system` composes them after `exgrpo.runtime.preflight.check_start`, and
`bench/sim/cluster.py` around its sleeping roles. Actor names: `exgrpo/core/names.py`. More:
docs/architecture.md ("Roles").
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from exgrpo.core.config import Config
from exgrpo.core.names import CONTROLLER, replay_name, sampler_name
from exgrpo.core.positions import context_len
from exgrpo.core.roles import Learners, Replay, Rollouts, WeightTransport
from exgrpo.loop.weight_checks import checksum_on
from exgrpo.runtime.controller import Controller, ControllerClient
from exgrpo.runtime.env import remote_actor
from exgrpo.runtime.longest_call import collective_timeout_s
from exgrpo.runtime.resources import sampler_bundles

if TYPE_CHECKING:
    from actors.pool import SamplerPool
    from buffers.sharded import ShardedReplay
    from learners.group import LearnerGroup


class ShardedReplayRole(Replay, Protocol):
    """`Replay` over shard actors (the owner kills them at the end)."""

    shards: list[Any]


class SamplerPoolRole(Rollouts, Protocol):
    """`Rollouts` that the owner stops at the end."""

    def shutdown(self) -> None: ...


class LearnerGroupRole(Learners, Protocol):
    """`Learners` that the owner stops at the end."""

    def shutdown(self) -> None: ...


def make_replay(
    cfg: Config, *, run_dir: str | Path | None = None, shard_cls: type | None = None, wait: bool = True
) -> ShardedReplay:
    """`replay.num_shards` shard actors named `exgrpo-replay-<i>` (num_cpus=0, `replay.shard_concurrency`
    calls at once) and their client. With `run_dir` and `replay.wal`, each logs to
    `<run_dir>/replay-wal/shard-<i>` (emptied first: new shards start empty, a resume restores them from its
    checkpoint) and Ray restarts a dead one up to `replay.shard_max_restarts` times, its client retrying
    for 120 s. `shard_cls`: a `ReplayShard` subclass in its place (a benchmark's instrumented shard).
    `wait=False` returns before the shards have started (`replay_ready` waits)."""

    from buffers.shard import ReplayShard
    from buffers.sharded import RayInvoke, ShardedReplay

    K, r = cfg.trainer.rollouts_per_question, cfg.replay
    wal = Path(run_dir) / "replay-wal" if run_dir is not None and r.wal else None
    if wal is not None:
        shutil.rmtree(wal, ignore_errors=True)
    restarts = r.shard_max_restarts if wal is not None else 0
    shards = [
        remote_actor(
            shard_cls or ReplayShard,
            name=replay_name(i),
            num_cpus=0,
            max_restarts=restarts,
            max_concurrency=r.shard_concurrency,
            k_rollouts=K,
            max_trajectories_per_question=r.max_trajectories_per_question,
            wal_dir=str(wal / f"shard-{i}") if wal is not None else None,
            compact_bytes=int(r.wal_compact_mb * 2**20),
            retire=r.retires,
        )
        for i in range(r.num_shards)
    ]
    replay = ShardedReplay(
        shards=shards,
        k_rollouts=K,
        mu=r.mu,
        sigma=r.sigma,
        uniform=r.question_selection == "uniform",
        invoke=RayInvoke(retry_s=120.0 if restarts else 0.0),
    )
    if wait:
        replay_ready(replay)
    return replay


def replay_ready(replay: ShardedReplay) -> None:
    """Wait until every shard has started (a shard that failed to start raises here)."""
    import ray

    ray.get([h.ping.remote() for h in replay.shards])


def make_learners(cfg: Config, *, model_path: str, wait: bool = True) -> LearnerGroup:
    """`learners.num` DeepSpeed ranks named `exgrpo-learner-<i>` in one placement group; `wait=False`
    returns while they set up (`LearnerGroup.ready` waits)."""
    from learners.group import LearnerGroup

    return LearnerGroup(
        num=cfg.learners.num,
        make_actor=remote_actor,
        model_path=model_path,
        learner_cfg=replace(cfg.learners, collective_timeout_s=collective_timeout_s(cfg)),
        loss_cfg=cfg.loss,
        max_response_len=cfg.model.max_response_len,
        seed=cfg.trainer.seed,
        dtype=cfg.model.dtype,
        wait=wait,
    )


def transfer_backend(cfg: Config) -> str | None:
    """vLLM's weight-transfer backend of the samplers: NCCL on GPUs, gloo on CPU; None without the collective."""
    if cfg.async_.weight_sync != "collective":
        return None
    from exgrpo.transport.vllm_api import backend_for

    return backend_for("cuda" if cfg.samplers.num_gpus > 0 else "cpu")


def engine_process(cfg: Config) -> str:
    """Where a vLLM sampler's engine core runs (`samplers.engine_process`): auto = its own process on GPUs
    (vLLM's default there), in the sampler's process on CPU."""
    chosen = cfg.samplers.engine_process
    if chosen == "auto":
        return "child" if cfg.samplers.num_gpus > 0 else "inline"
    return chosen


def seeded(cfg: Config) -> bool:
    """Whether samplers seed each request (`samplers.seeded`; null = on CPU samplers only: GPU numerics are
    not bitwise reproducible anyway, and a seeded request takes vLLM's slower per-sequence sampling path)."""
    chosen = cfg.samplers.seeded
    return cfg.samplers.num_gpus == 0 if chosen is None else chosen


def place_sampler(
    cls: type,
    *,
    name: str,
    num_cpus: float,
    num_gpus: float,
    tensor_parallel_size: int = 1,
    **init_kwargs: Any,
) -> tuple[Any, Any]:
    """Start a sampler actor; returns (handle, its placement group or None).

    One GPU per sampler (tensor_parallel_size 1): a plain actor reserving (num_cpus, num_gpus), as always.
    Tensor-parallel (tp > 1): a STRICT_PACK placement group of `sampler_bundles` (tp bundles of
    {GPU: num_gpus}, the first also holding the actor's CPUs); the actor takes bundle 0's CPUs and no GPU
    and captures child tasks, so vLLM's Ray executor finds the group and puts one worker on each GPU
    bundle. The caller removes the group when the sampler goes (`SamplerPool(on_removed=...)`)."""
    if tensor_parallel_size == 1:
        handle = remote_actor(cls, name=name, num_cpus=num_cpus, num_gpus=num_gpus, **init_kwargs)
        return handle, None
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = ray.util.placement_group(
        sampler_bundles(num_cpus=num_cpus, num_gpus=num_gpus, tensor_parallel_size=tensor_parallel_size),
        strategy="STRICT_PACK",  # one node: tensor-parallel ranks talk over NVLink/PCIe
        name=f"{name}-tp",
    )
    strategy = PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
    )
    handle = remote_actor(
        cls, name=name, num_cpus=num_cpus, num_gpus=0, scheduling_strategy=strategy, **init_kwargs
    )
    return handle, group


class SamplerSpawner:
    """`SamplerPool(spawn=...)`: index -> a `Sampler` (or `ContinuousSampler`) actor named
    `exgrpo-sampler-<index>` over one engine of `model_path` (`spec`) with the config's `settings`, pushing
    to `replay`; `release(handle)` (`SamplerPool(on_removed=...)`) removes a tensor-parallel sampler's
    placement group."""

    def __init__(self, cfg: Config, *, model_path: str, replay: Any) -> None:
        from actors.sampler_common import EngineSpec, SamplerSettings

        s = cfg.samplers
        self.cfg, self.replay = cfg, replay
        self.spec = EngineSpec(
            kind=s.engine,
            model_path=model_path,
            dtype=cfg.model.dtype,
            gpu_memory_utilization=s.gpu_memory_utilization,
            weight_transfer=transfer_backend(cfg),
            max_model_len=context_len(cfg.model),
            tensor_parallel_size=s.tensor_parallel_size,
            enforce_eager=s.enforce_eager,
            gpus_per_worker=s.num_gpus,
            engine_process=engine_process(cfg),
        )
        self.settings = SamplerSettings(
            template=cfg.model.template,
            max_response_len=cfg.model.max_response_len,
            temperature=s.temperature,
            top_p=s.top_p,
            verify_timeout_s=s.verify_timeout_s,
            reward_fn=cfg.reward.fn,
            seed=cfg.trainer.seed,
            rollouts_per_question=cfg.trainer.rollouts_per_question,
            seeded=seeded(cfg),
            weight_sums=checksum_on(cfg),
        )
        self.groups: dict[int, Any] = {}  # id(sampler handle) -> its placement group (tensor-parallel)

    def __call__(self, index: int) -> Any:
        from actors.continuous_sampler import ContinuousSampler
        from actors.sampler import Sampler

        s = self.cfg.samplers
        # a continuous sampler is an asyncio actor serving up to continuous_max_requests generate calls at
        # once, plus its weight loads, evaluations and pings
        extra: dict[str, Any] = (
            {"max_concurrency": s.continuous_max_requests + 8}
            if s.continuous
            else {"verify_workers": max(1, int(s.num_cpus))}  # a verifier process per CPU the actor holds
        )
        handle, group = place_sampler(
            ContinuousSampler if s.continuous else Sampler,
            name=sampler_name(index),
            num_cpus=s.num_cpus,
            num_gpus=s.num_gpus,
            tensor_parallel_size=s.tensor_parallel_size,
            index=index,
            engine=self.spec,
            settings=self.settings,
            replay=self.replay,
            **extra,
        )
        if group is not None:
            self.groups[id(handle)] = group
        return handle

    def release(self, handle: Any) -> None:
        group = self.groups.pop(id(handle), None)
        if group is not None:
            import ray

            ray.util.remove_placement_group(group)


def make_samplers(
    cfg: Config, *, spawn: Callable[[int], Any], on_removed: Callable[[Any], None] | None = None
) -> SamplerPool:
    """The `SamplerPool` of `samplers.num` samplers from `spawn(index)` (a `SamplerSpawner`, or a
    simulated sampler's), with the in-flight limit that keeps every admitted request on its way."""
    from actors.pool import SamplerPool
    from exgrpo.runtime.elastic import pool_hooks

    s = cfg.samplers
    fewest = min(s.num, s.autoscale_min) if s.autoscale else s.num  # the in-flight limit holds for the fewest
    # every admitted request can be on its way at once: the pool dispatches only inside submit/poll, so a
    # sampler limited to fewer chunks than it is given per step runs dry while the driver waits in
    # update/broadcast (measured in the simulated cluster: 16 samplers, eta 1, 1.73x the ideal step)
    in_flight = math.ceil(
        (cfg.async_.max_staleness + 1) * cfg.trainer.questions_per_step / (fewest * s.requests_per_call)
    )
    # a continuous sampler takes one request per call, each reported as soon as it is done, and up to
    # continuous_max_requests of them at once (it batches them itself)
    return SamplerPool(
        spawn=spawn,
        num=s.num,
        requests_per_call=1 if s.continuous else s.requests_per_call,
        max_in_flight_per_sampler=s.continuous_max_requests if s.continuous else max(2, in_flight),
        on_removed=on_removed,
        elastic=pool_hooks(cfg),
    )


def make_transport(cfg: Config, *, learners: Any, samplers: SamplerPool) -> WeightTransport:
    """The transport `async.weight_sync` names, from the learners' weights to the pool's samplers; a
    sampler the pool adds later catches up through it (`SamplerPool.on_new`)."""
    from exgrpo.transport import broadcast

    weights = broadcast.make_transport(
        cfg.async_.weight_sync,
        learners=learners,
        samplers=samplers,
        timeout_s=cfg.async_.weight_timeout_s,
        max_failures=cfg.async_.max_weight_failures,
        on_failure=cfg.async_.on_collective_failure,
    )
    samplers.on_new = weights.catch_up
    return weights


def make_controller(cfg: Config) -> ControllerClient:
    """The scaling controller actor `exgrpo-controller`, holding `samplers.num`, and its client (which
    starts a new one holding the last count read if it dies)."""
    s = cfg.samplers

    def start(n: int, auto: bool | None = None) -> Any:
        return remote_actor(
            Controller,
            name=CONTROLLER,
            num_cpus=0,
            samplers=n,
            sampler_cpus=s.num_cpus,
            sampler_gpus=s.num_gpus * s.tensor_parallel_size,
            autoscale=s.autoscale,
            auto=auto,
        )

    return ControllerClient(start(s.num), start=start, samplers=s.num, auto=s.autoscale)
