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
import ray

from exgrpo.checkpoint import latest_checkpoint, restore_checkpoint, save_checkpoint
from exgrpo.config import load_config
from exgrpo.data.sources import load_prompts
from exgrpo.driver import Driver
from exgrpo.run import build_system

pytestmark = pytest.mark.integration

# One sampler and eta = 0 make generation deterministic (same seeds, same batch composition).
DETERMINISTIC = [
    "trainer.questions_per_step=4", "trainer.rollouts_per_question=4",
    "replay.start_solve_ratio=0.0", "replay.num_shards=2", "samplers.num=1", "samplers.requests_per_call=2",
    "async.max_staleness=0", "learners.lr=1e-3", "learners.micro_batch_size=32", "model.max_response_len=12",
    "logging.progress=false", "logging.plots=false", "trainer.eval_samples=1",
]


@pytest.fixture(scope="module")
def model_path(warm_model):
    return warm_model


def _train(cfg, model_path, run_dir, *, resume_from=None):
    train, evaluation = load_prompts(cfg)
    system = build_system(cfg, model_path=str(resume_from / "model") if resume_from else model_path)
    qids: list[list[str]] = []

    def checkpointer(drv):
        save_checkpoint(run_dir, driver=drv, learners=system.learners, replay=system.replay,
                        model_path=model_path, keep=2)

    driver = Driver(cfg=cfg, samplers=system.samplers, replay=system.replay, learners=system.learners,
                    train=train, evaluation=evaluation, checkpointer=checkpointer,
                    on_batch=lambda b: qids.append([g.qid for g in b.groups]))
    try:
        if resume_from is not None:
            restore_checkpoint(resume_from, driver=driver, learners=system.learners, replay=system.replay)
            driver.broadcast()
        driver.train()
        tables = []
        for i, s in enumerate(system.replay.shards):
            path = run_dir / f"final-shard-{i}.parquet"
            ray.get(s.snapshot.remote(path=str(path)))
            tables.append(pq.read_table(path))
        retired = system.replay.retired()
        checksum = system.learners.checksums()[0]
    finally:
        system.shutdown()
    return qids, tables, retired, checksum


def test_resume_matches_uninterrupted_run(ray_cluster, tmp_path, model_path, single_digit_data):
    data = [f"data.train={single_digit_data['train']}", f"data.eval={single_digit_data['eval']}"]
    full = load_config(None, [*DETERMINISTIC, *data, "trainer.steps=4"])
    half = load_config(None, [*DETERMINISTIC, *data, "trainer.steps=2"])
    qids_full, tables_full, retired_full, sum_full = _train(full, model_path, tmp_path / "full")
    qids_a, _, _, _ = _train(half, model_path, tmp_path / "split")
    ckpt = latest_checkpoint(tmp_path / "split")
    assert ckpt is not None and ckpt.name == "step-000002"
    qids_b, tables_split, retired_split, sum_split = _train(full, model_path, tmp_path / "split", resume_from=ckpt)
    assert qids_a + qids_b == qids_full  # same data order
    assert retired_split == retired_full
    for a, b in zip(tables_full, tables_split, strict=True):  # same replay contents
        assert a.equals(b)
    assert sum_split == pytest.approx(sum_full, rel=1e-6)


def test_killed_checkpoint_writer_leaves_previous_loadable(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "exgrpo.run", "--config", "tiny-cpu", f"logging.run_dir={run_dir}",
           "trainer.steps=500", "trainer.checkpoint_every=1", "trainer.keep_checkpoints=3", "logging.progress=false",
           "data.num_train=200"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
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
