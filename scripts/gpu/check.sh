#!/usr/bin/env bash
# The GPU check: one run on a machine with an NVIDIA GPU, under 8 minutes.
#
#   bash scripts/gpu/prepare.sh        # here, once: the CUDA build and what travels in .gpu/
#   bash scripts/gpu/check.sh          # there: results in $OUT (or bench-out/gpu)
#   bash scripts/gpu/check.sh --dry-run  # on a CPU: tiny models, short documents, no GPU
#
# It installs the carried CUDA build of llama-cpp-python (.gpu/llama_cpp-cuda.tar.xz)
# and the few pure-Python packages the machine lacks (.gpu/wheels), writes the
# synthetic Llama 3.1 8B and Gemma 3 12B (.gpu/vocab.gguf is their tokenizer), runs
# `kvtrim --self-test --gpu-layers 99`, then python -m engine.bench.gpu: documents of
# 8K, 32K and 128K tokens with llama.cpp's defaults, without flash attention, and
# with kvtrim (SnapKV and StreamingLLM at budgets 1,024 and 4,096). Writes gpu.json,
# gpu.md, gpu_memory.png, gpu_prefill.png, gpu_trace.png, selftest.txt and check.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench-out/gpu}
WORK=${WORK:-/tmp/kvtrim-gpu}
mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/check.log") 2>&1
trap 'exec >&- 2>&-; wait' EXIT  # let tee write the last lines
# GGML_NO_BACKTRACE: a crash prints no gdb backtrace (slow or hanging in some sandboxes)
export PYTHONUNBUFFERED=1 GGML_NO_BACKTRACE=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)

if [ "${1:-}" = "--dry-run" ]; then
  PY=${PYTHON:-.venv/bin/python}
  LAYERS=0 LENGTHS=${LENGTHS:-1024,2048} BUDGETS=${BUDGETS:-128,256} DEADLINE=${DEADLINE:-300}
  MODELS=(llama-tiny gemma-tiny) VOCAB=() DECODE=8
  echo "check: dry run on the CPU (no GPU layers, tiny models)"
else
  PY=${PYTHON:-python3}
  LAYERS=99 LENGTHS=${LENGTHS:-8192,32768,131072} BUDGETS=${BUDGETS:-1024,4096}
  DEADLINE=${DEADLINE:-450} VOCAB=(--vocab .gpu/vocab.gguf) DECODE=32
  read -r -a MODELS <<<"${SHAPES:-llama-3.1-8b gemma-3-12b}"  # SHAPES: a rehearsal's tiny ones
  for f in .gpu/llama_cpp-cuda.tar.xz .gpu/vocab.gguf; do
    [ -f "$f" ] || { echo "check: $f missing: run scripts/gpu/prepare.sh first" >&2; exit 2; }
  done
  SITE=$WORK/site
  rm -rf "$SITE" && mkdir -p "$SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/wheels/*.whl
  "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    .gpu/llama_cpp-cuda.tar.xz "$SITE"
  export PYTHONPATH=$PYTHONPATH:$SITE
  # the build's RUNPATH names its own toolkit folder: CUDA's runtime libraries
  # come from this machine's pip packages (nvidia-cublas, nvidia-cuda-runtime)
  libs=$("$PY" scripts/gpu/cuda_libs.py)
  export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  cat .gpu/BUILD 2>/dev/null || true  # what build_wheel.sh built, for which architectures
  # fail in seconds, not after the models are written: the CUDA library, its
  # libraries (a CUDA 13 build needs libcudart/libcublas .so.13 and a 580+ driver)
  if [ "${REQUIRE_GPU:-1}" = 1 ]; then
    cuda_lib=$(ls "$SITE"/llama_cpp/lib/libggml-cuda.so* 2>/dev/null | head -1)
    [ -n "$cuda_lib" ] || { echo "check: the carried build has no libggml-cuda" >&2; exit 3; }
    if ldd "$cuda_lib" | grep "not found"; then
      echo "check: libraries of $cuda_lib not found (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)" >&2
      exit 3
    fi
    "$PY" -c 'import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_gpu_offload())' \
      || { echo "check: llama.cpp loads but offers no GPU offload" >&2; exit 3; }
  fi
fi
echo "check: python $("$PY" -c 'import sys; print(sys.version.split()[0])'), $(nproc) CPUs"

declare -a PATHS=()
for m in "${MODELS[@]}"; do
  "$PY" scripts/gpu/synth_model.py "$m" "$WORK/$m.gguf" "${VOCAB[@]}"
  PATHS+=(--model "$m=$WORK/$m.gguf")
done

"$PY" -m app.main --self-test --model "$WORK/${MODELS[0]}.gguf" --gpu-layers "$LAYERS" --no-gui \
  | tee "$OUT/selftest.txt"
if [ "$LAYERS" != 0 ] && [ "${REQUIRE_GPU:-1}" = 1 ] && ! grep -q "; a GPU build" "$OUT/selftest.txt"; then
  echo "check: this llama.cpp build cannot offload to a GPU; stopping before the runs" >&2
  exit 3
fi

left=$(( DEADLINE - ($(date +%s) - start) ))
"$PY" -m engine.bench.gpu "${PATHS[@]}" --lengths "$LENGTHS" --budgets "$BUDGETS" \
  --gpu-layers "$LAYERS" --decode-tokens "$DECODE" --deadline "$left" --out "$OUT"
echo "check: done in $(( $(date +%s) - start )) s; results in $OUT"
