"""Checkpoint and resume on a real cluster: N steps + resume N == 2N steps; a killed writer is harmless."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from exgrpo.core.config_files import load_config
from exgrpo.loop.checkpoint import latest_checkpoint
from exgrpo.loop.observer import Observer
from exgrpo.runtime.recipe import train

pytestmark = pytest.mark.integration

# One sampler and eta = 0 make generation deterministic (same seeds, same batch composition).
DETERMINISTIC = [
    "trainer.questions_per_step=4",
    "trainer.rollouts_per_question=4",
    "replay.start_solve_ratio=0.0",
    "replay.num_shards=2",
    "samplers.num=1",
    "samplers.requests_per_call=2",
    "async.max_staleness=0",
    "learners.lr=1e-3",
    "learners.micro_batch_size=32",
    "model.max_response_len=12",
    "logging.progress=false",
    "logging.plots=false",
    "trainer.eval_samples=1",
    "trainer.keep_checkpoints=2",
]


@pytest.fixture(scope="module")
def model_path(warm_model):
    return warm_model


class Watch(Observer):
    """The questions of every batch; after the last step, the replay contents and the learner checksum."""

    def __init__(self, run_dir):
        self.run_dir, self.qids, self.final = run_dir, [], None

    def on_batch(self, *, batch):
        self.qids.append(sorted(g.qid for g in batch.groups))

    def on_train_end(self, *, system, driver):
        system.replay.snapshot(path=str(self.run_dir / "final-replay"))
        shards = sorted((self.run_dir / "final-replay").glob("shard-*.parquet"))
        self.final = (
            [pq.read_table(p) for p in shards],
            system.replay.retired(),
            system.learners.checksums()[0],
        )


def _train(cfg, run_dir, *, resume=False):
    watch = Watch(run_dir)
    train(cfg, resume=resume, observer=watch)
    tables, retired, checksum = watch.final
    return watch.qids, tables, retired, checksum


def test_resume_matches_uninterrupted_run(ray_cluster, tmp_path, model_path, single_digit_data):
    data = [
        f"data.train={single_digit_data['train']}",
        f"data.eval={single_digit_data['eval']}",
        f"model.path={model_path}",
    ]
    full_dir, split_dir = tmp_path / "full", tmp_path / "split"
    full = load_config(None, [*DETERMINISTIC, *data, "trainer.steps=4", f"logging.run_dir={full_dir}"])
    half = load_config(None, [*DETERMINISTIC, *data, "trainer.steps=2", f"logging.run_dir={split_dir}"])
    rest = load_config(None, [*DETERMINISTIC, *data, "trainer.steps=4", f"logging.run_dir={split_dir}"])
    qids_full, tables_full, retired_full, sum_full = _train(full, full_dir)
    qids_a, _, _, _ = _train(half, split_dir)
    ckpt = latest_checkpoint(split_dir)
    assert ckpt is not None and ckpt.name == "step-000002"
    qids_b, tables_split, retired_split, sum_split = _train(rest, split_dir, resume=True)
    assert qids_a + qids_b == qids_full  # same data order
    assert retired_split == retired_full
    for a, b in zip(tables_full, tables_split, strict=True):  # same replay contents
        assert a.equals(b)
    assert sum_split == pytest.approx(sum_full, rel=1e-6)


@pytest.mark.slow  # 48 s in CI; resume itself stays in CI (above, and test_learner_death)
def test_killed_checkpoint_writer_leaves_previous_loadable(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "exgrpo.run",
        "--config",
        "tiny-cpu",
        f"logging.run_dir={run_dir}",
        "trainer.steps=500",
        "trainer.checkpoint_every=1",
        "trainer.keep_checkpoints=3",
        "logging.progress=false",
        "data.num_train=200",
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (run_dir / "checkpoints" / "step-000004").exists():
            time.sleep(0.05)
        assert (run_dir / "checkpoints" / "step-000004").exists(), "the run never reached its 4th checkpoint"
        time.sleep(0.137)  # land somewhere inside a later checkpoint write
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    state = json.loads((ckpt / "driver.json").read_text())
    assert state["step"] == int(ckpt.name.split("-")[1])
    from safetensors.numpy import load_file

    assert load_file(ckpt / "model" / "model.safetensors")
    for shard in (ckpt / "replay").glob("shard-*.parquet"):
        pq.read_table(shard)
    # every non-temporary checkpoint directory is complete
    for d in (run_dir / "checkpoints").glob("step-*"):
        assert (d / "driver.json").exists(), f"{d} is incomplete"
    subprocess.run(["pkill", "-9", "-f", str(run_dir)], check=False)
