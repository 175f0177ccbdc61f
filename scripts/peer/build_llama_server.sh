#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama.cpp that the pinned llama-cpp-python
# vendors (its PyPI source distribution: no network beyond the package registry), for
# `kvtrim bench --peer llama-server`. Reuses a build that is already there. Prints the
# binary's path. About 15 minutes on 2 cores.
#   bash scripts/peer/build_llama_server.sh            # -> .variants/llama-server/llama-server
# Linked as llama.cpp builds by default on Linux and as its release binaries are: shared
# libraries beside the binary (RPATH $ORIGIN), the linkage of the libllama that
# llama-cpp-python loads into kvtrim. LINK=static links llama.cpp into the binary
# instead, which reads prompts about 4% faster on 2 cores (no position-independent
# code; docs/benchmarks/history.md, issue 37) but is not what llama.cpp's build gives a user.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-.variants/llama-server}
LINK=${LINK:-shared}
case "$LINK" in shared) SHARED=ON ;; static) SHARED=OFF ;; *) echo "LINK is shared or static" >&2; exit 2 ;; esac
VERSION=$("$PY" -c "import llama_cpp; print(llama_cpp.__version__)")
BIN="$OUT/llama-server"
if [ -x "$BIN" ] && [ "$(cat "$OUT/version" 2>/dev/null)" = "$VERSION $LINK" ]; then
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
BUILD="$WORK/build-$LINK"
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=$SHARED \
  -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON >&2
cmake --build "$BUILD" --target llama-server -j "$(nproc)" >&2
# only what a build of either linkage puts there (OUT may hold other things)
rm -f "$OUT/version" "$BIN" "$OUT"/libggml*.so* "$OUT"/libllama*.so* "$OUT"/libmtmd*.so*
cp "$BUILD/bin/llama-server" "$BIN"
if [ "$LINK" = shared ]; then
  cp -P "$BUILD"/bin/*.so* "$OUT/"
fi
echo "$VERSION $LINK" > "$OUT/version"
echo "$BIN"
