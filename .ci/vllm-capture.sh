#!/usr/bin/env bash
# Captures real vLLM 0.32 streams for tests/conformance/streams/vllm032-*: installs vLLM's CPU build into
# its own venv and writes a tiny random Llama (.ci/vllm-env.sh; far too heavy for CI, which replays the
# captures), starts vLLM on 127.0.0.1 only, captures every case in that one start (chat and completions:
# tests/conformance/capture_vllm.py; the Responses API: capture_vllm_responses.py), then stops it.
# Idempotent: an installed venv and a written model are reused. Every step is bounded in time; prints how
# long each took.
# Run from anywhere; PORT, VENV, MODEL_DIR and OUT (where the streams go) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."

source .ci/vllm-env.sh
PORT=${PORT:-8932}

LOG=$VENV/vllm-server.log
t0=$SECONDS
VLLM_CPU_KVCACHE_SPACE=2 timeout 1200 "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
  --max-model-len 2048 --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  if ! kill -0 "$SERVER" 2>/dev/null || [ $((SECONDS - t0)) -gt 600 ]; then
    echo "vllm-capture: vLLM did not become healthy; the end of $LOG:" >&2
    tail -40 "$LOG" >&2
    exit 1
  fi
  sleep 2
done
echo "vllm-capture: vLLM healthy: $((SECONDS - t0)) s"
step capture 600 "$PY" tests/conformance/capture_vllm.py "$PORT" "$MODEL_DIR" "${OUT:-tests/conformance/streams}"
step capture-responses 600 "$PY" tests/conformance/capture_vllm_responses.py "$PORT" "$MODEL_DIR" \
  "${OUT:-tests/conformance/streams}"
