"""bench/learner/device_check.py on CPU: the --cpu-smoke run end to end (the project's DeepSpeed learner and the
broadcast pair), the collective-failure fallback, and that it imports without Ray, DeepSpeed or vLLM (the
H200 has none of them: DeepSpeed travels as a wheel, and the learner part imports it in its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exgrpo.runtime.memory_plan import GIB, learner_peak
from exgrpo.transport.packed import chunk_cuts

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.learner import device_broadcast as dc  # noqa: E402
from bench.learner.gpu_learner import TINY  # noqa: E402


def _run(tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "dc.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.learner.device_check", "--cpu-smoke", "--out", str(out), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert out.exists(), log
    return proc.returncode, json.loads(out.read_text()), log


def _check_transfer(part: dict, nbytes: int) -> None:
    assert part["gb_per_s"] > 0
    assert part["sent_bytes"] == part["received_bytes"] == part["bytes"] == nbytes
    assert part["checksum_match"] is True


def test_cpu_smoke(tmp_path):
    rc, report, log = _run(tmp_path, "--parts", "learner,broadcast")
    assert rc == 0 and report["errors"] == {}, log
    learner = report["parts"]["learner"]
    assert learner["params"] > 0 and learner["dtype"] == "bfloat16"
    assert learner["learner"].startswith("learners.learner.Learner, DeepSpeed ZeRO-2")  # the project's own
    assert learner["gradient_checkpointing"] is True
    assert learner["learner_config"]["gradient_checkpointing"] == "on"
    terms = learner["plan_terms_gib"]
    # the plan's peak: the persistent terms plus the largest phase (exgrpo.runtime.memory_plan.learner_peak)
    want = learner_peak({k: v * GIB for k, v in terms.items()}) / GIB
    assert learner["predicted_gib"] == pytest.approx(want) and terms["optimizer"] > 0
    assert learner["peak_mem_gib"] is None  # CPU: no allocator statistics, so no ratio
    assert learner["peak_over_predicted"] is None
    assert len(learner["step_seconds"]) == 2 and min(learner["step_seconds"]) > 0
    assert learner["tokens_per_s"] > learner["response_tokens_per_s"] > 0
    assert learner["tokens_per_update"] == TINY.groups * TINY.rollouts * (TINY.prompt_len + TINY.response_len)
    assert 0 < learner["mfu"] < learner["mfu_with_attention"] and learner["mfu"] < learner["hfu"]
    assert learner["grad_norm_finite"] and learner["skipped_steps"] == 0
    bc = report["parts"]["broadcast"]
    nbytes = bc["params"] * 2  # bfloat16
    assert bc["params"] == learner["params"]  # the tied embedding once
    assert bc["ran"] == "gloo" and bc["memcpy_floor"]["gb_per_s"] > 0
    coll = bc["collective"]
    _check_transfer(coll, nbytes)
    assert coll["backend"] == "gloo" and coll["chunks"] > 1
    assert coll["checksum"] == coll["checksum_received"]
    assert coll["receiver_seconds"] and min(coll["receiver_seconds"]) > 0
    _check_transfer(bc["ipc"], nbytes)
    assert bc["ipc"]["checksum"] == bc["ipc"]["checksum_sent"] == coll["checksum"]


@pytest.mark.slow
def test_cpu_smoke_equality_part(tmp_path):
    # 12 DeepSpeed learners on CPU (~45 s): the suite checks the same equalities in test_learner.py and
    # test_bf16.py; this checks the part's own logic and report
    rc, report, log = _run(
        tmp_path, "--parts", "equality", "--equality-timeout-s", "800", "--budget-s", "850"
    )
    assert rc == 0 and report["errors"] == {}, log
    eq = report["parts"]["equality"]
    cells = {(c["dtype"], c["zero_stage"], c["logits"]): c for c in eq["cells"]}
    assert len(cells) == 12 and eq["all_ok"]
    assert ("bfloat16", 0, "whole") not in cells  # refused by the config
    assert cells[("float32", 0, "whole")]["max_weight_abs_diff"] == 0  # the reference itself
    assert 0 < cells[("bfloat16", 3, "chunked")]["grad_norm_rel_diff"] < 1e-2


def test_collective_failure_falls_back(tmp_path):
    """A CPU build has no NCCL: the collective pair fails, is reported, and the shared-memory copy stands in."""
    rc, report, log = _run(tmp_path, "--parts", "broadcast", "--collective-backend", "nccl")
    assert rc == 0 and report["errors"] == {}, log
    bc = report["parts"]["broadcast"]
    assert bc["ran"] == "shared_memory" and "error" in bc["collective"]
    assert "FAILED" in log
    assert bc["memcpy_floor"]["gb_per_s"] > 0  # measured before the collective joined
    _check_transfer(bc["ipc"], bc["params"] * 2)


def test_imports_without_ray_deepspeed_vllm():
    code = (
        "import sys; sys.modules.update(ray=None, deepspeed=None, vllm=None); "
        f"sys.path.insert(0, {str(ROOT)!r}); import bench.learner.device_check"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_vllms_chunk_cut_of_the_device_specs_and_checksum():
    specs = [
        ("a", (3,), "bfloat16"),
        ("b", (2, 2), "float32"),
        ("c", (1,), "bfloat16"),
        ("d", (5,), "bfloat16"),
    ]
    # 6, 16, 2, 10 bytes; a chunk closes once it exceeds 8 bytes (vLLM's rule)
    sizes = [dc._nbytes(s) for s in specs]
    assert chunk_cuts(sizes, 8) == [[0, 1], [2, 3]]
    assert chunk_cuts(sizes, 1000) == [[0, 1, 2, 3]]
    x = torch.arange(8, dtype=torch.uint8)
    assert dc.checksum(x) == dc.checksum(x.clone())
    assert dc.checksum(x) != dc.checksum(x.flip(0))  # same sum, other order
