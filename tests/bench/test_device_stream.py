"""bench/learner/device_check.py's stream part (bench/learner/device_stream.py) on CPU: vLLM's carried packed
producer reads a weight right after an SGD step, with and without `WeightPusher.wait_for_step`. On CPU every
kernel runs in order, so both modes must send the stepped weight and no race can show: the logic only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_smoke_of_the_stream_part(tmp_path):
    out = tmp_path / "dc.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.learner.device_check",
            "--cpu-smoke",
            "--parts",
            "stream",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.exists(), log
    report = json.loads(out.read_text())
    assert report["errors"] == {}, log
    part = report["parts"]["stream"]
    assert part["size"] == 256 and set(part["modes"]) == {"wait", "no_wait"}
    assert part["modes"]["wait"]["equal"] == [True] * 3 and part["wait_ok"] is True
    assert part["modes"]["no_wait"]["equal"] == [True] * 3 and part["race_seen"] is False
    assert "[stream] 256x256 fp32" in log
