"""bench/learner/device_check.py's default parts (issue 41's GPU questions: export, memory, slicing, sdpa) on
CPU: the --cpu-smoke run end to end, and the carried vLLM files (bench/learner/carry_vllm.py) standing in for
vLLM as they must on the device, which has none. The figures are not checked (a CPU run of tiny sizes
measures nothing); the logic and the report's shape are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.learner.device_shapes import QWEN7B, SMOKE, response_lengths  # noqa: E402
from bench.learner.device_slicing import MODES  # noqa: E402
from exgrpo.runtime.memory_plan import learner_peak  # noqa: E402


@pytest.mark.slow  # 43 s in CI: a benchmark's smoke run, not the product
def test_cpu_smoke_of_the_gpu_questions(tmp_path):
    out = tmp_path / "dc.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.learner.device_check", "--cpu-smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.exists(), log
    report = json.loads(out.read_text())
    assert report["errors"] == {} and set(report["parts"]) == {"export", "memory", "slicing", "sdpa"}, log
    stages = report["parts"]["export"]["stages"]
    assert set(stages) == {"zero2", "zero3"}
    for res in stages.values():
        assert res["bytes_equal"] is True and res["differing"] == [] and res["missing"] == []
        assert res["received_bytes"] == res["pushed_bytes"] == res["state_dict_bytes"] > 0
        assert res["chunks"] == res["loopback_chunks"] > 1  # several packed buffers
        assert ".vllm_carry" in res["vllm_packed_tensor"]  # the smoke imports what the device imports
        assert len(res["push_s"]) == 2 and res["extra_peak_gib"] is None  # CPU: no allocator statistics
    mem = report["parts"]["memory"]
    assert mem["learner_config"]["zero_stage"] == 3  # the 7B recipe's
    assert mem["learner_config"]["max_tokens_per_micro_batch"] == SMOKE.token_budget
    assert mem["plan_total_bytes"] == learner_peak(mem["plan_terms_bytes"]) > 0
    assert {"weights", "optimizer", "activations", "logits"} <= set(mem["plan_terms_bytes"])
    assert (
        len(mem["updates"]) == 2
        and mem["updates"][0]["longest"] == SMOKE.max_prompt_len + SMOKE.max_response_len
    )
    sl = report["parts"]["slicing"]
    assert set(sl["modes"]) == set(MODES) and sl["skipped"] == []
    assert max(sl["response_lens"]) <= SMOKE.max_response_len
    for mode in MODES:
        m = sl["modes"][mode]
        assert m["padded_tokens"] >= sl["non_pad_tokens"] and m["non_pad_tokens_per_s"] > 0
    # sorting never adds padding to the count slicing (same row counts per micro-batch)
    assert sl["modes"]["count_sorted"]["padded_tokens"] <= sl["modes"]["count"]["padded_tokens"]
    sdpa = report["parts"]["sdpa"]
    assert sdpa["padded"]["backend"] in ("cpu flash", "math") and sdpa["per_row"]["backend"] in (
        "cpu flash",
        "math",
    )
    assert sdpa["padded"]["non_pad_tokens_per_s"] > 0 and sdpa["per_row"]["non_pad_tokens_per_s"] > 0
    assert "[export] ZeRO-3" in log and "[memory] plan (GiB)" in log and "[sdpa] per_row" in log


def test_the_carried_vllm_files_serve_the_export_path():
    """With the carried folder first on sys.path (as on the device), every vLLM module the export path
    imports (exgrpo.transport.vllm_api's LearnerSource, vLLM's packed producer/consumer) is a carried one."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from bench.learner.carry_vllm import CARRY, carry, ensure_vllm\n"
        "carry() if not (CARRY / 'vllm').exists() else None\n"
        "pt = ensure_vllm(prefer_carry=True)\n"
        "from exgrpo.transport.vllm_api import LearnerSource\n"
        "assert callable(pt.packed_nccl_broadcast_producer) and callable(pt.packed_nccl_broadcast_consumer)\n"
        "mods = {n: getattr(m, '__file__', None) for n, m in sys.modules.items() if n.split('.')[0] == 'vllm'}\n"
        "bad = {n: f for n, f in mods.items() if f is None or str(CARRY) not in f}\n"
        "assert not bad, bad\n"
        "print(len(mods))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert int(proc.stdout.strip().splitlines()[-1]) >= 8


def test_long_tailed_lengths_are_capped():
    lengths = response_lengths(QWEN7B, 2000, seed=0)
    assert max(lengths) == QWEN7B.max_response_len  # the tail reaches the cap at this spread
    assert min(lengths) >= 1 and sorted(lengths)[1000] < 2 * QWEN7B.median_response
