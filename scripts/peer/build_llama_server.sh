#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama.cpp that the pinned llama-cpp-python
# vendors (its PyPI source distribution: no network beyond the package registry), for
# `kvtrim bench --peer llama-server`. Reuses a build that is already there. Prints the
# binary's path. About 15 minutes on 2 cores.
#   bash scripts/peer/build_llama_server.sh            # -> .variants/llama-server/llama-server
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-.variants/llama-server}
VERSION=$("$PY" -c "import llama_cpp; print(llama_cpp.__version__)")
BIN="$OUT/llama-server"
if [ -x "$BIN" ] && [ "$(cat "$OUT/version" 2>/dev/null)" = "$VERSION" ]; then
  echo "$BIN"
  exit 0
fi
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK" "$OUT"
if [ ! -d "$WORK/llama_cpp_python-$VERSION" ]; then
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$WORK" >&2
  tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
fi
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >&2
cp "$WORK/build/bin/llama-server" "$BIN"
echo "$VERSION" > "$OUT/version"
echo "$BIN"
