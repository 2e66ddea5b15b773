"""The training recipe: one job end to end (or continued from its latest checkpoint).

    config -> model dir -> prompts -> Ray -> actors (`build_system`) -> Driver -> checkpoints -> report

`TrainingRecipe(cfg, resume=...).run()` runs its stages in order: `setup`, `train`, `save`, `cleanup`
and `report`. `train(cfg, resume=...)` is that in one call (restarted from the latest checkpoint after a
death, `exgrpo.runtime.healing`), and what every caller runs: the CLI (`exgrpo.run`), the sweep
(`exgrpo.experiments.compare`), the integration tests and the benchmarks. What the run reports as it goes
reaches the metrics logger, the progress bar, the sample log (a few completions every
`logging.samples_every` steps), the candidate log and the caller's own `observer`
(`exgrpo.loop.observer.Observer`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import ray

from exgrpo.core.config import Config
from exgrpo.core.roles import RunObserver
from exgrpo.loop.observer import Observers
from exgrpo.reporting.console import PREFIX, Phase, Phases, Progress, quiet_libraries
from exgrpo.reporting.loggers import MetricsLogger
from exgrpo.runtime import signals
from exgrpo.runtime.assembly import System, build_system
from exgrpo.runtime.env import init_ray
from exgrpo.runtime.healing import Attempt, Job, RunResult, resolve_max_failures, supervise
from exgrpo.runtime.resources import check_cluster
from exgrpo.runtime.run_dir import (
    check_run_dir,
    closing_lines,
    job_run_dir,
    open_run_dir,
    shared_run_dir_note,
)
from exgrpo.runtime.start import check_reward, run_observers, start_model, start_prompts

if TYPE_CHECKING:
    from exgrpo.core.records import Prompt
    from exgrpo.loop.checkpoint import Checkpointer, RunInterrupted
    from exgrpo.loop.driver import Driver

log = logging.getLogger("exgrpo")
T = TypeVar("T")


class TrainingRecipe:
    """One training job (or, with `resume`, its continuation from the latest checkpoint of
    `cfg.logging.run_dir`), stage by stage; `run()` runs them in order.

    `checkpoints=False` writes none (`trainer.checkpoint_every` is ignored). `observer` (a
    `exgrpo.core.roles.RunObserver`, e.g. a subclass of `exgrpo.loop.observer.Observer`) sees every
    batch and step record, and gets the system and the driver before the first step and after the
    final save, before the actors stop (tests read the actors' state there). `stall_timeout_s`: how
    long a step may wait without any generation finishing before the run fails. `attempt` and `job`: which
    start of the job this is and what the job keeps across them (`exgrpo.runtime.healing`; `train` passes them).
    """

    def __init__(
        self,
        cfg: Config,
        *,
        resume: bool = False,
        checkpoints: bool = True,
        observer: RunObserver | None = None,
        stall_timeout_s: float = 900.0,
        attempt: Attempt | None = None,
        job: Job | None = None,
        stop_on_signals: bool = False,
    ) -> None:
        self.cfg = cfg
        self.graceful_stop = stop_on_signals  # SIGINT / SIGTERM stop at a step boundary (the CLI's runs)
        self.attempt = attempt if attempt is not None else Attempt(resume=resume)
        self.job = job if job is not None else Job()
        self.resume, self.checkpoints, self.stall_timeout_s = resume, checkpoints, stall_timeout_s
        self.phases = Phases(enabled=cfg.logging.progress)  # a line for every phase past ~2 s, all timed
        # built by `setup`
        self.ckpt: Path | None = None  # the checkpoint a resumed run restores
        self.run_dir = Path()
        self._made_run_dir = False  # setup made the run directory (removed again when the start is refused)
        self.long_prompts_skipped = 0  # prompts over model.max_prompt_len left out (data.long_prompts=skip)
        self.model_path = ""
        self.tokenizer: dict[str, bytes] = {}
        self.train_set: list[Prompt] = []
        self.eval_set: list[Prompt] = []
        self.system: System | None = None
        self.logger: MetricsLogger | None = None
        self.progress: Progress | None = None
        self.checkpointer: Checkpointer | None = None
        self.driver: Driver | None = None
        # logger, progress bar, sample log, candidate log (tasks with a trace check), the caller's observer
        self.observers = Observers()
        self.caller_observer = observer
        self.records: list[dict[str, Any]] = []  # what `train` trained (a resumed run: from its checkpoint)

    def run(self) -> RunResult:
        """setup, train, save, the observers' `on_train_end`, cleanup (always, a failed setup too) and report
        (on success).

        A learner or replay shard that dies (`ray.exceptions.RayActorError`) ends the run
        with `RunInterrupted`, whose message names the checkpoint and the resume command (`train` recovers
        from it). A failed run flushes what was logged and writes no report.
        """
        try:
            self.setup()
        except BaseException:
            self.cleanup(failed=True)  # whatever setup started (the actors, the logger) stops with it
            self.forget_run_dir()  # a refused start leaves no run directory behind
            raise
        failed = True
        try:
            with self.stop_on_signals() if self.graceful_stop else contextlib.nullcontext():
                self.train()
            stopped = getattr(self.driver, "stopped", None)
            if stopped is None:  # a stopped run keeps its checkpoint, no final model
                self.save()
            self.observers.on_train_end(system=self.system, driver=self.driver)
            failed = False
        except ray.exceptions.RayActorError as err:
            # a learner or shard died (the pool replaces samplers itself)
            raise self.interrupted(err) from err
        finally:
            self.cleanup(failed=failed)
        return self.report()

    # -- the stages --------------------------------------------------------------------------------
    def setup(self) -> None:
        """Resume checks, the run dir, the base model, the data, Ray, the actors, the loggers and the driver.

        A bad resume (or a fresh run over another run's checkpoints) is refused before anything is
        written. The train-loop phase starts before the driver is built.
        """
        from exgrpo.loop.checkpoint import fresh_run_dir_check, resume_checkpoint

        defaulted = self.cfg is not (cfg := job_run_dir(self.cfg))  # a submitted job's default run dir
        self.cfg = cfg
        quiet_libraries(verbose=cfg.logging.verbose)
        if self.resume:
            self.ckpt = resume_checkpoint(Path(cfg.logging.run_dir).expanduser(), cfg)
        else:
            fresh_run_dir_check(cfg, recovery=bool(self.attempt.recovery))
            self.ckpt = None
        check_reward(cfg)  # a reward.fn that cannot be imported fails before anything is written
        check_run_dir(cfg)  # before anything is written there
        base_model = self._open_run(defaulted=defaulted)
        self._load_data()
        self._start_actors()
        self._build_driver(base_model)

    def _open_run(self, *, defaulted: bool) -> dict[str, Any]:
        """The base model, the run dir, the model this start loads (a resumed run's checkpoint, pinned), its
        tokenizer and its LoRA targets checked (`exgrpo.runtime.start.start_model`); returns the base model's
        record."""
        from exgrpo.models.resolve import resolve_model

        cfg, ckpt = self.cfg, self.ckpt
        self.phases.start(Phase.BASE_MODEL, cfg.model.path)
        # a fresh run's model (a hub id: from the hub cache or downloaded) before its run dir is made: a model
        # that cannot be had leaves nothing behind
        fresh_model = None if ckpt else str(resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir))
        new = not self.resume and not self.attempt.recovery
        run_dir, self._made_run_dir = open_run_dir(cfg, new=new, defaulted=defaulted)
        self.run_dir = run_dir
        model = start_model(
            cfg,
            ckpt=ckpt,
            fresh_model=fresh_model,
            run_dir=run_dir,
            recovery=self.attempt.recovery,
            job=self.job,
        )
        self.model_path, self.tokenizer = model.path, model.tokenizer
        return model.base_model

    def _load_data(self) -> None:
        """The train and held-out prompts, under model.max_prompt_len and data.long_prompts."""
        self.phases.start(Phase.DATA, self.cfg.data.train)
        self.train_set, self.eval_set, self.long_prompts_skipped = start_prompts(
            self.cfg, model_path=self.model_path, run_dir=self.run_dir
        )

    def _start_actors(self) -> None:
        """Ray (the run dir and the resources checked against the cluster), then the actors."""
        cfg, phases = self.cfg, self.phases
        phases.start(Phase.RAY)
        init_ray(cfg)
        nodes = len([n for n in ray.nodes() if n.get("Alive")])
        check_run_dir(cfg, nodes=nodes)
        if nodes > 1:
            print(shared_run_dir_note(self.run_dir, nodes=nodes), file=sys.stderr, flush=True)
        check_cluster(cfg, model_path=self.model_path)
        phases.start(
            Phase.ACTORS,
            f"{cfg.samplers.num} samplers, {cfg.learners.num} learners, {cfg.replay.num_shards} replay shards",
        )
        self.system = build_system(cfg, model_path=self.model_path, run_dir=self.run_dir)

    def _build_driver(self, base_model: dict[str, Any]) -> None:
        """The loggers, the progress bar, the checkpointer, the observers and the driver over the actors."""
        from exgrpo.data.tasks import trace_checker
        from exgrpo.loop.checkpoint import Checkpointer
        from exgrpo.loop.driver import Driver, Roles

        cfg, run_dir, system = self.cfg, self.run_dir, self._built(self.system)
        self.phases.start(Phase.LOGGERS, ", ".join(cfg.logging.backends))
        self.logger = MetricsLogger.from_config(run_dir, cfg)  # metrics.jsonl + logging.backends + Ray gauges
        # evaluations, steps, final save: the bar shows them
        self.phases.start(Phase.TRAIN_LOOP, announce=False)
        self.progress = Progress(
            total=cfg.trainer.steps,
            enabled=cfg.logging.progress,
            evaluating=bool(self.eval_set),
            eval_key=f"eval(T {cfg.samplers.temperature}, n {cfg.trainer.eval_samples})",
        )
        self.checkpointer = (
            Checkpointer(
                run_dir, model_path=self.model_path, keep=cfg.trainer.keep_checkpoints, base_model=base_model
            )
            if self.checkpoints
            else None
        )
        trace_check = trace_checker(cfg.data.train)
        self.observers = run_observers(
            cfg,
            run_dir=run_dir,
            logger=self.logger,
            progress=self.progress,
            train_set=self.train_set,
            job=self.job,
            caller=self.caller_observer,
        )
        roles = Roles(system.samplers, system.replay, system.learners, system.weights, scaling=system.scaling)
        self.driver = Driver(
            cfg=cfg,
            roles=roles,
            train=self.train_set,
            evaluation=self.eval_set,
            observer=self.observers,
            checkpointer=self.checkpointer,
            stall_timeout_s=self.stall_timeout_s,
            trace_check=trace_check,
            recoveries=self.attempt.recovery,
        )

    def train(self) -> list[dict[str, Any]]:
        """Restore the checkpoint of a resumed run, then run the driver to `trainer.steps`."""
        from exgrpo.loop.checkpoint import restore_checkpoint

        driver, progress = self._built(self.driver), self._built(self.progress)
        if self.ckpt is not None:
            t0 = time.perf_counter()
            restore_checkpoint(self.ckpt, driver=driver)
            progress.skip(driver.step)
            log.info(
                "resumed from %s at step %d (policy version %d); restore took %.2f s",
                self.ckpt,
                driver.step,
                driver.version,
                time.perf_counter() - t0,
            )
        self.observers.on_train_start(system=self.system, driver=driver)
        self.records = driver.train()
        if driver.out_of_work:  # the data ran out: the run still saves, reports and exits 0
            print(f"{PREFIX} {driver.out_of_work}; saving the final model and the report", file=sys.stderr)
        return self.records

    def save(self) -> None:
        """The final model (`<run_dir>/final`, HF safetensors) and the tokenizer beside it."""
        from exgrpo.loop.checkpoint import copy_tokenizer

        self._built(self.system).learners.save(path=str(self.run_dir / "final"))
        copy_tokenizer(self.tokenizer, self.run_dir / "final")

    def cleanup(self, *, failed: bool) -> None:
        """Close the progress bar, flush the logger of a failed run (TensorBoard, W&B), stop the actors
        (each only if `setup` got as far as building it)."""
        if self.progress is not None:
            self.progress.close()
        if failed and self.logger is not None:
            self.logger.close()  # a failed run: flush what was logged; no report
        if self.system is not None:
            self.job.samplers = self.system.scaling.current()  # a recovery starts as many as the operator set
            self.phases.start(Phase.SHUTDOWN)
            self.system.shutdown()

    def report(self) -> RunResult:
        """summary.json / summary.txt (printed), plots and report.html as configured; closes the logger."""
        from exgrpo.reporting.loggers import read_jsonl
        from exgrpo.reporting.report import RunFacts, write_report

        cfg, driver, logger = self.cfg, self._built(self.driver), self._built(self.logger)
        self.phases.start(Phase.REPORT)
        wall = self.job.wall_s()
        summary = write_report(
            self.run_dir,
            records=read_jsonl(logger.path),
            evals=driver.eval_history,
            wall_s=wall,
            facts=RunFacts(
                run_id=logger.run_id,
                config_yaml=cfg.to_yaml(),
                phases=self.phases.times,
                eval_temperature=cfg.samplers.temperature,
                eval_samples=cfg.trainer.eval_samples,
                reward_failure_notes=driver.reward_failure_notes,
                custom_reward=cfg.reward.fn != "math",
                long_prompts_skipped=self.long_prompts_skipped,
            ),
            plots=cfg.logging.plots,
            html_report=cfg.logging.report,
        )
        logger.summary(summary)
        logger.close()
        self.phases.end()
        stopped = driver.stopped
        where, resume = closing_lines(self.run_dir, stopped=stopped)
        print(where, flush=True)
        return RunResult(
            run_dir=self.run_dir,
            records=list(self.job.records),
            evals=list(driver.eval_history),
            wall_s=wall,
            checkpoint_s=list(self.checkpointer.seconds) if self.checkpointer else [],
            recoveries=self.attempt.recovery,
            stopped=stopped,
            resume_command=resume,
        )

    # -- helpers -----------------------------------------------------------------------------------
    def stop_on_signals(self) -> contextlib.AbstractContextManager[None]:
        """While training: SIGINT / SIGTERM stop the driver at the next step boundary, a second one at once
        (`exgrpo.runtime.signals.stop_on_signals`)."""
        return signals.stop_on_signals(self.driver)

    def forget_run_dir(self) -> None:
        """Remove the run directory this start made, when its setup failed (nothing was trained)."""
        import shutil

        if self._made_run_dir and self.run_dir.is_dir():
            shutil.rmtree(self.run_dir, ignore_errors=True)
            log.info("removed %s: the start was refused before any step", self.run_dir)

    def interrupted(self, err: ray.exceptions.RayActorError) -> RunInterrupted:
        """The `RunInterrupted` for an actor that died: what died, at which step, how to resume."""
        from exgrpo.loop.checkpoint import RunInterrupted, dead_actor, interrupted_message, latest_checkpoint

        step, what = self._built(self.driver).step, dead_actor(str(err))
        message = interrupted_message(self.run_dir, what=what, step=step)
        ckpt = latest_checkpoint(self.run_dir)
        return RunInterrupted(message, run_dir=self.run_dir, checkpoint=ckpt, what=what, step=step)

    @staticmethod
    def _built(part: T | None) -> T:
        """A part `setup` builds (the system, the driver, ...)."""
        if part is None:
            raise RuntimeError("TrainingRecipe: call setup() first")
        return part


def train(
    cfg: Config,
    *,
    resume: bool = False,
    checkpoints: bool = True,
    observer: RunObserver | None = None,
    stall_timeout_s: float = 900.0,
    stop_on_signals: bool = False,
) -> RunResult:
    """Run one training job end to end (or continue it from its latest checkpoint with `resume`):
    `TrainingRecipe(cfg, ...).run()`, and after a learner or shard death up to
    `trainer.max_failures` more, each a fresh recipe resuming this run dir (`exgrpo.runtime.healing`).
    `observer` sees every attempt (`on_train_start` once per attempt). `stop_on_signals` (the CLI sets it):
    the first SIGINT / SIGTERM stops at the next step boundary with a checkpoint and a report
    (`RunResult.stopped`), a second one at once."""
    job = Job()

    def start(a: Attempt) -> RunResult:
        return TrainingRecipe(
            a.config(cfg, samplers=job.samplers),
            resume=a.resume,
            checkpoints=checkpoints,
            observer=observer,
            stall_timeout_s=stall_timeout_s,
            attempt=a,
            job=job,
            stop_on_signals=stop_on_signals,
        ).run()

    limit = resolve_max_failures(cfg)
    return supervise(start, first=Attempt(resume=resume), max_failures=limit, steps=cfg.trainer.steps)
