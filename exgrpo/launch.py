"""The one wiring module, and the one place that applies ``ray.remote`` to the plain role classes.

`train(cfg, resume=...)` is what every caller runs: the CLI (`exgrpo.run`), the sweep
(`exgrpo.experiments.compare`), the integration tests and the benchmarks:

    config -> model dir -> prompts -> Ray -> actors (build_system) -> Driver -> checkpoints -> report

Actors are named (`exgrpo-replay-<i>`, `exgrpo-sampler-<i>`, `exgrpo-learner-<i>`,
`exgrpo-controller`) in namespace `exgrpo`, so the Ray dashboard reads naturally.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from exgrpo.config import Config
from exgrpo.loggers import CandidateLog
from exgrpo.resources import check_cluster
from exgrpo.scale import Controller, ControllerClient

log = logging.getLogger("exgrpo")

# Environment every actor starts with (DESIGN.md 7: one torch thread per process; vLLM CPU settings).
ACTOR_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TORCH_EXTENSIONS_DIR": os.environ.get(
        "TORCH_EXTENSIONS_DIR", str(Path("~/.cache/exgrpo/torch_extensions").expanduser())
    ),
}
# Quiet actors by default (`--verbose` / logging.verbose drops these): no per-actor "Loading weights" /
# "Writing model shards" bars (transformers and the HF hub honour HF_HUB_DISABLE_PROGRESS_BARS, tqdm
# TQDM_DISABLE), transformers' warnings off, Python warnings once per process, W&B silent. Ray's log
# deduplication (on by default) folds the same line from several actors into one.
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "PYTHONWARNINGS": "once",
    "WANDB_SILENT": "true",
    "EXGRPO_QUIET": "1",  # for role code that prints on its own (e.g. around deepspeed.initialize)
}
ACTOR_ENV.update(QUIET_ENV)


def remote_actor(
    cls: type,
    *,
    name: str,
    num_cpus: float,
    num_gpus: float = 0,
    scheduling_strategy: Any = None,
    max_restarts: int = 0,
    max_concurrency: int = 1,
    **init_kwargs: Any,
) -> ray.actor.ActorHandle:
    """Start ``cls(**init_kwargs)`` as a named Ray actor and return its handle.

    ``name`` is the actor's name in the Ray dashboard; ``scheduling_strategy`` places it (e.g. a
    ``PlacementGroupSchedulingStrategy`` bundle); ``max_concurrency`` > 1 lets it serve calls from several threads.
    """
    options: dict[str, Any] = {
        "name": name,
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "max_restarts": max_restarts,
        "max_concurrency": max_concurrency,
    }
    if scheduling_strategy is not None:
        options["scheduling_strategy"] = scheduling_strategy
    return ray.remote(cls).options(**options).remote(**init_kwargs)


def init_ray(cfg: Config) -> dict[str, Any]:
    """Attach to RAY_ADDRESS if set (as under `ray job submit`), else start a private local cluster.

    `logging.dashboard` starts the local cluster's dashboard on `logging.dashboard_host` (127.0.0.1)
    and prints its URL; `logging.verbose` lets the actors' progress bars and warnings through.
    Returns {"dashboard_url", "metrics_port"} (None where unknown) and prints both lines when the
    dashboard is on.
    """
    lc = cfg.logging
    env = dict(ACTOR_ENV)
    if lc.verbose:
        for key in QUIET_ENV:
            env.pop(key, None)
    if cfg.learners.num_gpus == 0 and cfg.samplers.num_gpus == 0:
        env.setdefault("DS_ACCELERATOR", "cpu")  # no GPU asked for: skips DeepSpeed's detection and its warning
    runtime_env = {"env_vars": env}
    if ray.is_initialized():
        ctx = None
    elif os.environ.get("RAY_ADDRESS"):
        # a job submitted with its own runtime env: Ray refuses env_vars keys set twice; the job's values win
        job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
        for key in (job.get("runtime_env") or {}).get("env_vars") or {}:
            env.pop(key, None)
        ctx = ray.init(runtime_env=runtime_env, namespace="exgrpo")
    else:
        s, lr = cfg.samplers, cfg.learners
        needed = s.num * s.num_cpus + lr.num * lr.num_cpus
        os.environ.setdefault(
            "RAY_AUTH_MODE", "disabled"
        )  # a private local cluster (see README on token auth)
        dashboard = (
            {
                "include_dashboard": True,
                "dashboard_host": lc.dashboard_host,
                "dashboard_port": lc.dashboard_port,
            }
            if lc.dashboard
            else {"include_dashboard": False}
        )
        ctx = ray.init(
            address="local",
            num_cpus=max(os.cpu_count() or 1, int(needed + 0.999)),
            runtime_env=runtime_env,
            namespace="exgrpo",
            configure_logging=False,
            log_to_driver=True,
            **dashboard,
        )
    url = getattr(ctx, "dashboard_url", None) or None
    node = getattr(ray._private.worker.global_worker, "node", None)  # None when attached as a client
    port = getattr(node, "metrics_export_port", None)
    info = {
        "dashboard_url": f"http://{url}" if url and not url.startswith("http") else url,
        "metrics_port": port,
    }
    if lc.dashboard and ctx is not None:
        where = info["dashboard_url"] or "(none: this cluster runs no dashboard)"
        print(
            f"[exgrpo] Ray dashboard: {where}  (Jobs, Actors; charts need Prometheus + Grafana: "
            f"docs/operating.md)",
            file=sys.stderr,
            flush=True,
        )
        if port:
            print(
                f"[exgrpo] Prometheus target: 127.0.0.1:{port}/metrics (exgrpo_ series as ray_exgrpo_*)",
                file=sys.stderr,
                flush=True,
            )
    return info


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


def transfer_backend(cfg: Config) -> str | None:
    """vLLM's weight-transfer backend of the samplers: NCCL on GPUs, gloo on CPU; None without the collective."""
    if cfg.async_.weight_sync != "collective":
        return None
    from learners.vllm_transfer import backend_for

    return backend_for("cuda" if cfg.samplers.num_gpus > 0 else "cpu")


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
    `Learners` + weight source like `LearnerGroup`) replace the real roles; `exgrpo/simulated.py` uses them."""
    import shutil

    from actors.pool import SamplerPool
    from actors.sampler import EngineSpec, Sampler
    from buffers.shard import ReplayShard
    from buffers.sharded import RayInvoke, ShardedReplay
    from learners.group import LearnerGroup
    from learners.weight_sync import make_transport

    check_cluster(cfg, model_path=model_path)  # fail now, not in a placement group that waits forever
    K, r, s = cfg.trainer.rollouts_per_question, cfg.replay, cfg.samplers
    wal = Path(run_dir) / "replay-wal" if run_dir is not None and r.wal else None
    if wal is not None:  # new shards start empty (a resume restores them from its checkpoint)
        shutil.rmtree(wal, ignore_errors=True)
    restarts = r.shard_max_restarts if wal is not None else 0
    shards = [
        remote_actor(
            ReplayShard,
            name=f"exgrpo-replay-{i}",
            num_cpus=0,
            max_restarts=restarts,
            k_rollouts=K,
            max_trajectories_per_question=r.max_trajectories_per_question,
            wal_dir=str(wal / f"shard-{i}") if wal is not None else None,
            compact_bytes=int(r.wal_compact_mb * 2**20),
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
    learners = make_learners(cfg) if make_learners is not None else LearnerGroup(
        num=cfg.learners.num,
        make_actor=remote_actor,
        model_path=model_path,
        learner_cfg=cfg.learners,
        loss_cfg=cfg.loss,
        max_response_len=cfg.model.max_response_len,
        seed=cfg.trainer.seed,
        dtype=cfg.model.dtype,
    )
    spec = EngineSpec(
        kind=s.engine,
        model_path=model_path,
        dtype=cfg.model.dtype,
        gpu_memory_utilization=s.gpu_memory_utilization,
        weight_transfer=transfer_backend(cfg),
    )

    def spawn(index: int) -> Any:
        if make_sampler is not None:
            return make_sampler(index, replay)
        return remote_actor(
            Sampler,
            name=f"exgrpo-sampler-{index}",
            num_cpus=s.num_cpus,
            num_gpus=s.num_gpus,
            index=index,
            engine=spec,
            template=cfg.model.template,
            max_response_len=cfg.model.max_response_len,
            temperature=s.temperature,
            top_p=s.top_p,
            verify_timeout_s=s.verify_timeout_s,
            replay=replay,
            seed=cfg.trainer.seed,
        )

    # every admitted request can be on its way at once: the pool dispatches only inside submit/poll, so a
    # sampler limited to fewer chunks than it is given per step runs dry while the driver waits in
    # update/broadcast (measured in the simulated cluster: 16 samplers, eta 1, 1.73x the ideal step)
    in_flight = math.ceil((cfg.async_.max_staleness + 1) * cfg.trainer.questions_per_step / (s.num * s.requests_per_call))
    samplers = SamplerPool(spawn=spawn, num=s.num, requests_per_call=s.requests_per_call,
                           max_in_flight_per_sampler=max(2, in_flight))
    weights = make_transport(cfg.async_.weight_sync, learners=learners, samplers=samplers)
    samplers.on_new = weights.catch_up
    controller = remote_actor(Controller, name="exgrpo-controller", num_cpus=0, samplers=s.num)
    return System(
        replay=replay,
        samplers=samplers,
        learners=learners,
        weights=weights,
        controller=controller,
        scaling=ControllerClient(controller),
    )


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


def train(
    cfg: Config,
    *,
    resume: bool = False,
    checkpoints: bool = True,
    on_batch: Callable[[Any], None] | None = None,
    during: Callable[[dict[str, Any], System], None] | None = None,
    inspect: Callable[[System, Any], Any] | None = None,
    stall_timeout_s: float = 900.0,
) -> RunResult:
    """Run one training job end to end (or continue it from its latest checkpoint with `resume`).

    `on_batch(batch)` sees every TrainBatch, `during(record, system)` runs after every step, and
    `inspect(system, driver)` runs after the last step, before the actors stop (tests use these).
    """
    from exgrpo.checkpoint import (
        Checkpointer,
        RunInterrupted,
        checkpoint_step,
        copy_tokenizer,
        dead_actor,
        fresh_run_dir_check,
        interrupted_message,
        latest_checkpoint,
        restore_checkpoint,
        resume_checkpoint,
        rewind_metrics,
        tokenizer_files,
    )
    from exgrpo.data.sources import load_prompts
    from exgrpo.data.tasks import trace_checker
    from exgrpo.driver import Driver
    from exgrpo.metrics import MetricsLogger, read_jsonl
    from exgrpo.models.resolve import resolve_model
    from exgrpo.report import Phases, Progress, quiet_libraries, write_report

    t_start = time.perf_counter()
    phases = Phases(enabled=cfg.logging.progress)  # a line for every phase past ~2 s, all timed
    quiet_libraries(verbose=cfg.logging.verbose)
    # refuse a bad resume (or a fresh run over another run's checkpoints) before anything is written
    ckpt = (
        resume_checkpoint(Path(cfg.logging.run_dir).expanduser(), cfg) if resume else fresh_run_dir_check(cfg)
    )
    run_dir = make_run_dir(cfg)
    if ckpt is not None and (dropped := rewind_metrics(run_dir, checkpoint_step(ckpt))):
        log.info(
            "metrics.jsonl: dropped %d records of steps after %s (they are trained again)", dropped, ckpt.name
        )
    phases.start("base model", f"{cfg.model.path} (built once, then cached)")
    model_path = str(
        resolve_model(str(ckpt / "model") if ckpt else cfg.model.path, cache_dir=cfg.model.cache_dir)
    )
    tokenizer = tokenizer_files(model_path)  # read now: a resumed run rotates its source checkpoint away
    phases.start("data", cfg.data.train)
    train_set, eval_set = load_prompts(cfg)
    log.info(
        "run dir %s; model %s; %d train / %d eval questions",
        run_dir,
        model_path,
        len(train_set),
        len(eval_set),
    )
    phases.start("Ray start-up")
    init_ray(cfg)
    check_cluster(cfg, model_path=model_path)
    phases.start(
        "actor start-up",
        f"{cfg.samplers.num} samplers, {cfg.learners.num} learners, {cfg.replay.num_shards} replay shards",
    )
    system = build_system(cfg, model_path=model_path, run_dir=run_dir)
    phases.start("loggers", ", ".join(cfg.logging.backends))
    logger = MetricsLogger.from_config(run_dir, cfg)  # metrics.jsonl + logging.backends + Ray gauges
    phases.start("train loop", announce=False)  # evaluations, steps, final save: the bar shows them
    progress = Progress(total=cfg.trainer.steps, enabled=cfg.logging.progress, evaluating=bool(eval_set))
    checkpointer = (
        Checkpointer(run_dir, model_path=model_path, keep=cfg.trainer.keep_checkpoints)
        if checkpoints
        else None
    )

    def after_step(record: dict[str, Any]) -> None:
        progress.update(record)
        if during is not None:
            during(record, system)

    trace_check = trace_checker(cfg.data.train)
    candidates_log = CandidateLog(run_dir / "candidates.jsonl") if trace_check is not None else None
    driver = Driver(
        cfg=cfg,
        rollouts=system.samplers,
        replay=system.replay,
        learners=system.learners,
        weights=system.weights,
        train=train_set,
        evaluation=eval_set,
        scaling=system.scaling,
        logger=logger,
        progress=after_step,
        checkpointer=checkpointer,
        on_batch=on_batch,
        stall_timeout_s=stall_timeout_s,
        trace_check=trace_check,
        on_candidates=candidates_log,
    )
    inspected = None
    try:
        if ckpt is not None:
            t0 = time.perf_counter()
            restore_checkpoint(ckpt, driver=driver)
            progress.skip(driver.step)
            log.info(
                "resumed from %s at step %d (policy version %d); restore took %.2f s",
                ckpt,
                driver.step,
                driver.version,
                time.perf_counter() - t0,
            )
        records = driver.train()
        system.learners.save(path=str(run_dir / "final"))
        copy_tokenizer(tokenizer, run_dir / "final")
        if inspect is not None:
            inspected = inspect(system, driver)
    except ray.exceptions.RayActorError as err:  # a learner or shard died (the pool replaces samplers itself)
        message = interrupted_message(run_dir, what=dead_actor(str(err)), step=driver.step)
        raise RunInterrupted(message, run_dir=run_dir, checkpoint=latest_checkpoint(run_dir)) from err
    finally:
        progress.close()
        if sys.exc_info()[0] is not None:
            logger.close()  # a failed run: flush what was logged (TensorBoard, W&B); no report
        phases.start("shutdown")
        system.shutdown()
    phases.start("report")
    wall = time.perf_counter() - t_start
    summary = write_report(
        run_dir,
        records=read_jsonl(logger.path),
        evals=driver.eval_history,
        wall_s=wall,
        plots=cfg.logging.plots,
        html_report=cfg.logging.report,
        phases=phases.times,
        run_id=logger.run_id,
        config_yaml=cfg.to_yaml(),
    )
    logger.summary(summary)
    logger.close()
    phases.end()
    return RunResult(
        run_dir=run_dir,
        records=records,
        evals=list(driver.eval_history),
        wall_s=wall,
        checkpoint_s=list(checkpointer.seconds) if checkpointer else [],
        inspected=inspected,
    )
