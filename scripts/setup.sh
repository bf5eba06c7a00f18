#!/usr/bin/env bash
# Set up schedc on a fresh Debian machine: Graphviz and Chromium (apt), torch (CPU build, only when
# torch is missing), numpy, and schedc itself (editable) with its test tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# torch==2.13.0 is a local CPU build here; plain `torch` would pull a multi-GB CUDA build.
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q torch==2.13.0
$PY -m pip install -q -c constraints.txt numpy scikit-learn setuptools wheel
# torch is met by now (the runtime extra names it unpinned), so this pulls no other build of it
$PY -m pip install -q -c constraints.txt -e ".[runtime,test,benchmarks]"
# An editable install leaves the package uncompiled, and with PYTHONDONTWRITEBYTECODE set every start of
# `schedc` would compile it again (~0.15 s of CPU); byte-compile it once, as a regular install does.
$PY -m compileall -q schedc >/dev/null
