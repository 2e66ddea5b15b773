"""Checkpoints: everything needed to continue a run exactly where it stopped. Imports no Ray.

Layout of `<run_dir>/checkpoints/step-000010/`:
  model/                HF safetensors + tokenizer (what samplers and learners load on resume)
  model/deepspeed/      DeepSpeed optimiser state (torch files written by DeepSpeed; for resuming
                        your own runs, not for sharing; share `model/` only)
  replay/shard-<i>.parquet[.ready|.seen]   each shard's pool, its finished groups, its pushed ids
  driver.json           data position, RNG states (selection and shuffle), policy version,
                        delayed-start flag, pending plans

Everything goes through the role verbs (`Learners.save/load`, `Replay.snapshot/restore`,
`Driver.state_dict/load_state_dict`). A checkpoint is written under a temporary name and renamed when
complete, so a driver killed mid-write leaves the previous checkpoint as the latest loadable one.
The last `keep` are kept.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from exgrpo.driver import Driver
from exgrpo.fileio import atomic_path

PREFIX = "step-"
TOKENIZER_FILES = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges")


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (temporary directories of interrupted writes are ignored)."""
    root = checkpoint_dir(run_dir)
    done = sorted(p for p in root.glob(f"{PREFIX}*") if (p / "driver.json").exists()) if root.exists() else []
    return done[-1] if done else None


def copy_tokenizer(model_path: str | Path, out_dir: Path) -> None:
    """Make a saved model directory self-contained (engines and evaluation load the tokenizer from it)."""
    for f in Path(model_path).iterdir():
        if f.name.startswith(TOKENIZER_FILES):
            shutil.copy2(f, Path(out_dir) / f.name)


class Checkpointer:
    """`checkpointer(driver)` drains in-flight requests and writes one checkpoint atomically."""

    def __init__(self, run_dir: Path, *, model_path: str, keep: int) -> None:
        self.root = checkpoint_dir(run_dir)
        self.model_path = model_path
        self.keep = max(1, keep)
        self.seconds: list[float] = []  # time of every write (for the overhead figure)

    def __call__(self, driver: Driver) -> Path:
        t0 = time.perf_counter()
        driver.drain()
        final = self.root / f"{PREFIX}{driver.step:06d}"
        with atomic_path(final, directory=True) as tmp:
            driver.learners.save(path=str(tmp / "model"))
            copy_tokenizer(self.model_path, tmp / "model")
            driver.replay.snapshot(path=str(tmp / "replay"))
            (tmp / "driver.json").write_text(json.dumps(driver.state_dict()))
        for old in sorted(self.root.glob(f"{PREFIX}*"))[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        self.seconds.append(time.perf_counter() - t0)
        return final


def restore_checkpoint(ckpt: Path, *, driver: Driver) -> None:
    """Load a checkpoint into freshly started roles and a fresh driver, then publish its weights."""
    driver.learners.load(path=str(ckpt / "model"))
    driver.replay.restore(path=str(ckpt / "replay"))
    driver.load_state_dict(json.loads((ckpt / "driver.json").read_text()))
    driver.replay.set_collect(on=driver.delayed_start.started)
    driver.weights.broadcast(version=driver.version)  # samplers loaded the checkpoint's model; tag its version
