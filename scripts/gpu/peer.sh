#!/usr/bin/env bash
# kvtrim serve against llama.cpp's llama-server with every layer on the GPU: the serve
# part of `kvtrim bench --peer` (requests/s and first-token times at 1, 4 and 8
# clients, plain and streaming), run on the machine where scripts/gpu/check.sh just
# ran, on its synthetic Llama 3.1 8B (speed does not depend on the weights' values).
#
#   bash scripts/gpu/prepare.sh 90 --peer   # here: also .gpu-peer/ (server, wheels)
#   bash scripts/gpu/check.sh && bash scripts/gpu/peer.sh   # there, one warm machine
#   bash scripts/gpu/peer.sh --dry-run      # on a CPU: the CPU builds, the default
#                                           # model (or $MODEL), 1 and 2 clients, one round
#
# Writes peer.json, peer.md, peer.png and peer-logs.tar.xz (the servers' logs) in $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench-out/gpu-peer}
WORK=${WORK:-/tmp/kvtrim-gpu}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 GGML_NO_BACKTRACE=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)

if [ "${1:-}" = "--dry-run" ]; then
  PY=${PYTHON:-.venv/bin/python}
  BIN=${PEER_BINARY:-.variants/llama-server/llama-server}
  ARGS=(--quick --peer-gpu-layers 0 --lengths 1024)
  [ -n "${MODEL:-}" ] && ARGS+=(--model "$MODEL")  # default: the embedded model
  THREADS=${THREADS:-$(nproc)}
else
  PY=${PYTHON:-python3}
  BIN=.gpu-peer/server/llama-server
  SITE=$WORK/site  # check.sh's: the CUDA llama_cpp and its wheels
  MODEL=${MODEL:-$WORK/llama-3.1-8b.gguf}
  for f in "$SITE/llama_cpp/__init__.py" "$MODEL" "$BIN"; do
    [ -f "$f" ] || { echo "peer: $f missing: run check.sh first on this machine (and prepare.sh 90 --peer where it was built)" >&2; exit 2; }
  done
  # (a rehearsal here with PYTHON=.venv/bin/python sets NO_WHEELS=1: they are CPython 3.12's)
  [ -n "${NO_WHEELS:-}" ] || "$PY" -m pip install -q --no-index --no-deps --no-compile \
    --target "$WORK/peer-site" .gpu-peer/wheels/*.whl
  export PYTHONPATH=$PYTHONPATH:$WORK/peer-site:$SITE
  libs=$("$PY" scripts/gpu/cuda_libs.py)
  # llama-server finds the wheel's libllama and libggml* (the same build) there
  export LD_LIBRARY_PATH=$PWD/.gpu-peer/server:$SITE/llama_cpp/lib:$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  THREADS=${THREADS:-8}
  ARGS=(--model "$MODEL" --peer-gpu-layers 99 --clients "${CLIENTS:-1,4,8}"
    --rounds "${ROUNDS:-2}" --lengths 1024 --peer-temperature 1 --peer-ignore-eos)
  # --lengths: the serve part reads none; --peer-ignore-eos: every answer 32 tokens on both
fi
rm -rf "$WORK/peer"
status=0
"$PY" -m engine.cli bench --peer llama-server --peer-binary "$BIN" --parts serve \
  --threads "$THREADS" "${ARGS[@]}" --out "$WORK/peer" || status=$?
for f in peer.json peer.md peer.png; do
  [ -f "$WORK/peer/$f" ] && cp "$WORK/peer/$f" "$OUT/"
done
if [ -d "$WORK/peer/peer-logs" ]; then
  tar -C "$WORK/peer" -cJf "$OUT/peer-logs.tar.xz" peer-logs || echo "peer: the logs were not packed" >&2
fi
echo "peer: exit $status in $(( $(date +%s) - start )) s; results in $OUT"
exit "$status"
