"""What one start of a job is built from besides its actors: its reward checked, the model it loads,
its prompts and its observers.

`start_model` drops the metrics of the steps a resumed start trains again, pins a resumed start's
checkpoint weights in the run directory (rotation deletes the checkpoint later), records the base model
and reads the tokenizer once; `run_observers` builds what watches the run beside the logger and the
progress bar (the sample log, the candidate log, the caller's observer).
The training recipe (`exgrpo.runtime.recipe`) calls these from its `setup` stage.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exgrpo.core.config import Config, ConfigError
from exgrpo.core.roles import RunObserver
from exgrpo.loop.observer import Observers
from exgrpo.reporting.console import Progress
from exgrpo.reporting.loggers import CandidateLog, MetricsLogger
from exgrpo.reporting.samples import SampleLog
from exgrpo.runtime.healing import Job

if TYPE_CHECKING:
    from exgrpo.core.records import Prompt

log = logging.getLogger("exgrpo")


def check_reward(cfg: Config) -> None:
    """Import `reward.fn` here, in the driver, so a bad spec fails with its reason before any actor starts."""
    from exgrpo.verify.plugin import RewardError, resolve
    from exgrpo.verify.rewards import MATH

    if cfg.reward.fn != MATH:
        try:
            resolve(cfg.reward.fn)
        except RewardError as err:
            raise ConfigError(str(err)) from err


@dataclass(frozen=True)
class StartModel:
    """The weights one start loads and what the run records of them."""

    path: str  # the model directory every actor loads (a resumed start: its pinned checkpoint)
    base_model: dict[str, Any]  # the base model's record (base_model.json)
    tokenizer: dict[str, bytes]  # the tokenizer files, read once


def start_model(
    cfg: Config, *, ckpt: Path | None, fresh_model: str | None, run_dir: Path, recovery: int, job: Job
) -> StartModel:
    """The model a start loads: `fresh_model` (a fresh run's, resolved before its run dir was made) or the
    checkpoint `ckpt` pinned in `run_dir`; the metrics of the steps trained again are dropped first, and
    `learners.lora_target_modules` is checked against the model's layers."""
    from exgrpo.loop.checkpoint import (
        BASE_MODEL_FILE,
        checkpoint_step,
        pin_model,
        rewind_metrics,
        tokenizer_files,
    )
    from exgrpo.models.resolve import model_record, resolve_model

    # the steps trained again: after the checkpoint, or all (the first evaluation too) when a recovery
    # restarts at step 0 over this job's own run dir
    again = checkpoint_step(ckpt) if ckpt is not None else -1 if recovery else None
    if again is not None and (dropped := rewind_metrics(run_dir, again)):
        log.info("metrics.jsonl: dropped %d records of steps >= %d (they are trained again)", dropped, again)
    job.rewind(max(again or 0, 0))
    # a resumed run starts from its checkpoint's weights, pinned in the run dir: rotation deletes the checkpoint
    if fresh_model is not None:
        model_path = fresh_model
    elif ckpt is not None:
        model_path = str(resolve_model(str(pin_model(ckpt, run_dir)), cache_dir=cfg.model.cache_dir))
    else:
        raise ValueError("start_model needs a fresh run's model or a checkpoint to resume from")
    base_model: dict[str, Any] = model_record(cfg.model.path, model_path)  # a hub id: repo, revision, commit
    if ckpt is None:
        (run_dir / BASE_MODEL_FILE).write_text(json.dumps(base_model, indent=1))
    elif (run_dir / BASE_MODEL_FILE).is_file():
        base_model = json.loads((run_dir / BASE_MODEL_FILE).read_text())
    tokenizer = tokenizer_files(model_path)
    if cfg.learners.lora_rank > 0:  # before Ray: a target that matches nothing fails here, naming the choices
        from exgrpo.runtime.preflight import check_lora_targets

        check_lora_targets(Path(model_path), cfg.learners.lora_target_modules)
    return StartModel(path=model_path, base_model=base_model, tokenizer=tokenizer)


def run_observers(
    cfg: Config,
    *,
    run_dir: Path,
    logger: MetricsLogger,
    progress: Progress,
    train_set: list[Prompt],
    job: Job,
    caller: RunObserver | None,
) -> Observers:
    """The run's observers, in order: the logger, the progress bar, the sample log (every
    `logging.samples_every` steps), the candidate log, the job, the caller's."""
    candidates = CandidateLog(run_dir / "candidates.jsonl")
    lc = cfg.logging
    samples = (
        SampleLog(
            run_dir / "samples.jsonl",
            questions={p.qid: p.question for p in train_set},
            every=lc.samples_every,
            per_step=lc.samples_per_step,
            sink=logger.log_samples,
        )
        if lc.samples_every and lc.samples_per_step
        else None
    )
    return Observers(logger, progress, samples, candidates, job, caller)


def start_prompts(cfg: Config, *, model_path: str, run_dir: Path) -> tuple[list[Prompt], list[Prompt], int]:
    """The train and held-out prompts under model.max_prompt_len and data.long_prompts, and how many were
    left out (data.long_prompts=skip)."""
    from exgrpo.data.sources import load_prompts
    from exgrpo.runtime.preflight import enforce_prompt_lengths

    train_set, eval_set = load_prompts(cfg)
    # model.max_prompt_len under data.long_prompts, before any engine sees a prompt
    kept_train, kept_eval, skipped = enforce_prompt_lengths(cfg, model_path, train_set, eval_set)
    if skipped:
        log.warning("%s", skipped)
    log.info(
        "run dir %s; model %s; %d train / %d eval questions",
        run_dir.resolve(),  # absolute: a submitted job (RAY_ADDRESS) runs in Ray's copy of the working dir
        model_path,
        len(kept_train),
        len(kept_eval),
    )
    return kept_train, kept_eval, len(train_set) + len(eval_set) - len(kept_train) - len(kept_eval)
