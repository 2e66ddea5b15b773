"""The README's run command, as a user types it: `python -m exgrpo.run` (shortened) and its outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def run_cli(tmp_path, *overrides, timeout=600):
    cmd = [sys.executable, "-m", "exgrpo.run", f"logging.run_dir={tmp_path / 'run'}", "logging.progress=false",
           *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)  # any working dir


def test_default_run_smoke(tmp_path):
    out = run_cli(tmp_path, "trainer.steps=3", "trainer.eval_every=0", "data.num_eval=16", "trainer.checkpoint_every=2")
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["eval_accuracy_before"] is not None
    assert "held-out accuracy after" in out.stdout
    for plot in ("reward", "buckets", "staleness", "eval_accuracy"):
        assert (run / "plots" / f"{plot}.png").stat().st_size > 1000
    assert (run / "final" / "model.safetensors").exists() and (run / "final" / "tokenizer.json").exists()
    assert (run / "checkpoints" / "step-000002" / "driver.json").exists()


def test_bad_config_fails_before_starting_anything(tmp_path):
    out = run_cli(tmp_path, "replay.rho=2")
    assert out.returncode == 2 and "replay.rho=2.0 must lie in [0, 1]" in out.stderr


@pytest.mark.slow
def test_full_default_run_improves_heldout_accuracy(tmp_path):
    out = run_cli(tmp_path, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["wall_s"] < 600
    assert summary["eval_accuracy_after"] > summary["eval_accuracy_before"] + 0.02


@pytest.mark.slow
def test_compare_experiment_small(tmp_path):
    cmd = [sys.executable, "-m", "exgrpo.experiments.compare", "--variants", "exgrpo", "grpo", "--seeds", "0", "1",
           "--out", str(tmp_path / "cmp"), "trainer.steps=4", "trainer.eval_every=2", "data.num_eval=16"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "cmp" / "results.json").read_text())
    assert {(r["variant"], r["seed"]) for r in results} == {("exgrpo", 0), ("grpo", 0), ("exgrpo", 1), ("grpo", 1)}
    assert all(len(r["curve"]) == 3 for r in results)  # before, step 2, step 4
    assert "| exgrpo |" in (tmp_path / "cmp" / "table.md").read_text()
    assert (tmp_path / "cmp" / "curves.png").stat().st_size > 1000
