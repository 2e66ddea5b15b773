#!/usr/bin/env bash
# Wheels the GPU device check needs beyond its image (torch, transformers, numpy, pyyaml, msgpack, psutil,
# py-cpuinfo and ninja are there): DeepSpeed (pure Python; built here from its sdist) and the packages it
# imports that the image lacks. Python 3.12, x86-64, ~5 MB in all, into .whl/ (git-ignored).
#
#   bash scripts/device_wheels.sh
#   # then, on the device, with .whl carried:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
#   PYTHONUNBUFFERED=1 python3 -m bench.learner.device_check --out $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 hjson==3.1.0
"$PY" -m pip wheel -q --no-deps -w .whl deepspeed==0.19.8
ls -l .whl
