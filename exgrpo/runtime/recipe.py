"""The training recipe: one job end to end (or continued from its latest checkpoint).

    config -> model dir -> prompts -> Ray -> actors (`build_system`) -> Driver -> checkpoints -> report

`train(cfg, resume=...)` is what every caller runs: the CLI (`exgrpo.run`), the sweep
(`exgrpo.experiments.compare`), the integration tests and the benchmarks.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from exgrpo.core.config import Config
from exgrpo.reporting.loggers import CandidateLog
from exgrpo.runtime.assembly import System, build_system
from exgrpo.runtime.env import init_ray
from exgrpo.runtime.resources import check_cluster

log = logging.getLogger("exgrpo")


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
    from exgrpo.data.sources import load_prompts
    from exgrpo.data.tasks import trace_checker
    from exgrpo.loop.checkpoint import (
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
    from exgrpo.loop.driver import Driver
    from exgrpo.models.resolve import resolve_model
    from exgrpo.reporting.console import Phases, Progress, quiet_libraries
    from exgrpo.reporting.loggers import MetricsLogger, read_jsonl
    from exgrpo.reporting.report import write_report

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
