#!/usr/bin/env bash
# Sets up .venv on first use, then checks lint (ruff), formatting (ruff format) and types (mypy over the
# kernel, the loop, the transport and the test fakes) and runs the test suite in two workers (slow tests excluded;
# -m slow for them).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export RAY_AUTH_MODE=disabled TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/exgrpo/torch_extensions}"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# Two workers (pytest-xdist), each taking whole files and its own local Ray cluster: the tests wait on actors
# much of the time, so two of them share the 2 cores; EXGRPO_TEST_WORKERS=0 runs them in this process.
# --no-loadscope-reorder keeps tests/conftest.py's order (the files that start Ray first) instead of xdist's
# most-tests-first, which left a one-test integration file running alone at the end.
.venv/bin/python -m pytest -n "${EXGRPO_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
