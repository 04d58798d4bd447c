#!/usr/bin/env bash
# The one prepared GPU check: the kernel tests compiled on the GPU (fp32 and bf16), the
# executor's CUDA-graph and KV-sizing tests, then benchmarks/gpu_roofline.py (decode grid and offline run
# through the executor's real GPU path). Everything is written to $OUT (or runs/gpu_check when OUT is unset):
#   env.txt            nvidia-smi, torch / triton versions
#   kernel_tests.txt   pytest output
#   gpu_path_tests.txt pytest output of tests/test_gpu_path.py (graph capture/replay vs eager, KV sizing)
#   roofline.txt       the decode table and offline throughput, as printed
#   roofline.json      the same, machine-readable
#   status.txt         exit codes
# Time: at most 130 s + 80 s of tests + 360 s of benchmark, inside one 10-minute device command.
# Without CUDA (CI, a laptop) the GPU tests skip and the benchmark prints "no CUDA device: skipped".
# Usage (repo root): bash benchmarks/gpu_check.sh   (PYTHON=... to pick the interpreter)
set -u -o pipefail
cd "$(dirname "$0")/.."

OUT_DIR="${OUT:-runs/gpu_check}"  # runs/ is git-ignored
mkdir -p "$OUT_DIR"
if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
else
    PY=python3  # a machine where the repo is not installed: import it from the checkout
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# Compiled kernels, not the interpreter; the dispatcher picks Triton on CUDA by itself.
unset TRITON_INTERPRET SLOBENCH_FORCE_TRITON

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi || true
    "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
} >"$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"

# --noconftest: the shared conftest imports the test servers' packages, which the kernel tests do not need.
timeout 130 "$PY" -m pytest tests/test_kernels.py -q -m kernels --noconftest -p no:cacheprovider -rs 2>&1 |
    tee "$OUT_DIR/kernel_tests.txt"
tests_rc=${PIPESTATUS[0]}

# -k cuda: the capture/replay and memory-sizing tests (plus two quick CPU ones); the rest runs in CI.
timeout 80 "$PY" -m pytest tests/test_gpu_path.py -q -k cuda --noconftest -p no:cacheprovider -rs 2>&1 |
    tee "$OUT_DIR/gpu_path_tests.txt"
graph_rc=${PIPESTATUS[0]}

timeout 360 "$PY" benchmarks/gpu_roofline.py --json "$OUT_DIR/roofline.json" 2>&1 | tee "$OUT_DIR/roofline.txt"
bench_rc=${PIPESTATUS[0]}

echo "kernel tests rc=$tests_rc, gpu path tests rc=$graph_rc, roofline rc=$bench_rc (124 = timed out)" |
    tee "$OUT_DIR/status.txt"
[ "$tests_rc" -eq 0 ] && [ "$graph_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
