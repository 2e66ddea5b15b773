#!/usr/bin/env bash
# Sets up .venv on first use, then runs `python -m exgrpo.run` with the given arguments.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
exec "$ROOT/.venv/bin/python" -m exgrpo.run "$@"
