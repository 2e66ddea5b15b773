"""Every bench script answers `--help` as `python -m bench.<kind>.<script> --help` does, so a script that no
longer imports, or that would start measuring on `--help`, fails here.

The scripts are found by walking bench/ (every module of a package there with a `__main__` guard), so a script
moved in is covered without listing it. All of them run in one subprocess, each through `runpy` as `-m` runs it,
so torch, Ray and vLLM are imported once for all (a subprocess per script would import them once each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import contextlib, io, json, runpy, sys
names, results = sys.argv[1:], {}
for name in names:
    sys.argv, out, err, code = [name, "--help"], io.StringIO(), io.StringIO(), None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code
    except BaseException as error:  # reported as the module's result
        code = f"{type(error).__name__}: {error}"
    results[name] = [code, out.getvalue(), err.getvalue()]
print("\\n" + json.dumps(results))
"""


def bench_modules() -> list[str]:
    """Dotted names of the scripts under bench/: modules of a package (a folder with `__init__.py`, so
    bench/out/ and other ignored folders are skipped) that run something under `__main__`."""
    found = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        packages = [ROOT.joinpath(*parts[:i]) for i in range(1, len(parts))]
        if (
            all((p / "__init__.py").exists() for p in packages)
            and '__name__ == "__main__"' in path.read_text()
        ):
            found.append(".".join(parts))
    return found


MODULES = bench_modules()
# Scripts that do not run as modules yet, each with why; their owners make them modules as they move them.
NOT_YET: dict[str, str] = {}  # module -> why its --help cannot run yet (xfail, strict)


@pytest.fixture(scope="module")
def helps() -> dict[str, list]:
    """{module: [exit code, stdout, stderr]} of `--help` of every script, from one subprocess."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *MODULES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_the_walk_finds_every_kind():
    kinds = {name.split(".")[1] for name in MODULES if name.count(".") == 2}
    assert {"sampling", "weights", "replay", "system", "models", "peers"} <= kinds
    assert "bench.common" not in MODULES and "bench.weights.model_100m" not in MODULES  # helpers, not scripts


@pytest.mark.parametrize(
    "module",
    [
        pytest.param(m, marks=pytest.mark.xfail(reason=NOT_YET[m], strict=True)) if m in NOT_YET else m
        for m in MODULES
    ],
)
def test_help(module: str, helps: dict[str, list]) -> None:
    code, out, err = helps[module]
    assert code == 0, f"{module} --help: exit {code}\n{err[-2000:]}"
    assert out.startswith("usage:"), out[:500]
