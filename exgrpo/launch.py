"""The one wiring module, and the one place that applies ``ray.remote`` to the plain role classes.

`train(cfg, resume=...)` is what every caller runs: the CLI (`exgrpo.run`), the sweep
(`exgrpo.experiments.compare`), the integration tests and the benchmarks:

    config -> model dir -> prompts -> Ray -> actors (build_system) -> Driver -> checkpoints -> report

Actors are named (`exgrpo-replay-<i>`, `exgrpo-sampler-<i>`, `exgrpo-learner-<i>`,
`exgrpo-controller`) in namespace `exgrpo`, so the Ray dashboard reads naturally.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from exgrpo.config import Config

log = logging.getLogger("exgrpo")

# Environment every actor starts with (DESIGN.md 7: one torch thread per process; vLLM CPU settings).
ACTOR_ENV = {
    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
    "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(Path("~/.cache/exgrpo/torch_extensions").expanduser())),
}


def remote_actor(cls: type, *, name: str, num_cpus: float, num_gpus: float = 0, scheduling_strategy: Any = None,
                 max_restarts: int = 0, max_concurrency: int = 1, **init_kwargs: Any) -> ray.actor.ActorHandle:
    """Start ``cls(**init_kwargs)`` as a named Ray actor and return its handle.

    ``name`` is the actor's name in the Ray dashboard; ``scheduling_strategy`` places it (e.g. a
    ``PlacementGroupSchedulingStrategy`` bundle); ``max_concurrency`` > 1 lets it serve calls from several threads.
    """
    options: dict[str, Any] = {"name": name, "num_cpus": num_cpus, "num_gpus": num_gpus,
                               "max_restarts": max_restarts, "max_concurrency": max_concurrency}
    if scheduling_strategy is not None:
        options["scheduling_strategy"] = scheduling_strategy
    return ray.remote(cls).options(**options).remote(**init_kwargs)


def init_ray(cfg: Config) -> None:
    """Attach to RAY_ADDRESS if set (as under `ray job submit`), else start a private local cluster."""
    if ray.is_initialized():
        return
    runtime_env = {"env_vars": ACTOR_ENV}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env=runtime_env, namespace="exgrpo")
        return
    s, lr = cfg.samplers, cfg.learners
    needed = s.num * s.num_cpus + lr.num * lr.num_cpus
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster (see README on token auth)
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(needed + 0.999)), runtime_env=runtime_env,
             namespace="exgrpo", include_dashboard=False, configure_logging=False, log_to_driver=True)


def placement_plan(cfg: Config) -> str:
    """Which actors start, with which resources (`python -m exgrpo.run --dry-run`)."""
    s, lr, r = cfg.samplers, cfg.learners, cfg.replay
    rows = [(f"exgrpo-learner-{i}", lr.num_cpus, lr.num_gpus, "placement group 'learners' (PACK)") for i in range(lr.num)]
    rows += [(f"exgrpo-sampler-{i}", s.num_cpus, s.num_gpus, f"engine={s.engine}") for i in range(s.num)]
    rows += [(f"exgrpo-replay-{i}", 0, 0, "replay shard") for i in range(r.num_shards)]
    rows += [("exgrpo-controller", 0, 0, "scaling controller")]
    width = max(len(n) for n, *_ in rows)
    lines = [f"{'actor':<{width}}  {'CPUs':>5}  {'GPUs':>5}  notes"]
    lines += [f"{n:<{width}}  {c:>5g}  {g:>5g}  {note}" for n, c, g, note in rows]
    lines.append(f"total: {sum(c for _, c, _, _ in rows):g} CPUs, {sum(g for _, _, g, _ in rows):g} GPUs; learner ZeRO "
                 f"stage {lr.zero_stage}, weight sync {cfg.async_.weight_sync}, max staleness {cfg.async_.max_staleness}")
    return "\n".join(lines)


class Controller:
    """The named actor `exgrpo-controller` through which operators steer a running job."""

    def __init__(self, *, samplers: int) -> None:
        self._samplers = samplers

    def ping(self) -> str:
        return "pong"

    def set_samplers(self, *, n: int) -> int:
        if n < 1:
            raise ValueError(f"samplers must be >= 1, got {n}")
        self._samplers = n
        return n

    def desired_samplers(self) -> int:
        return self._samplers


class ControllerClient:
    """`exgrpo.core.Scaling` over the controller actor without blocking: one query is always in
    flight; `desired_samplers()` returns its answer once it has arrived (and asks again), else None."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._ref = handle.desired_samplers.remote()

    def desired_samplers(self) -> int | None:
        ready, _ = ray.wait([self._ref], timeout=0)
        if not ready:
            return None
        value = ray.get(self._ref)
        self._ref = self.handle.desired_samplers.remote()
        return int(value)


@dataclass
class System:
    """The live roles of one run (Ray-backed implementations of `exgrpo.core`)."""

    replay: Any  # buffers.sharded.ShardedReplay
    samplers: Any  # actors.pool.SamplerPool
    learners: Any  # learners.group.LearnerGroup
    weights: Any  # learners.weight_sync transport
    controller: Any  # Controller actor handle
    scaling: ControllerClient

    def shutdown(self) -> None:
        self.samplers.shutdown()
        self.learners.shutdown()
        for s in self.replay.shards:
            ray.kill(s)
        ray.kill(self.controller)


def build_system(cfg: Config, *, model_path: str) -> System:
    """Start replay shards, learners, samplers and the scaling controller as named actors."""
    from actors.pool import SamplerPool
    from actors.sampler import EngineSpec, Sampler
    from buffers.shard import ReplayShard
    from buffers.sharded import ShardedReplay
    from learners.group import LearnerGroup
    from learners.weight_sync import make_transport

    K, r, s = cfg.trainer.rollouts_per_question, cfg.replay, cfg.samplers
    shards = [remote_actor(ReplayShard, name=f"exgrpo-replay-{i}", num_cpus=0, k_rollouts=K,
                           max_trajectories_per_question=r.max_trajectories_per_question) for i in range(r.num_shards)]
    ray.get([h.ping.remote() for h in shards])
    replay = ShardedReplay(shards=shards, k_rollouts=K, mu=r.mu, sigma=r.sigma,
                           uniform=r.question_selection == "uniform")
    learners = LearnerGroup(num=cfg.learners.num, make_actor=remote_actor, model_path=model_path,
                            learner_cfg=cfg.learners, loss_cfg=cfg.loss, max_response_len=cfg.model.max_response_len,
                            seed=cfg.trainer.seed, dtype=cfg.model.dtype)
    spec = EngineSpec(kind=s.engine, model_path=model_path, dtype=cfg.model.dtype,
                      gpu_memory_utilization=s.gpu_memory_utilization)

    def spawn(index: int) -> Any:
        return remote_actor(Sampler, name=f"exgrpo-sampler-{index}", num_cpus=s.num_cpus, num_gpus=s.num_gpus,
                            index=index, engine=spec, template=cfg.model.template,
                            max_response_len=cfg.model.max_response_len, temperature=s.temperature, top_p=s.top_p,
                            verify_timeout_s=s.verify_timeout_s, replay=replay, seed=cfg.trainer.seed)

    samplers = SamplerPool(spawn=spawn, num=s.num, requests_per_call=s.requests_per_call)
    weights = make_transport(cfg.async_.weight_sync, learners=learners, samplers=samplers)
    samplers.on_new = weights.catch_up
    controller = remote_actor(Controller, name="exgrpo-controller", num_cpus=0, samplers=s.num)
    return System(replay=replay, samplers=samplers, learners=learners, weights=weights, controller=controller,
                  scaling=ControllerClient(controller))


@dataclass
class RunResult:
    run_dir: Path
    records: list[dict[str, Any]]
    evals: list[dict[str, float]]
    wall_s: float
    checkpoint_s: list[float] = field(default_factory=list)  # seconds of every checkpoint write
    inspected: Any = None  # what `inspect(system, driver)` returned


def make_run_dir(cfg: Config) -> Path:
    run_dir = Path(cfg.logging.run_dir or f"runs/{dt.datetime.now():%Y%m%d-%H%M%S}").expanduser()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    return run_dir


def train(cfg: Config, *, resume: bool = False, checkpoints: bool = True,
          on_batch: Callable[[Any], None] | None = None,
          during: Callable[[dict[str, Any], System], None] | None = None,
          inspect: Callable[[System, Any], Any] | None = None, stall_timeout_s: float = 900.0) -> RunResult:
    """Run one training job end to end (or continue it from its latest checkpoint with `resume`).

    `on_batch(batch)` sees every TrainBatch, `during(record, system)` runs after every step, and
    `inspect(system, driver)` runs after the last step, before the actors stop (tests use these).
    """
    from exgrpo.checkpoint import Checkpointer, copy_tokenizer, latest_checkpoint, restore_checkpoint
    from exgrpo.data.sources import load_prompts
    from exgrpo.driver import Driver
    from exgrpo.metrics import MetricsLogger, read_jsonl
    from exgrpo.models.resolve import resolve_model
    from exgrpo.report import Progress, write_report

    t_start = time.perf_counter()
    run_dir = make_run_dir(cfg)
    ckpt = latest_checkpoint(run_dir) if resume else None
    if resume and ckpt is None:
        raise FileNotFoundError(f"no complete checkpoint under {run_dir}/checkpoints to resume from")
    model_path = str(ckpt / "model") if ckpt else str(resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir))
    train_set, eval_set = load_prompts(cfg)
    log.info("run dir %s; model %s; %d train / %d eval questions", run_dir, model_path, len(train_set), len(eval_set))
    init_ray(cfg)
    system = build_system(cfg, model_path=model_path)
    logger = MetricsLogger(run_dir, ray_metrics=cfg.logging.ray_metrics)
    progress = Progress(total=cfg.trainer.steps, enabled=cfg.logging.progress)
    checkpointer = Checkpointer(run_dir, model_path=model_path, keep=cfg.trainer.keep_checkpoints) if checkpoints else None

    def after_step(record: dict[str, Any]) -> None:
        progress.update(record)
        if during is not None:
            during(record, system)

    driver = Driver(cfg=cfg, rollouts=system.samplers, replay=system.replay, learners=system.learners,
                    weights=system.weights, train=train_set, evaluation=eval_set, scaling=system.scaling,
                    logger=logger, progress=after_step, checkpointer=checkpointer, on_batch=on_batch,
                    stall_timeout_s=stall_timeout_s)
    inspected = None
    try:
        if ckpt is not None:
            t0 = time.perf_counter()
            restore_checkpoint(ckpt, driver=driver)
            progress.skip(driver.step)
            log.info("resumed from %s at step %d (policy version %d); restore took %.2f s", ckpt, driver.step,
                     driver.version, time.perf_counter() - t0)
        records = driver.train()
        system.learners.save(path=str(run_dir / "final"))
        copy_tokenizer(model_path, run_dir / "final")
        if inspect is not None:
            inspected = inspect(system, driver)
    finally:
        progress.close()
        logger.close()
        system.shutdown()
    wall = time.perf_counter() - t_start
    write_report(run_dir, records=read_jsonl(logger.path), evals=driver.eval_history, wall_s=wall,
                 plots=cfg.logging.plots)
    return RunResult(run_dir=run_dir, records=records, evals=list(driver.eval_history), wall_s=wall,
                     checkpoint_s=list(checkpointer.seconds) if checkpointer else [], inspected=inspected)
