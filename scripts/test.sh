#!/usr/bin/env bash
# Sets up .venv on first use, then checks lint (ruff), formatting (ruff format) and types (mypy over the
# kernel, the loop, the transport and the test fakes) and runs the test suite (slow tests excluded; -m slow for them).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export RAY_AUTH_MODE=disabled TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/exgrpo/torch_extensions}"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
