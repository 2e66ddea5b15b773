"""Checkpoints: everything needed to continue a run exactly where it stopped. Imports no Ray.

A checkpoint (`<run_dir>/checkpoints/step-N/`: model/, replay/, driver.json, config.json) goes through the role
verbs only and is written under a temporary name, then renamed by the driver once every rank wrote its part, so
the latest complete one is always loadable; the last `keep` are kept. `resume_checkpoint` refuses a run dir with
none, a finished run and a config whose meaning differs (outside `HARMLESS_KEYS`); a run stopped by a dead actor
raises `RunInterrupted` with the `--resume` command. More: docs/architecture.md ("Checkpoints, evaluation,
experiments", "Learner and driver death"); tests: tests/exgrpo/loop/test_checkpoint.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

from exgrpo.core.config import Config
from exgrpo.core.fileio import atomic_path, atomic_write_text
from exgrpo.loop.driver import Driver

log = logging.getLogger(__name__)

PREFIX = "step-"
TOKENIZER_FILES = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges")
CONFIG_FILE = "config.json"
BASE_MODEL_FILE = "base_model.json"  # the base model a run started from (a hub id: repo, revision, commit)

# Settings a resume may change: they size, pace, place or report the run but do not change what it
# trains. Everything else (K, B, shards, model, data, algorithm, seeds, learner count) must match.
HARMLESS_KEYS = frozenset(
    {
        "logging.*",
        "model.cache_dir",
        "trainer.steps",
        "trainer.eval_every",
        "trainer.eval_samples",
        "trainer.checkpoint_every",
        "trainer.keep_checkpoints",
        "trainer.max_failures",
        "samplers.num",
        "samplers.num_cpus",
        "samplers.num_gpus",
        "samplers.requests_per_call",
        "samplers.verify_timeout_s",
        "samplers.gpu_memory_utilization",
        "learners.num_cpus",
        "learners.num_gpus",
        "learners.micro_batch_size",
        "data.eval",
        "data.num_eval",
        "replay.wal",
        "replay.shard_max_restarts",
        "replay.wal_compact_mb",
        "replay.shard_concurrency",
    }
)


class ResumeError(ValueError):
    """A resume that cannot continue the run it names; the message says why and what to do."""


class RunInterrupted(RuntimeError):
    """A run stopped by the death of a learner, replay shard or the controller; the message names the resume
    command. `what` says what died ("learner exgrpo-learner-0 died"), `step` is the next step the run would
    have trained (the number of steps trained)."""

    def __init__(
        self, message: str, *, run_dir: Path, checkpoint: Path | None, what: str = "", step: int = -1
    ) -> None:
        super().__init__(message)
        self.run_dir, self.checkpoint = run_dir, checkpoint
        self.what, self.step = what, step


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (temporary directories of interrupted writes are ignored)."""
    root = checkpoint_dir(run_dir)
    done = sorted(p for p in root.glob(f"{PREFIX}*") if (p / "driver.json").exists()) if root.exists() else []
    return done[-1] if done else None


def checkpoint_step(ckpt: Path) -> int:
    return int(Path(ckpt).name[len(PREFIX) :])


def flat_config(cfg: Config | dict[str, Any]) -> dict[str, Any]:
    """{"trainer.steps": 20, ...} with JSON values (tuples as lists)."""
    data = cfg.to_dict() if isinstance(cfg, Config) else cfg
    return {
        f"{sec}.{key}": value
        for sec, values in json.loads(json.dumps(data)).items()
        for key, value in (values or {}).items()
    }


def harmless(key: str) -> bool:
    return key in HARMLESS_KEYS or f"{key.split('.')[0]}.*" in HARMLESS_KEYS


def config_fingerprint(cfg: Config | dict[str, Any]) -> str:
    """sha256 (16 hex) of the settings that define the run (every key outside HARMLESS_KEYS)."""
    meaning = {k: v for k, v in sorted(flat_config(cfg).items()) if not harmless(k)}
    return hashlib.sha256(json.dumps(meaning, sort_keys=True).encode()).hexdigest()[:16]


def config_differences(stored: dict[str, Any], cfg: Config, *, include_harmless: bool = False) -> list[str]:
    """'key: checkpoint value -> new value' for every meaningful key that differs (and with
    `include_harmless`, every key in HARMLESS_KEYS that differs too).

    Keys the checkpoint does not know (fields added to the code since it was written) are not compared.
    """
    old, new = flat_config(stored), flat_config(cfg)
    return [
        f"{k}: {old[k]!r} -> {new[k]!r}"
        for k in sorted(new)
        if k in old and (include_harmless or not harmless(k)) and old[k] != new[k]
    ]


def resume_checkpoint(run_dir: Path, cfg: Config) -> Path:
    """The checkpoint `--resume run_dir` continues from, after checking it can continue `cfg`."""
    run_dir = Path(run_dir)
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        if not run_dir.is_dir():
            raise ResumeError(f"cannot resume {str(run_dir)!r}: no such run directory")
        raise ResumeError(
            f"cannot resume {str(run_dir)!r}: it holds no complete checkpoint under "
            f"{checkpoint_dir(run_dir)} (the run stopped before its first one; start it again)"
        )
    step = checkpoint_step(ckpt)
    meta_file = ckpt / CONFIG_FILE
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        diffs = config_differences(meta["config"], cfg)
        if diffs:
            raise ResumeError(
                f"cannot resume {str(run_dir)!r} from {ckpt.name} with a different config; these settings "
                f"change what the run trains:\n  - "
                + "\n  - ".join(diffs)
                + "\nresume with the checkpoint's values (drop those overrides), or start a new run in another "
                "logging.run_dir; harmless overrides (e.g. trainer.steps, samplers.num, logging.*) are allowed"
            )
    else:
        log.warning(
            "%s has no %s (written by an older version); the config is not checked", ckpt, CONFIG_FILE
        )
    if step >= cfg.trainer.steps:
        raise ResumeError(
            f"run {str(run_dir)!r} already finished {step} steps; pass trainer.steps=M>{step} to "
            f"continue, e.g. python -m exgrpo.run --resume {run_dir} trainer.steps={2 * step}"
        )
    return ckpt


def resume_report(run_dir: Path, cfg: Config) -> str:
    """What `--resume run_dir` with `cfg` would do (`python -m exgrpo.run --dry-run --resume`), checked as
    the resume itself checks (`resume_checkpoint`, then the checkpoint's model directory that the actors
    load) without starting anything: the checkpoint, the steps, and every setting that changes."""
    ckpt = resume_checkpoint(run_dir, cfg)
    if not (ckpt / "model").is_dir():
        raise ResumeError(
            f"cannot resume {str(run_dir)!r} from {ckpt.name}: it has no model/ directory (an incomplete "
            "checkpoint); start the run again in another logging.run_dir"
        )
    lines = [f"resume {run_dir} from {ckpt.name}: steps {checkpoint_step(ckpt)} -> {cfg.trainer.steps}"]
    meta_file = ckpt / CONFIG_FILE
    if not meta_file.is_file():
        return "\n".join([*lines, f"  the config is not checked: {ckpt.name} has no {CONFIG_FILE}"])
    changes = config_differences(json.loads(meta_file.read_text())["config"], cfg, include_harmless=True)
    lines += [f"  changes (each allowed on resume): {len(changes)}" if changes else "  no setting changes"]
    return "\n".join([*lines, *(f"  - {c}" for c in changes)])


def rewind_metrics(run_dir: Path, step: int) -> int:
    """Drop metrics.jsonl records of steps >= `step` (trained after the checkpoint, trained again on
    resume) and any torn last line; returns how many lines were dropped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] >= step:
            dropped += 1
            continue
        kept.append(line)
    if dropped:
        atomic_write_text(path, "".join(f"{line}\n" for line in kept))
    return dropped


def fresh_run_dir_check(cfg: Config, *, recovery: bool = False) -> None:
    """A fresh run must not write over another run's checkpoints (it would rotate them away), nor add its
    records to the `metrics.jsonl` of an earlier run that left no checkpoint (stopped before its first one, or
    run with checkpoints off): the two runs' steps would read as one run. `recovery`: a restart inside the same
    job, which goes on with its own records."""
    if not cfg.logging.run_dir:
        return None
    run_dir = Path(cfg.logging.run_dir).expanduser()
    old = latest_checkpoint(run_dir)
    if old is not None:
        raise ResumeError(
            f"{str(run_dir)!r} already holds the checkpoint {old.name} of an earlier run; continue it "
            f"with python -m exgrpo.run --resume {run_dir}, or choose another logging.run_dir"
        )
    records = run_dir / "metrics.jsonl"
    if not recovery and records.is_file() and records.stat().st_size > 0:
        raise ResumeError(
            f"{str(run_dir)!r} already holds the records of an earlier run ({records.name}) and no checkpoint "
            "to continue it from; choose another logging.run_dir, or move that directory away"
        )
    return None


def dead_actor(error_text: str) -> str:
    """'learner exgrpo-learner-0 died' from a Ray actor error's text (which names the actor)."""
    match = re.search(r"exgrpo-(learner|replay|sampler|controller)(-\d+)?", error_text)
    if match is None:
        return "a Ray actor of the run died"
    role = {"replay": "replay shard"}.get(match.group(1), match.group(1))
    return f"{role} {match.group(0)} died"


def interrupted_message(run_dir: Path, *, what: str, step: int, why: str = "") -> str:
    """The message of a run stopped by a dead learner, shard or controller: which checkpoint, which command;
    `why` (e.g. "trainer.max_failures=1 reached") says why it was not recovered inside the job."""
    ckpt = latest_checkpoint(run_dir)
    because = f" ({why})" if why else ""
    if ckpt is None:
        return (
            f"{what} at step {step}; the run stopped{because}; no checkpoint was written yet, so nothing "
            f"can be resumed: start the run again (lower trainer.checkpoint_every to checkpoint sooner)"
        )
    return (
        f"{what} at step {step}; the run stopped{because}. Resume it from {ckpt} (step "
        f"{checkpoint_step(ckpt)}) with:\n  python -m exgrpo.run --resume {run_dir}"
    )


RESUMED_MODEL = "resumed-model"  # under the run dir: the weights a resumed run's actors start from


def pin_model(checkpoint: Path, run_dir: Path) -> Path:
    """The model files of `checkpoint/model` (weights, config, tokenizer; not the optimiser state) at
    `<run_dir>/resumed-model`, hard-linked (copied across filesystems), replacing an earlier pin.

    A resumed run's samplers and learners load from here, not from the checkpoint: checkpoint rotation
    later deletes `checkpoints/step-N`, and every sampler started after that (a replacement, a scale-up)
    would otherwise find no weights. Hard links cost no space and keep the bytes alive after the rotation.
    """
    source = checkpoint / "model"
    if not source.is_dir():
        raise FileNotFoundError(f"checkpoint {checkpoint} has no model/ directory")
    with atomic_path(run_dir / RESUMED_MODEL, directory=True) as tmp:
        for f in sorted(source.iterdir()):
            if f.is_file():
                try:
                    (tmp / f.name).hardlink_to(f)
                except OSError:
                    shutil.copy2(f, tmp / f.name)
    return run_dir / RESUMED_MODEL


def tokenizer_files(model_path: str | Path) -> dict[str, bytes]:
    """The tokenizer files of a model directory, read once: a resumed run's model directory lies inside a
    checkpoint that the run itself later rotates away, so the files must not be read from it again."""
    return {
        f.name: f.read_bytes()
        for f in sorted(Path(model_path).iterdir())
        if f.is_file() and f.name.startswith(TOKENIZER_FILES)
    }


def copy_tokenizer(source: str | Path | dict[str, bytes], out_dir: Path) -> None:
    """Make a saved model directory self-contained (engines and evaluation load the tokenizer from it);
    `source` is a model directory or what `tokenizer_files` read from one."""
    files = source if isinstance(source, dict) else tokenizer_files(source)
    for name, data in files.items():
        (Path(out_dir) / name).write_bytes(data)


class Checkpointer:
    """`checkpointer(driver)` drains in-flight requests and writes one checkpoint atomically."""

    def __init__(
        self, run_dir: Path, *, model_path: str, keep: int, base_model: dict[str, Any] | None = None
    ) -> None:
        self.root = checkpoint_dir(run_dir)
        self.model_path = model_path
        self.base_model = base_model  # written as base_model.json (a hub id's repo, revision and commit)
        self.tokenizer = tokenizer_files(model_path)
        self.keep = max(1, keep)
        self.seconds: list[float] = []  # time of every write (for the overhead figure)

    def __call__(self, driver: Driver) -> Path:
        t0 = time.perf_counter()
        driver.drain()
        final = self.root / f"{PREFIX}{driver.step:06d}"
        with atomic_path(final, directory=True) as tmp:
            driver.learners.save(path=str(tmp / "model"))
            if not (tmp / "model").is_dir() or not any((tmp / "model").iterdir()):  # written on another disk
                raise RuntimeError(
                    f"the learners saved into {tmp / 'model'} but the driver sees no weights there: on a "
                    "cluster logging.run_dir must be on storage every node shares (docs/operating.md, 'Two nodes')"
                )
            copy_tokenizer(self.tokenizer, tmp / "model")
            driver.replay.snapshot(path=str(tmp / "replay"))
            (tmp / CONFIG_FILE).write_text(
                json.dumps(
                    {"fingerprint": config_fingerprint(driver.cfg), "config": driver.cfg.to_dict()}, indent=1
                )
            )
            (tmp / "driver.json").write_text(json.dumps(driver.state_dict()))
            if self.base_model is not None:
                (tmp / BASE_MODEL_FILE).write_text(json.dumps(self.base_model, indent=1))
        for old in sorted(self.root.glob(f"{PREFIX}*"))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        self.seconds.append(time.perf_counter() - t0)
        return final


def restore_checkpoint(ckpt: Path, *, driver: Driver) -> None:
    """Load a checkpoint into freshly started roles and a fresh driver, then publish its weights."""
    driver.learners.load(path=str(ckpt / "model"))
    driver.replay.restore(path=str(ckpt / "replay"))
    driver.load_state_dict(json.loads((ckpt / "driver.json").read_text()))  # Replay collects as it did
    # the samplers loaded the checkpoint's model: tag its version
    driver.weights.broadcast(version=driver.version)
