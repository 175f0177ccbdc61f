#!/usr/bin/env bash
# Here, before the GPU check: what travels to the GPU machine, in .gpu/ (git-ignored;
# the device tool carries it with `carry: [".gpu"]`, 64 MiB at most with the tree).
#
#   bash scripts/gpu/prepare.sh [ARCHS]    # ARCHS default 90 (H100/H200)
#
#   .gpu/llama_cpp-cuda.tar.xz  the CUDA build (scripts/gpu/build_wheel.sh; about an
#                               hour on 2 cores the first time, kept in dist/gpu)
#   .gpu/vocab.gguf             the synthetic models' tokenizer (the default model's)
#   .gpu/wheels/                pure-Python packages the GPU machine's image lacks
set -euo pipefail
cd "$(dirname "$0")/../.."
ARCHS=${1:-90}
PY=${PYTHON:-.venv/bin/python}
# a build for other architectures (or none) is built again
if ! grep -qx "architectures $ARCHS" dist/gpu/BUILD 2>/dev/null; then
  bash scripts/gpu/build_wheel.sh "$ARCHS" dist/gpu
fi
rm -rf .gpu && mkdir -p .gpu/wheels
cp dist/gpu/llama_cpp-cuda.tar.xz dist/gpu/BUILD .gpu/
"$PY" scripts/gpu/synth_model.py vocab .gpu/vocab.gguf
# llama-cpp-python needs diskcache; kvtrim's engine platformdirs and rank-bm25; the
# synthetic models gguf (its own needs, numpy, pyyaml, requests and tqdm, are there)
pins=$("$PY" - <<'PYEOF'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in ("diskcache", "platformdirs", "rank-bm25", "gguf")))
PYEOF
)
# shellcheck disable=SC2086
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation py --platform any -d .gpu/wheels $pins
size=$(du -sm .gpu | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cm | tail -1 | cut -f1)
echo "prepare: .gpu is $size MiB, the tracked tree $tree MiB (the device carries 64 MiB at most)"
[ $((size + tree)) -lt 64 ] || { echo "prepare: too big to carry" >&2; exit 1; }
