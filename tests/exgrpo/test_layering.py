"""Layering: the pure modules (records, config, maths, selection, driver loop, checkpoints, data,
replay buffers) import without Ray, vLLM or DeepSpeed, so the loop and its tests run anywhere."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "exgrpo.types",
    "exgrpo.config",
    "exgrpo.algorithm",
    "exgrpo.selection",
    "exgrpo.rewards",
    "exgrpo.core",
    "exgrpo.driver",
    "exgrpo.checkpoint",
    "exgrpo.data.readers",
    "exgrpo.data.tasks",
    "exgrpo.data.templates",
    "exgrpo.data.stream",
    "buffers.experience",
    "buffers.shard",
    "buffers.sharded",
]
HEAVY = ("ray", "vllm", "deepspeed")

SCRIPT = textwrap.dedent("""
    import importlib, sys, traceback
    heavy, modules = sys.argv[1].split(","), sys.argv[2].split(",")
    for name in heavy:
        sys.modules[name] = None  # `import name` (and any name.sub) now raises ImportError
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException:
            print(f"FAIL {name}: {traceback.format_exc()}")
        else:
            print(f"OK {name}")
    print("LOADED", ",".join(sorted(m for m in sys.modules if m.split(".")[0] in heavy and sys.modules[m])))
""")


def _run(modules: list[str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(HEAVY), ",".join(modules)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_blocker_works():
    assert "FAIL ray" in _run(["ray"])


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_without_ray_vllm_deepspeed(module):
    stdout = _run([module])
    assert f"OK {module}" in stdout, stdout
    assert stdout.strip().endswith("LOADED"), stdout  # nothing heavy slipped in by another name


def test_trl_is_a_bench_baseline_only():
    """trl (the optional `bench` extra) is the peer baseline of bench/bench_trl.py, never a runtime import."""
    pattern = re.compile(r"^\s*(import|from)\s+trl\b", re.M)
    offenders = [str(p.relative_to(ROOT)) for pkg in ("exgrpo", "actors", "learners", "buffers")
                 for p in sorted((ROOT / pkg).rglob("*.py")) if pattern.search(p.read_text())]
    assert offenders == []
    assert pattern.search((ROOT / "bench" / "bench_trl.py").read_text())  # the pattern does find an import
