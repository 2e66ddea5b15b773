"""System assembly: the replay shards, learner group, sampler pool, weight transport and scaling controller of
one run, started as named Ray actors and wired together (`build_system`).

`make_sampler` and `make_learners` replace the real roles (the simulated cluster, `exgrpo/sim/`, uses them);
everything else is the production wiring that the CLI, the sweep, the integration tests and the benchmarks share.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from exgrpo.core.config import Config, ConfigError
from exgrpo.core.names import CONTROLLER, replay_name, sampler_name
from exgrpo.core.positions import check_context, context_len, positioned_model
from exgrpo.runtime.controller import Controller, ControllerClient
from exgrpo.runtime.env import remote_actor
from exgrpo.runtime.memory_plan import dry_run_report
from exgrpo.runtime.resources import check_cluster, sampler_bundles


@dataclass
class System:
    """The live roles of one run (Ray-backed implementations of `exgrpo.core.roles`)."""

    replay: Any  # buffers.sharded.ShardedReplay
    samplers: Any  # actors.pool.SamplerPool
    learners: Any  # learners.group.LearnerGroup
    weights: Any  # exgrpo.transport.broadcast transport
    scaling: ControllerClient  # over the Controller actor (`controller`: its current handle)

    @property
    def controller(self) -> Any:
        return self.scaling.handle

    def shutdown(self) -> None:
        self.samplers.shutdown()
        self.learners.shutdown()
        for s in self.replay.shards:
            ray.kill(s)
        ray.kill(self.controller)


def transfer_backend(cfg: Config) -> str | None:
    """vLLM's weight-transfer backend of the samplers: NCCL on GPUs, gloo on CPU; None without the collective."""
    if cfg.async_.weight_sync != "collective":
        return None
    from exgrpo.transport.vllm_api import backend_for

    return backend_for("cuda" if cfg.samplers.num_gpus > 0 else "cpu")


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


def build_system(
    cfg: Config,
    *,
    model_path: str,
    run_dir: str | Path | None = None,
    make_sampler: Callable[[int, Any], Any] | None = None,
    make_learners: Callable[[Config], Any] | None = None,
) -> System:
    """Start replay shards, learners, samplers and the scaling controller as named actors.

    With `run_dir` (and `replay.wal`), the shards log to `<run_dir>/replay-wal/` and Ray restarts a dead one.
    `make_sampler(index, replay)` (an actor handle with the `Sampler` surface) and `make_learners(cfg)` (a
    `Learners` + weight source like `LearnerGroup`) replace the real roles; `exgrpo/sim/roles.py` uses them."""
    import shutil

    from actors.continuous_sampler import ContinuousSampler
    from actors.pool import SamplerPool
    from actors.sampler import EngineSpec, Sampler
    from buffers.shard import ReplayShard
    from buffers.sharded import RayInvoke, ShardedReplay
    from exgrpo.transport.broadcast import make_transport
    from learners.group import LearnerGroup

    check_context(cfg.model, model_path)  # prompt + response must fit the model's positions (or the override)
    # the position override lives in the config.json of the directory both learners and samplers load
    model_path = positioned_model(
        cfg.model,
        model_path,
        out_root=Path(run_dir) if run_dir is not None else Path(cfg.model.cache_dir) / "models",
    )
    check_cluster(cfg, model_path=model_path)  # fail now, not in a placement group that waits forever
    memory, fits = dry_run_report(cfg, model_path=str(model_path))  # GPU runs: the memory plan must fit
    if not fits:
        raise ConfigError(f"the memory plan does not fit:\n{memory}")
    K, r, s = cfg.trainer.rollouts_per_question, cfg.replay, cfg.samplers
    wal = Path(run_dir) / "replay-wal" if run_dir is not None and r.wal else None
    if wal is not None:  # new shards start empty (a resume restores them from its checkpoint)
        shutil.rmtree(wal, ignore_errors=True)
    restarts = r.shard_max_restarts if wal is not None else 0
    shards = [
        remote_actor(
            ReplayShard,
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
    ray.get([h.ping.remote() for h in shards])
    replay = ShardedReplay(
        shards=shards,
        k_rollouts=K,
        mu=r.mu,
        sigma=r.sigma,
        uniform=r.question_selection == "uniform",
        invoke=RayInvoke(retry_s=120.0 if restarts else 0.0),
    )
    learners = (
        make_learners(cfg)
        if make_learners is not None
        else LearnerGroup(
            num=cfg.learners.num,
            make_actor=remote_actor,
            model_path=model_path,
            learner_cfg=cfg.learners,
            loss_cfg=cfg.loss,
            max_response_len=cfg.model.max_response_len,
            seed=cfg.trainer.seed,
            dtype=cfg.model.dtype,
        )
    )
    spec = EngineSpec(
        kind=s.engine,
        model_path=model_path,
        dtype=cfg.model.dtype,
        gpu_memory_utilization=s.gpu_memory_utilization,
        weight_transfer=transfer_backend(cfg),
        max_model_len=context_len(cfg.model),
        tensor_parallel_size=s.tensor_parallel_size,
        enforce_eager=s.enforce_eager,
        gpus_per_worker=s.num_gpus,
    )
    groups: dict[int, Any] = {}  # id(sampler handle) -> its placement group (tensor-parallel samplers)

    def spawn(index: int) -> Any:
        if make_sampler is not None:
            return make_sampler(index, replay)
        # a continuous sampler is an asyncio actor serving up to continuous_max_requests generate calls at
        # once, plus its weight loads, evaluations and pings
        extra = {"max_concurrency": s.continuous_max_requests + 8} if s.continuous else {}
        handle, group = place_sampler(
            ContinuousSampler if s.continuous else Sampler,
            name=sampler_name(index),
            num_cpus=s.num_cpus,
            num_gpus=s.num_gpus,
            tensor_parallel_size=s.tensor_parallel_size,
            index=index,
            engine=spec,
            template=cfg.model.template,
            max_response_len=cfg.model.max_response_len,
            temperature=s.temperature,
            top_p=s.top_p,
            verify_timeout_s=s.verify_timeout_s,
            reward_fn=cfg.reward.fn,
            replay=replay,
            seed=cfg.trainer.seed,
            rollouts_per_question=K,
            **extra,
        )
        if group is not None:
            groups[id(handle)] = group
        return handle

    def release(handle: Any) -> None:
        group = groups.pop(id(handle), None)
        if group is not None:
            ray.util.remove_placement_group(group)

    # every admitted request can be on its way at once: the pool dispatches only inside submit/poll, so a
    # sampler limited to fewer chunks than it is given per step runs dry while the driver waits in
    # update/broadcast (measured in the simulated cluster: 16 samplers, eta 1, 1.73x the ideal step)
    in_flight = math.ceil(
        (cfg.async_.max_staleness + 1) * cfg.trainer.questions_per_step / (s.num * s.requests_per_call)
    )
    # a continuous sampler takes one request per call, each reported as soon as it is done, and up to
    # continuous_max_requests of them at once (it batches them itself)
    samplers = SamplerPool(
        spawn=spawn,
        num=s.num,
        requests_per_call=1 if s.continuous else s.requests_per_call,
        max_in_flight_per_sampler=s.continuous_max_requests if s.continuous else max(2, in_flight),
        on_removed=release,
    )
    weights = make_transport(
        cfg.async_.weight_sync,
        learners=learners,
        samplers=samplers,
        timeout_s=cfg.async_.weight_timeout_s,
    )
    samplers.on_new = weights.catch_up

    def start_controller(n: int) -> Any:
        return remote_actor(
            Controller,
            name=CONTROLLER,
            num_cpus=0,
            samplers=n,
            sampler_cpus=s.num_cpus,
            sampler_gpus=s.num_gpus * s.tensor_parallel_size,
        )

    return System(
        replay=replay,
        samplers=samplers,
        learners=learners,
        weights=weights,
        scaling=ControllerClient(start_controller(s.num), start=start_controller, samplers=s.num),
    )
