#!/usr/bin/env bash
# Tunes the real vLLM (CPU build) over two configurations with `slobench tune`: vLLM started per
# configuration on 127.0.0.1 from a command template (--max-num-seqs 1 and 8), its readiness waited for,
# a short capacity search at the SLO against it, then its process group stopped and its port seen free.
# vLLM and the tiny random Llama come from .ci/vllm-env.sh (installed once into .vllm-venv). Far too heavy
# for CI (.ci/run does not call it); the result goes in docs/measurements/tune_vllm.md.
# Idempotent: a finished tune in $OUT is kept and only its unfinished configurations run (--resume); remove
# $OUT for a fresh one. Bounded: the tune is stopped (Ctrl-C's path: the server stopped, exit 130) after
# TUNE_LIMIT_S seconds. Run from anywhere; VENV, MODEL_DIR, OUT, SEQS and SLOBENCH (the command running
# slobench, default `python -m slobench` of the PATH's python) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."

source .ci/vllm-env.sh
OUT=${OUT:-runs/vllm-tune}
SEQS=${SEQS:-1,8}
TUNE_LIMIT_S=${TUNE_LIMIT_S:-1800}
read -r -a SLOBENCH <<<"${SLOBENCH:-python -m slobench}"
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}  # GiB of KV cache: the tiny model needs little

RESUME=()
[ -f "$OUT/tune.json" ] && RESUME=(--resume)
SERVE="$PY -m vllm.entrypoints.openai.api_server --model $MODEL_DIR --max-model-len 2048 --host 127.0.0.1
  --port {port} --max-num-seqs {seqs}"
t0=$SECONDS
# SIGINT after the limit: tune stops the server in progress and keeps what finished (exit 130)
timeout --signal INT --kill-after 120 "$TUNE_LIMIT_S" "${SLOBENCH[@]}" tune --serve-cmd "$SERVE" \
  --param "seqs=$SEQS" --ready-timeout 600 --stop-grace 30 \
  --slo ttft=500ms,target=0.9 --replicates 2 --duration 30 \
  --capacity-args "--api completions --server-profile vllm --tokenizer $MODEL_DIR --input-len 128 --output-len 64 \
--start-rate 2 --tolerance 0.25 --max-probes 8 --seed-probes 6" \
  --out "$OUT" "${RESUME[@]}" "$@"
echo "vllm-tune: $((SECONDS - t0)) s; result: $OUT/tune.json"
