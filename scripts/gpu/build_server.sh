#!/usr/bin/env bash
# llama.cpp's llama-server against the CUDA build's own libraries, for the GPU peer
# bench (scripts/gpu/peer.sh): built from the build tree that build_wheel.sh leaves
# in build/gpu/skb, so only the server and the sources it alone uses are compiled
# (libggml-cuda is the wheel's; about 10 minutes on 2 cores).
#
#   bash scripts/gpu/build_server.sh [OUT]      # OUT default .gpu-peer/server
#
# OUT gets llama-server and the libraries of its own it needs beyond the wheel's
# (libllama-server-impl, libllama-common, libmtmd), stripped; the rest (libllama,
# libggml*, CUDA's runtime) come from LD_LIBRARY_PATH there. No OpenSSL (as
# scripts/peer/build_llama_server.sh): the server listens on loopback only.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${WORK:-build/gpu}
OUT=${1:-.gpu-peer/server}
B=$WORK/skb
[ -f "$B/CMakeCache.txt" ] || { echo "build_server: no $B: run scripts/gpu/build_wheel.sh first" >&2; exit 2; }
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$B/CMakeCache.txt")
[ -n "$src" ] || { echo "build_server: $B/CMakeCache.txt names no source folder" >&2; exit 2; }
VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
sdist=$WORK/llama_cpp_python-$VERSION.tar.gz
# pip built in a temporary copy of the sdist, since removed: the same sources, same
# path (their archive dates are older than the objects, so nothing built is rebuilt)
if [ ! -f "$src/CMakeLists.txt" ]; then
  [ -f "$sdist" ] || { echo "build_server: no $sdist: run scripts/gpu/build_wheel.sh first" >&2; exit 2; }
  mkdir -p "$src"
  tar -xzf "$sdist" -C "$src" --strip-components=1
fi
cmake "$B" -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF >"$WORK/server-configure.log"
nice -n 10 cmake --build "$B" --target llama-server -j "${JOBS:-$(nproc)}" >"$WORK/server-build.log" 2>&1 || {
  tail -30 "$WORK/server-build.log" >&2; exit 1; }
bin=$B/bin/llama-server
[ -x "$bin" ] || bin=$(find "$B" -name llama-server -type f -perm -u+x | head -1)
rm -rf "$OUT" && mkdir -p "$OUT"
strip -o "$OUT/llama-server" "$bin"
# its libraries that the wheel does not hold, and theirs, found beside it
needed() { objdump -p "$1" | sed -n 's/ *NEEDED *//p'; }
todo=("$OUT/llama-server")
while [ ${#todo[@]} -gt 0 ]; do
  f=${todo[0]} todo=("${todo[@]:1}")
  for lib in $(needed "$f"); do
    case $lib in libllama.so*|libggml*) continue ;; esac
    src_lib=$(dirname "$bin")/$lib
    case $lib in libllama*|libmtmd*)  # llama.cpp's own: the wheel does not hold them
      [ -e "$src_lib" ] || { echo "build_server: $lib (needed by $f) not found in $(dirname "$bin")" >&2; exit 1; } ;;
    esac
    if [ -e "$src_lib" ] && [ ! -e "$OUT/$lib" ]; then
      strip -o "$OUT/$lib" "$(readlink -f "$src_lib")"
      todo+=("$OUT/$lib")
    fi
  done
done
echo "build_server: $(du -sh "$OUT" | cut -f1) in $OUT: $(ls "$OUT" | tr '\n' ' ')"
