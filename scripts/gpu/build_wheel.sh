#!/usr/bin/env bash
# A CUDA build of the pinned llama-cpp-python, made on a machine with CUDA's compiler
# (nvcc) and no GPU.
#
#   bash scripts/gpu/build_wheel.sh [ARCHS] [OUT]
#
# ARCHS  CMAKE_CUDA_ARCHITECTURES, default "86;89;90;120": RTX 30, RTX 40, H100/H200,
#        RTX 50. Each one adds its own machine code to libggml-cuda.so (build time and
#        bytes per architecture: docs/cli.md, "GPU").
# OUT    where the results go (default dist/gpu):
#          llama_cpp_python-<version>-*.whl   the wheel, for `pip install`
#          llama_cpp-cuda.tar.xz              its llama_cpp package folder with links in
#                                             place of the wheel's duplicate libraries
#                                             (a fraction of the wheel's size; what
#                                             scripts/gpu/check.sh installs)
#
# With a full CUDA toolkit this is what a user runs by hand:
#   CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=89" pip install llama-cpp-python==V
# Where nvcc is installed without cuBLAS (CUDA from pip's nvidia-* packages), the
# configure step fails on cublas_v2.h; this script then fetches PyPI's nvidia-cublas
# and builds against a folder of links joining it with the installed toolkit (nothing
# is written into the toolkit). Without a libcuda.so driver stub, CUDA's virtual
# memory management is turned off (GGML_CUDA_NO_VMM). The CPU code is built for
# AVX2/FMA/F16C (x86-64-v3), not for this build machine's CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
ARCHS=${1:-86;89;90;120}
OUT=${2:-dist/gpu}
WORK=${WORK:-build/gpu}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
JOBS=${JOBS:-$(nproc)}
PIP=("$PY" -m pip --disable-pip-version-check)

nvcc_bin=$(command -v "${CUDACXX:-nvcc}") || { echo "build_wheel: no nvcc on PATH (set CUDACXX)" >&2; exit 2; }
# follow links and one-line wrapper scripts (exec /path/to/nvcc "$@") to the toolkit
real=$(readlink -f "$nvcc_bin")
wrapped=$(sed -n 's/^exec \([^ ]*nvcc\) .*/\1/p' "$real" 2>/dev/null | head -1 || true)
[ -n "$wrapped" ] && real=$(readlink -f "$wrapped")
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$real")")}
CUDA_MAJOR=$("$real" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
echo "build_wheel: llama-cpp-python $VERSION, CUDA $CUDA_MAJOR at $CUDA_HOME, architectures $ARCHS, $JOBS jobs"
mkdir -p "$WORK" "$OUT"
WORK=$(readlink -f "$WORK")
OUT=$(readlink -f "$OUT")

if [ -f "$CUDA_HOME/include/cublas_v2.h" ]; then
  ROOT=$CUDA_HOME
else
  # cuBLAS from PyPI: nvidia-cublas (CUDA 13 and later) or nvidia-cublas-cu12
  if [ "$CUDA_MAJOR" -ge 13 ]; then pkg="nvidia-cublas>=$CUDA_MAJOR,<$((CUDA_MAJOR + 1))"
  else pkg="nvidia-cublas-cu$CUDA_MAJOR"; fi
  if ! ls "$WORK"/cublas/nvidia >/dev/null 2>&1; then
    rm -rf "$WORK/cublas-whl" "$WORK/cublas"
    "${PIP[@]}" download --quiet --no-deps --only-binary=:all: -d "$WORK/cublas-whl" "$pkg"
    "$PY" -m zipfile -e "$WORK"/cublas-whl/*.whl "$WORK/cublas"
  fi
  blas=$(dirname "$(find "$WORK/cublas" -name cublas_v2.h | head -1)")/..
  blas=$(readlink -f "$blas")
  ROOT=$WORK/toolkit
  rm -rf "$ROOT" && mkdir -p "$ROOT/include" "$ROOT/lib"
  for d in bin nvvm targets; do [ -e "$CUDA_HOME/$d" ] && ln -s "$CUDA_HOME/$d" "$ROOT/$d"; done
  for f in "$CUDA_HOME"/include/* "$blas"/include/*; do ln -sf "$f" "$ROOT/include/"; done
  for f in "$CUDA_HOME"/lib/* "$blas"/lib/*; do ln -sf "$f" "$ROOT/lib/"; done
  for so in "$ROOT"/lib/libcublas*.so.*; do  # the unversioned names the linker asks for
    ln -sf "$(basename "$so")" "$ROOT/lib/$(basename "$so" | sed 's/\.so\..*/.so/')"
  done
  ln -s lib "$ROOT/lib64"
  echo "build_wheel: cuBLAS from $(basename "$WORK"/cublas-whl/*.whl), toolkit links in $ROOT"
fi

if [ ! -f "$WORK/llama_cpp_python-$VERSION.tar.gz" ]; then
  "${PIP[@]}" download --quiet --no-deps --no-binary=:all: -d "$WORK" "llama-cpp-python==$VERSION"
fi

export CUDACXX=$ROOT/bin/nvcc CUDA_HOME=$ROOT CUDAToolkit_ROOT=$ROOT
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCHS -DGGML_CUDA_NO_VMM=ON \
-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF \
-DCUDAToolkit_ROOT=$ROOT -DCMAKE_CUDA_COMPILER=$ROOT/bin/nvcc"
rm -f "$OUT"/llama_cpp_python-*.whl "$OUT/llama_cpp-cuda.tar.xz" "$OUT/BUILD"
start=$(date +%s)
# the build tree stays in $WORK/skb: scripts/gpu/build_server.sh builds llama-server
# against the same libraries from it
nice -n 10 "${PIP[@]}" wheel --no-deps -v -w "$OUT" --config-settings=build-dir="$WORK/skb" \
  "$WORK/llama_cpp_python-$VERSION.tar.gz" >"$WORK/build.log" 2>&1 || {
  tail -40 "$WORK/build.log" >&2; echo "build_wheel: failed, log in $WORK/build.log" >&2; exit 1; }
secs=$(( $(date +%s) - start ))
wheel=$(ls "$OUT"/llama_cpp_python-*.whl)

# the package folder, each duplicated library kept once (the others become links)
rm -rf "$WORK/pkg" && mkdir -p "$WORK/pkg"
"$PY" -m zipfile -e "$wheel" "$WORK/pkg"
(
  cd "$WORK/pkg/llama_cpp/lib"
  for f in $(ls -S); do  # biggest first; a same-content file with a shorter name links to it
    [ -L "$f" ] || [ ! -f "$f" ] && continue
    for g in *; do
      if [ "$g" != "$f" ] && [ ! -L "$g" ] && [ -f "$g" ] && cmp -s "$f" "$g"; then
        long=$f short=$g
        [ ${#g} -gt ${#f} ] && long=$g short=$f
        rm "$short" && ln -s "$long" "$short"
      fi
    done
  done
)
tar -C "$WORK/pkg" -cJf "$OUT/llama_cpp-cuda.tar.xz" llama_cpp
cuda_so=$(find "$WORK/pkg/llama_cpp/lib" -name 'libggml-cuda.so*' -type f | head -1)
summary=$(printf '%s in %d min; wheel %s MB, libggml-cuda %s MB, llama_cpp-cuda.tar.xz %s MB' \
  "$ARCHS" $((secs / 60)) "$(du -m "$wheel" | cut -f1)" "$(du -m "$cuda_so" | cut -f1)" \
  "$(du -m "$OUT/llama_cpp-cuda.tar.xz" | cut -f1)")
printf 'architectures %s\nllama-cpp-python %s, CUDA %s\n%s\n' "$ARCHS" "$VERSION" "$CUDA_MAJOR" \
  "$summary" >"$OUT/BUILD"
echo "build_wheel: $summary"
