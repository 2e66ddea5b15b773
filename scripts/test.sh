#!/usr/bin/env bash
# Sets up .venv on first use, then runs ruff and the test suite (slow tests excluded; pass -m slow for them).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export RAY_AUTH_MODE=disabled TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/exgrpo/torch_extensions}"
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"
