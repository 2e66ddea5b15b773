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
import dataclasses
import datetime as dt
import json
import logging
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import ray

from exgrpo.core.config import Config, ConfigError
from exgrpo.core.roles import RunObserver
from exgrpo.loop.observer import Observers
from exgrpo.reporting.console import PREFIX, Phase, Phases, Progress, quiet_libraries
from exgrpo.reporting.loggers import CandidateLog, MetricsLogger
from exgrpo.reporting.samples import SampleLog
from exgrpo.runtime.assembly import System, build_system
from exgrpo.runtime.env import init_ray
from exgrpo.runtime.healing import Attempt, Job, resolve_max_failures, supervise
from exgrpo.runtime.resources import check_cluster

if TYPE_CHECKING:
    from exgrpo.core.records import Prompt
    from exgrpo.loop.checkpoint import Checkpointer, RunInterrupted
    from exgrpo.loop.driver import Driver

log = logging.getLogger("exgrpo")
T = TypeVar("T")


@dataclass
class RunResult:
    run_dir: Path
    records: list[dict[str, Any]]
    evals: list[dict[str, float]]
    wall_s: float  # the whole job, every attempt
    # seconds of every checkpoint write (of the last attempt)
    checkpoint_s: list[float] = field(default_factory=list)
    recoveries: int = 0  # in-job restarts from a checkpoint (trainer.max_failures)
    stopped: str | None = None  # stopped early by SIGINT / SIGTERM at a step boundary (checkpointed)
    resume_command: str | None = None  # how to continue a stopped run


def check_reward(cfg: Config) -> None:
    """Import `reward.fn` here, in the driver, so a bad spec fails with its reason before any actor starts."""
    from exgrpo.verify.plugin import RewardError, resolve
    from exgrpo.verify.rewards import MATH

    if cfg.reward.fn != MATH:
        try:
            resolve(cfg.reward.fn)
        except RewardError as err:
            raise ConfigError(str(err)) from err


def submitted_with_working_dir() -> bool:
    """Whether this driver is a `ray job submit --working-dir ...` entrypoint (it runs in Ray's copy of it)."""
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    return bool((job.get("runtime_env") or {}).get("working_dir"))


# where a submitted job's runs go when it sets no logging.run_dir (a directory on the driver's node)
JOB_RUNS_ENV = "EXGRPO_RUNS_DIR"
JOB_RUNS_DEFAULT = "~/exgrpo-runs"


def job_run_dir(cfg: Config) -> Config:
    """A job submitted with `--working-dir` that sets no `logging.run_dir` writes to `<root>/<time>`, an absolute
    path that outlives the job's temporary copy of the working directory: root is `$EXGRPO_RUNS_DIR`, else
    `~/exgrpo-runs` of the user running the driver. Any other config is returned as it is."""
    if cfg.logging.run_dir or not submitted_with_working_dir():
        return cfg
    root = Path(os.environ.get(JOB_RUNS_ENV) or JOB_RUNS_DEFAULT).expanduser().resolve()
    run_dir = str(root / f"{dt.datetime.now():%Y%m%d-%H%M%S}")
    return dataclasses.replace(cfg, logging=dataclasses.replace(cfg.logging, run_dir=run_dir))


def shared_run_dir_note(run_dir: Path, *, nodes: int) -> str:
    """On a cluster of several nodes: where checkpoints land and what every node must share."""
    return (
        f"{PREFIX} {nodes} nodes: checkpoints land in {run_dir.resolve()}/checkpoints; learner ranks on other "
        f"nodes write their weights there on their own node, so {run_dir.resolve().parent} must be one directory "
        f"every node mounts (else the first checkpoint fails, saying so): set {JOB_RUNS_ENV} or "
        "logging.run_dir to shared storage (docs/operating.md, 'Two nodes')"
    )


def check_run_dir(cfg: Config, *, nodes: int = 1) -> None:
    """Refuse a relative `logging.run_dir` on a cluster (RAY_ADDRESS, a submitted job, or more than one node).

    On a cluster, learner ranks on other nodes write checkpoints and replay logs under the run dir: it must be
    one absolute path on storage every node mounts (a relative one lands in Ray's per-job temporary copy of
    the working directory, or in a different directory on every node). See docs/operating.md, "Two nodes".
    """
    if Path(cfg.logging.run_dir or "runs").expanduser().is_absolute():
        return
    why = (
        "this is a job submitted with --working-dir (its copy is deleted after the job)"
        if submitted_with_working_dir()
        else "RAY_ADDRESS is set (an existing cluster)"
        if os.environ.get("RAY_ADDRESS")
        else f"the Ray cluster has {nodes} nodes"
        if nodes > 1
        else ""
    )
    if why:
        raise ConfigError(
            f"logging.run_dir={cfg.logging.run_dir or '(unset: runs/<time>)'} is relative but {why}; set "
            "logging.run_dir to an absolute path on storage every node shares (docs/operating.md, 'Two nodes')"
        )


def make_run_dir(cfg: Config) -> Path:
    run_dir = Path(cfg.logging.run_dir or f"runs/{dt.datetime.now():%Y%m%d-%H%M%S}").expanduser()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    return run_dir


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
        from exgrpo.data.sources import load_prompts
        from exgrpo.data.tasks import trace_checker
        from exgrpo.loop.checkpoint import (
            BASE_MODEL_FILE,
            Checkpointer,
            checkpoint_step,
            fresh_run_dir_check,
            pin_model,
            resume_checkpoint,
            rewind_metrics,
            tokenizer_files,
        )
        from exgrpo.loop.driver import Driver
        from exgrpo.models.resolve import model_record, resolve_model

        defaulted = self.cfg is not (cfg := job_run_dir(self.cfg))  # a submitted job's default run dir
        self.cfg, phases = cfg, self.phases
        quiet_libraries(verbose=cfg.logging.verbose)
        ckpt = self.ckpt = (
            resume_checkpoint(Path(cfg.logging.run_dir).expanduser(), cfg)
            if self.resume
            else fresh_run_dir_check(cfg)
        )
        check_reward(cfg)  # a reward.fn that cannot be imported fails before anything is written
        check_run_dir(cfg)  # before anything is written there
        phases.start(Phase.BASE_MODEL, cfg.model.path)
        # a fresh run's model (a hub id: from the hub cache or downloaded) before its run dir is made: a model
        # that cannot be had leaves nothing behind
        fresh_model = None if ckpt else str(resolve_model(cfg.model.path, cache_dir=cfg.model.cache_dir))
        fresh = not cfg.logging.run_dir or not Path(cfg.logging.run_dir).expanduser().exists()
        made = fresh and not self.resume and not self.attempt.recovery
        run_dir = self.run_dir = make_run_dir(cfg)
        self._made_run_dir = made
        if defaulted:
            print(
                f"{PREFIX} run directory {run_dir} (a submitted job's default on the driver's node "
                f"{platform.node()}; set logging.run_dir or {JOB_RUNS_ENV} to choose)",
                flush=True,
            )
        # the steps trained again: after the checkpoint, or all (the first evaluation too) when a recovery
        # restarts at step 0 over this job's own run dir
        again = checkpoint_step(ckpt) if ckpt is not None else -1 if self.attempt.recovery else None
        if again is not None and (dropped := rewind_metrics(run_dir, again)):
            log.info(
                "metrics.jsonl: dropped %d records of steps >= %d (they are trained again)", dropped, again
            )
        self.job.rewind(max(again or 0, 0))
        # a resumed run starts from its checkpoint's weights, pinned in the run dir: rotation deletes the checkpoint
        model_path = self.model_path = fresh_model or str(
            resolve_model(str(pin_model(ckpt, run_dir)), cache_dir=cfg.model.cache_dir)
        )
        base_model = model_record(cfg.model.path, model_path)  # a hub id: its repo, revision and commit
        if ckpt is None:
            (run_dir / BASE_MODEL_FILE).write_text(json.dumps(base_model, indent=1))
        elif (run_dir / BASE_MODEL_FILE).is_file():
            base_model = json.loads((run_dir / BASE_MODEL_FILE).read_text())
        self.tokenizer = tokenizer_files(model_path)
        if (
            cfg.learners.lora_rank > 0
        ):  # before Ray: a target that matches nothing fails here, naming the choices
            from exgrpo.runtime.preflight import check_lora_targets

            check_lora_targets(Path(model_path), cfg.learners.lora_target_modules)
        phases.start(Phase.DATA, cfg.data.train)
        train_set, eval_set = load_prompts(cfg)
        # model.max_prompt_len under data.long_prompts, before any engine sees a prompt
        from exgrpo.runtime.preflight import enforce_prompt_lengths

        self.train_set, self.eval_set, skipped = enforce_prompt_lengths(cfg, model_path, train_set, eval_set)
        self.long_prompts_skipped = len(train_set) + len(eval_set) - len(self.train_set) - len(self.eval_set)
        if skipped:
            log.warning("%s", skipped)
        log.info(
            "run dir %s; model %s; %d train / %d eval questions",
            run_dir.resolve(),  # absolute: a submitted job (RAY_ADDRESS) runs in Ray's copy of the working dir
            model_path,
            len(self.train_set),
            len(self.eval_set),
        )
        phases.start(Phase.RAY)
        init_ray(cfg)
        nodes = len([n for n in ray.nodes() if n.get("Alive")])
        check_run_dir(cfg, nodes=nodes)
        if nodes > 1:
            print(shared_run_dir_note(run_dir, nodes=nodes), file=sys.stderr, flush=True)
        check_cluster(cfg, model_path=model_path)
        phases.start(
            Phase.ACTORS,
            f"{cfg.samplers.num} samplers, {cfg.learners.num} learners, {cfg.replay.num_shards} replay shards",
        )
        system = self.system = build_system(cfg, model_path=model_path, run_dir=run_dir)
        phases.start(Phase.LOGGERS, ", ".join(cfg.logging.backends))
        self.logger = MetricsLogger.from_config(run_dir, cfg)  # metrics.jsonl + logging.backends + Ray gauges
        phases.start(Phase.TRAIN_LOOP, announce=False)  # evaluations, steps, final save: the bar shows them
        self.progress = Progress(
            total=cfg.trainer.steps,
            enabled=cfg.logging.progress,
            evaluating=bool(self.eval_set),
            eval_key=f"eval(T {cfg.samplers.temperature}, n {cfg.trainer.eval_samples})",
        )
        self.checkpointer = (
            Checkpointer(
                run_dir, model_path=model_path, keep=cfg.trainer.keep_checkpoints, base_model=base_model
            )
            if self.checkpoints
            else None
        )
        trace_check = trace_checker(cfg.data.train)
        candidates = CandidateLog(run_dir / "candidates.jsonl") if trace_check is not None else None
        lc = cfg.logging
        samples = (
            SampleLog(
                run_dir / "samples.jsonl",
                questions={p.qid: p.question for p in self.train_set},
                every=lc.samples_every,
                per_step=lc.samples_per_step,
                sink=self.logger.log_samples,
            )
            if lc.samples_every and lc.samples_per_step
            else None
        )
        self.observers = Observers(
            self.logger, self.progress, samples, candidates, self.job, self.caller_observer
        )
        self.driver = Driver(
            cfg=cfg,
            rollouts=system.samplers,
            replay=system.replay,
            learners=system.learners,
            weights=system.weights,
            train=self.train_set,
            evaluation=self.eval_set,
            scaling=system.scaling,
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
        from exgrpo.reporting.report import write_report

        cfg, driver, logger = self.cfg, self._built(self.driver), self._built(self.logger)
        self.phases.start(Phase.REPORT)
        wall = self.job.wall_s()
        summary = write_report(
            self.run_dir,
            records=read_jsonl(logger.path),
            evals=driver.eval_history,
            wall_s=wall,
            plots=cfg.logging.plots,
            html_report=cfg.logging.report,
            phases=self.phases.times,
            run_id=logger.run_id,
            config_yaml=cfg.to_yaml(),
            eval_temperature=cfg.samplers.temperature,
            eval_samples=cfg.trainer.eval_samples,
            reward_failure_notes=driver.reward_failure_notes,
            custom_reward=cfg.reward.fn != "math",
            long_prompts_skipped=self.long_prompts_skipped,
        )
        logger.summary(summary)
        logger.close()
        self.phases.end()
        where = f"{PREFIX} run directory {self.run_dir.resolve()}"
        stopped, resume = driver.stopped, None
        if stopped is not None:
            from exgrpo.loop.checkpoint import latest_checkpoint

            ckpt = latest_checkpoint(self.run_dir)
            resume = f"python -m exgrpo.run --resume {self.run_dir}" if ckpt else None
            where += f"\n{PREFIX} {stopped}; " + (
                f"checkpoint {ckpt.name}; continue with: {resume}" if ckpt else "no checkpoint was written"
            )
        if (self.run_dir / "report.html").is_file():
            where += f"\n{PREFIX} report {(self.run_dir / 'report.html').resolve()}"
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
    @contextlib.contextmanager
    def stop_on_signals(self) -> Iterator[None]:
        """While training: the first SIGINT (Ctrl-C) or SIGTERM asks the driver to stop at the next step
        boundary (checkpoint, summary, report, the resume command); a second one stops at once
        (KeyboardInterrupt). Only in the main thread (signal handlers live there)."""
        driver = self.driver
        if driver is None or threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.getsignal(sig) for sig in signals}

        def handler(signum: int, frame: Any) -> None:
            if driver.stop_requested is not None:  # the second one: at once
                for sig, old in previous.items():
                    signal.signal(sig, old)
                raise KeyboardInterrupt
            driver.stop_requested = signal.Signals(signum).name
            print(
                f"\n{PREFIX} {driver.stop_requested}: stopping at the next step boundary to write a checkpoint, "
                "the summary and the report (Ctrl-C again to stop at once, losing the steps since the last "
                "checkpoint)",
                file=sys.stderr,
                flush=True,
            )

        for sig in signals:
            signal.signal(sig, handler)
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

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
