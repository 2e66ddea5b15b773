#!/usr/bin/env bash
# System packages for the monitoring tests (idempotent; CI runs it from .ci/run before the tests):
# Debian's `prometheus` (tests/integration/test_monitoring.py scrapes a live run) and `chromium`
# (headless: the Ray dashboard's pages and report.html). Without them those tests skip and say why.
set -euo pipefail
missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "[setup-system] not root and no sudo: skipping ${missing[*]} (their tests will skip)" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null; then
  echo "[setup-system] no apt-get: install ${missing[*]} by hand (their tests will skip)" >&2
  exit 0
fi
echo "[setup-system] installing ${missing[*]} (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q >/dev/null
"${SUDO[@]}" apt-get install -y -q "${missing[@]}" >/dev/null
# Debian's package starts a system Prometheus on :9090; the tests run their own on a free 127.0.0.1 port.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  "${SUDO[@]}" systemctl stop prometheus || true
fi
echo "[setup-system] done" >&2
