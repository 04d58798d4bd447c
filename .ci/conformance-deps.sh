#!/usr/bin/env bash
# Installs what tests/conformance needs into .venv: the llama.cpp server (llama-cpp-python[server], built
# from source: there is no CPU wheel on PyPI), a LiteLLM proxy (litellm[proxy]) and gguf (to write the
# suite's tiny model). The llama.cpp wheel is built once into the cache and reused while the version and
# the build flags stay the same: a cold build takes minutes, an install from the cache seconds.
# Prints how long each step took. Run from anywhere; VENV and SLOBENCH_WHEEL_CACHE may be set.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
LITELLM_VERSION=1.108.7   # 1.108.8 and later, 1.109.x and 1.110.x pin litellm-enterprise/-proxy-extras
                          # releases that are not on PyPI here: `pip install litellm[proxy]` fails for them
GGUF_VERSION=0.19.0

PY=${VENV:-.venv}/bin/python
# --wheel-only: build (or find) the llama.cpp wheel and stop. It needs no venv (the wheel is py3-none), so
# .ci/run starts it in the background first and the minutes of compiling overlap the rest of the install.
WHEEL_ONLY=0
if [ "${1:-}" = "--wheel-only" ]; then WHEEL_ONLY=1; fi
# --no-llama: LiteLLM and gguf only (CI: the llama.cpp build does not fit its 20 minutes)
if [ "${1:-}" = "--no-llama" ]; then
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  t0=$SECONDS
  "$PY" -m pip install -q --no-compile "litellm[proxy]==$LITELLM_VERSION" "gguf==$GGUF_VERSION"
  echo "conformance-deps: litellm[proxy] $LITELLM_VERSION, gguf $GGUF_VERSION: $((SECONDS - t0)) s (llama.cpp not built)"
  exit 0
fi
CACHE=${SLOBENCH_WHEEL_CACHE:-$HOME/.cache/slobench-wheels}
export PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the Python package loads: libllama and ggml's CPU backend. No examples, tests, tools, server
# binary or multimodal (mtmd) library; no OpenSSL. GGML_NATIVE=OFF: a cached wheel must run on another CI
# machine than the one that built it (the x86-64 baseline plus AVX/AVX2/FMA/F16C, not -march=native).
# (llama-cpp-python forces LLAMA_BUILD_COMMON on, so the common library is still compiled.)
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

step() {  # step NAME CMD...: run CMD, then say how long it took
  local name=$1 t0=$SECONDS
  shift
  "$@"
  echo "conformance-deps: ${name}: $((SECONDS - t0)) s"
}

# The cache folder is keyed by the version and the build flags, so changing either builds afresh.
key=$(printf '%s|%s|%s' "$LLAMA_CPP_PYTHON_VERSION" "$CMAKE_ARGS" "$(uname -m)" | sha256sum | cut -c1-12)
wheel_dir="$CACHE/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-$key"
wheel=$(ls "$wheel_dir"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "conformance-deps: building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION into $wheel_dir (minutes)"
  mkdir -p "$wheel_dir.tmp"
  if [ "$WHEEL_ONLY" = 1 ]; then  # no project venv yet: a throwaway one with a current pip builds the wheel
    python3 -m venv "$wheel_dir.venv" && "$wheel_dir.venv/bin/python" -m pip install -q --upgrade pip
    PY="$wheel_dir.venv/bin/python"
  fi
  step "llama-cpp-python wheel build (cold, $CMAKE_BUILD_PARALLEL_LEVEL jobs)" \
    "$PY" -m pip wheel -q --no-deps --no-binary llama-cpp-python -w "$wheel_dir.tmp" \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  rm -rf "$wheel_dir" "$wheel_dir.venv" && mv "$wheel_dir.tmp" "$wheel_dir"  # a killed build leaves no entry
  wheel=$(ls "$wheel_dir"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION"-*.whl | head -n 1)
else
  echo "conformance-deps: using the cached wheel $wheel"
fi
if [ "$WHEEL_ONLY" = 1 ]; then echo "conformance-deps: wheel ready: $wheel"; exit 0; fi
step "llama-cpp-python[server] install" "$PY" -m pip install -q "${wheel}[server]"
step "litellm[proxy] install" "$PY" -m pip install -q "litellm[proxy]==$LITELLM_VERSION"
step "gguf install" "$PY" -m pip install -q "gguf==$GGUF_VERSION"
"$PY" - <<'EOF'
from importlib.metadata import version
print("conformance-deps: installed", ", ".join(f"{p} {version(p)}" for p in ("llama_cpp_python", "litellm", "gguf")))
EOF
