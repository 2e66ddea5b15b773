"""Checkpoints: everything needed to continue a run exactly where it stopped.

Layout of `<run_dir>/checkpoints/step-000010/`:
  model/                HF safetensors + tokenizer (what samplers and learners load on resume)
  model/deepspeed/      DeepSpeed optimiser state (torch files written by DeepSpeed; for resuming
                        your own runs, not for sharing; share `model/` only)
  replay/shard-<i>.parquet[.ready]   each shard's pool and its queue of finished groups
  driver.json           data position, RNG state, policy version, delayed-start flag, pending plans

A checkpoint is written under `.tmp-step-000010` and renamed when complete, so a driver killed
mid-write leaves the previous checkpoint as the latest loadable one. The last
`trainer.keep_checkpoints` are kept.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import ray

PREFIX = "step-"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (temporary directories of interrupted writes are ignored)."""
    root = checkpoint_dir(run_dir)
    done = sorted(p for p in root.glob(f"{PREFIX}*") if (p / "driver.json").exists()) if root.exists() else []
    return done[-1] if done else None


def save_checkpoint(run_dir: Path, *, driver: Any, learners: Any, replay: Any, model_path: str,
                    keep: int) -> tuple[Path, float]:
    """Drain in-flight requests, then write the checkpoint atomically. Returns (path, seconds)."""
    from exgrpo.run import copy_tokenizer

    t0 = time.perf_counter()
    driver.drain()
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"{PREFIX}{driver.step:06d}"
    tmp, final = root / f".tmp-{name}", root / name
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "replay").mkdir(parents=True)
    learners.save(path=str(tmp / "model"))
    copy_tokenizer(model_path, tmp / "model")
    ray.get([s.snapshot.remote(path=str(tmp / "replay" / f"shard-{i}.parquet")) for i, s in enumerate(replay.shards)])
    (tmp / "driver.json").write_text(json.dumps(driver.state_dict()))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(p for p in root.glob(f"{PREFIX}*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final, time.perf_counter() - t0


def restore_checkpoint(ckpt: Path, *, driver: Any, learners: Any, replay: Any) -> None:
    """Load a checkpoint into freshly started actors and a fresh driver (samplers get weights next)."""
    learners.load(path=str(ckpt / "model"))
    shards = sorted((ckpt / "replay").glob("shard-*.parquet"))
    if len(shards) != len(replay.shards):
        raise ValueError(f"{ckpt} holds {len(shards)} replay shards but the config starts {len(replay.shards)}; "
                         "resume with the same replay.num_shards (questions are routed by hash(qid) % shards)")
    ray.get([s.restore.remote(path=str(ckpt / "replay" / f"shard-{i}.parquet")) for i, s in enumerate(replay.shards)])
    driver.load_state_dict(json.loads((ckpt / "driver.json").read_text()))
    replay.set_collect(on=driver.delayed_start.started)
