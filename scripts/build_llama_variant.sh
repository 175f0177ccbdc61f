#!/usr/bin/env bash
# Builds the pinned llama-cpp-python's libraries for another CPU instruction set into
# .variants/NAME/lib (git-ignored), for a numeric run on this machine as another CPU
# would compute it:
#   bash scripts/build_llama_variant.sh avx2
#   .venv/bin/python scripts/numeric_margins.py --lib avx2=.variants/avx2/lib
# (llama.cpp loads from $LLAMA_CPP_LIB_PATH.) About 6 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-avx2}
off512="-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF"
offamx="-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AVX_VNNI=OFF"
case "$name" in
  avx2) flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON $off512 $offamx" ;;
  avx512) flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON $offamx" ;;
  *) echo "unknown variant '$name': choose avx2 or avx512" >&2; exit 2 ;;
esac
version=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# --no-cache-dir: pip's wheel cache would hand back setup.sh's native build
CMAKE_ARGS="$flags" .venv/bin/python -m pip install --quiet --disable-pip-version-check \
  --no-cache-dir --no-deps --no-binary llama-cpp-python --target "$tmp" "llama-cpp-python==$version"
rm -rf ".variants/$name/lib"
mkdir -p ".variants/$name"
cp -r "$tmp/llama_cpp/lib" ".variants/$name/lib"
info=$(LLAMA_CPP_LIB_PATH=".variants/$name/lib" .venv/bin/python -c \
  "from engine.native.cpu import system_info; print(system_info().splitlines()[-1])")
echo "$info"
if [ "$name" = avx2 ] && grep -q "AVX512 = 1" <<<"$info"; then
  echo "the build still uses AVX-512: CMAKE_ARGS did not reach it" >&2
  exit 1
fi
echo "built .variants/$name/lib"
