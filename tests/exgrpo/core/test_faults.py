"""exgrpo.core.faults: the spec's grammar, the hard death at the named hit, fire-once markers, targeting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo.core import faults

ROOT = Path(__file__).resolve().parents[3]
# three arrivals at sampler.generate, printing after each one it survives
PROGRAM = """
from exgrpo.core.faults import fault_point
for i in range(3):
    fault_point("sampler.generate")
    print(i, flush=True)
"""


def run(spec: str, directory: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        faults.FAULTS_VAR: spec,
        faults.FAULTS_DIR_VAR: str(directory),
    }
    return subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=60
    )


def test_parse_reads_actor_point_and_hit():
    got = faults.parse("exgrpo-sampler-1:sampler.generate@2, shard.take.logged")
    assert got == [
        faults.Fault(
            entry="exgrpo-sampler-1:sampler.generate@2", point="sampler.generate", actor="sampler-1", hit=2
        ),
        faults.Fault(entry="shard.take.logged", point="shard.take.logged", actor=None, hit=1),
    ]


@pytest.mark.parametrize("spec", ["sampler.generat", "sampler.generate@0", "sampler.generate@x"])
def test_a_bad_entry_is_refused(spec):
    with pytest.raises(faults.FaultSpecError):
        faults.parse(spec)


def test_an_armed_point_needs_its_marker_directory(monkeypatch):
    monkeypatch.setenv(faults.FAULTS_VAR, "sampler.generate")
    monkeypatch.delenv(faults.FAULTS_DIR_VAR, raising=False)
    with pytest.raises(faults.FaultSpecError, match=faults.FAULTS_DIR_VAR):
        faults.reload()
    monkeypatch.delenv(faults.FAULTS_VAR)
    faults.reload()
    faults.fault_point("sampler.generate")  # unarmed: nothing happens


def test_the_process_dies_at_its_hit_once_and_only_where_targeted(tmp_path):
    first = run("sampler.generate@2", tmp_path)
    assert first.returncode == -signal.SIGKILL and first.stdout.split() == ["0"]
    [marker] = faults.fired(tmp_path)
    assert marker["entry"] == "sampler.generate@2" and marker["actor"] == "driver"
    again = run("sampler.generate@2", tmp_path)  # the marker exists: a second incarnation goes on
    assert again.returncode == 0 and again.stdout.split() == ["0", "1", "2"]
    other = run("sampler-1:sampler.generate@1", tmp_path / "other")  # this process is not sampler-1
    assert other.returncode == 0 and faults.fired(tmp_path / "other") == []


def test_fault_env_copies_only_what_is_set(monkeypatch, tmp_path):
    monkeypatch.delenv(faults.FAULTS_VAR, raising=False)
    monkeypatch.delenv(faults.FAULTS_DIR_VAR, raising=False)
    assert faults.fault_env() == {}
    monkeypatch.setenv(faults.FAULTS_VAR, "learner.save")
    monkeypatch.setenv(faults.FAULTS_DIR_VAR, str(tmp_path))
    assert faults.fault_env() == {faults.FAULTS_VAR: "learner.save", faults.FAULTS_DIR_VAR: str(tmp_path)}


def test_a_hang_or_sleep_action_blocks_the_caller_instead_of_killing_it(tmp_path):
    [hang, sleep] = faults.parse("sampler.update_weights@2!hang, sampler-0:sampler.generate!sleep1.5")
    assert (hang.hang, hang.sleep_s, hang.hit) == (True, 0.0, 2) and "!" not in hang.entry
    assert (sleep.hang, sleep.sleep_s, sleep.actor) == (False, 1.5, "sampler-0")
    with pytest.raises(faults.FaultSpecError, match="unknown action 'nap'"):
        faults.parse("sampler.generate!nap")
    out = run("sampler.generate@2!sleep1", tmp_path / "a")  # sleeps at the second arrival, then goes on
    assert out.returncode == 0 and out.stdout.split() == ["0", "1", "2"]
    assert [r["entry"] for r in faults.fired(tmp_path / "a")] == ["sampler.generate@2-sleep1"]
    with pytest.raises(subprocess.TimeoutExpired):  # blocks at the second arrival, for good
        env = {**os.environ, "PYTHONPATH": str(ROOT), faults.FAULTS_VAR: "sampler.generate@2!hang"}
        env[faults.FAULTS_DIR_VAR] = str(tmp_path / "b")
        subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, timeout=5)
