#!/usr/bin/env bash
# Here, before the GPU check: what travels to the GPU machine, in .gpu/ (git-ignored;
# the device tool carries it with `carry: [".gpu"]`, 64 MiB at most with the tree).
#
#   bash scripts/gpu/prepare.sh [ARCHS] [--peer]   # ARCHS default 90 (H100/H200)
#
#   .gpu/llama_cpp-cuda.tar.xz  the CUDA build (scripts/gpu/build_wheel.sh; about an
#                               hour on 2 cores the first time, kept in dist/gpu)
#   .gpu/vocab.gguf             the synthetic models' tokenizer (the default model's)
#   .gpu/wheels/                pure-Python packages the GPU machine's image lacks
#
# With --peer, also .gpu-peer/ for scripts/gpu/peer.sh (a second call to the warm
# machine; each call carries 64 MiB at most, so the two do not travel together):
#   .gpu-peer/server/           llama-server against the CUDA build's libraries
#                               (scripts/gpu/build_server.sh)
#   .gpu-peer/wheels/           kvtrim serve's and the peer bench's packages (FastAPI,
#                               uvicorn, pydantic, openai, ...), for Python 3.12
set -euo pipefail
cd "$(dirname "$0")/../.."
ARCHS=90 PEER=
for arg in "$@"; do  # --peer and ARCHS in either order
  if [ "$arg" = --peer ]; then PEER=--peer; else ARCHS=$arg; fi
done
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
# bytes, not rounded MiB: the two together come within a MiB or two of the limit
mib() { awk '{ printf "%.1f", $1 / 1048576 }'; }
size=$(du -sb --apparent-size .gpu | cut -f1)
tree=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true) \
  | awk '{ s += $1 } END { print s + 0 }')  # a deleted tracked file: not counted
echo "prepare: .gpu is $(mib <<<"$size") MiB, the tree $(mib <<<"$tree") MiB (the device carries 64 MiB at most)"
[ $((size + tree)) -lt $((64 * 1048576)) ] || { echo "prepare: too big to carry" >&2; exit 1; }

[ "$PEER" = --peer ] || exit 0
bash scripts/gpu/build_server.sh .gpu-peer/server
rm -rf .gpu-peer/wheels && mkdir -p .gpu-peer/wheels
# what serve and the peer bench import that the GPU image lacks or holds in other
# versions (its numpy, lxml, pyyaml, requests and tqdm are used as they are); the
# versions are this environment's, the two compiled ones built for CPython 3.12
read -r -a pure <<<"$("$PY" - <<'PYEOF'
from importlib.metadata import version
names = (
    "annotated-doc annotated-types anyio click fastapi h11 httpcore httpcore2 httpx httpx2 "
    "openai opentelemetry-api prometheus-client pydantic pypdf python-docx sniffio "
    "sse-starlette starlette threadpoolctl truststore typing-extensions typing-inspection "
    "uvicorn"
).split()
print(" ".join(f"{n}=={version(n)}" for n in names))
PYEOF
)"
compiled=$("$PY" -c 'from importlib.metadata import version as v
print(" ".join(f"{n}=={v(n)}" for n in ("pydantic-core", "jiter")))')
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation py --platform any -d .gpu-peer/wheels "${pure[@]}"
# shellcheck disable=SC2086
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .gpu-peer/wheels $compiled
# kvtrim bench asks for rouge-score (the summary metrics), which PyPI has as source only
rouge=$("$PY" -c 'from importlib.metadata import version; print(version("rouge-score"))')
"$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps -w .gpu-peer/wheels \
  "rouge-score==$rouge"
size=$(du -sb --apparent-size .gpu-peer | cut -f1)
echo "prepare: .gpu-peer is $(mib <<<"$size") MiB, the tree $(mib <<<"$tree") MiB"
[ $((size + tree)) -lt $((64 * 1048576)) ] || { echo "prepare: .gpu-peer too big to carry" >&2; exit 1; }
