"""Ctrl-C keeps the work, end to end: SIGINT to the run's whole process group (what a terminal's Ctrl-C sends)
after a few steps; the run stops at the next step boundary with a checkpoint, the summary, the report and the
resume command (exit 130), and the resume trains the remaining steps: no step lost, none twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _steps(run) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def test_ctrl_c_checkpoints_reports_and_the_resume_loses_no_step(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "exgrpo.run", "--config", "tiny-cpu", "trainer.steps=8",
           "trainer.checkpoint_every=10", f"logging.run_dir={run}", "logging.progress=false"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 600
    while len([s for s in _steps(run) if s >= 0]) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # the whole group, as a terminal does
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err[-3000:]
    done = [s for s in _steps(run) if s >= 0]
    assert 2 <= len(done) < 8 and done == list(range(len(done)))
    assert (run / "checkpoints" / f"step-{len(done):06d}").is_dir()  # the boundary it stopped at
    assert (run / "summary.txt").is_file() and (run / "report.html").is_file()
    assert f"continue with: python -m exgrpo.run --resume {run}" in out
    again = subprocess.run([sys.executable, "-m", "exgrpo.run", "--resume", str(run), "logging.progress=false"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert _steps(run) == [-1, *range(8)]  # every step once
