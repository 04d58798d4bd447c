"""Will the GPU check run on a GPU machine this CI has never seen? Two things the interpreter cannot tell:

1. Every Triton kernel, launched as the engine launches it for the `llama-3.2-1b` and `tiny` shapes, must
   compile for real GPUs (sm_90, sm_80) in bf16, fp16 and fp32: the interpreter runs numpy and forgives
   what the compiler refuses. `tests/aot_compile.py` records the launches on the CPU and compiles them to
   cubin with Triton's bundled ptxas; no GPU is needed. It runs in a subprocess because the kernel tests
   set TRITON_INTERPRET=1 in this one, under which `triton.jit` makes no compilable kernels.
2. `benchmarks/gpu_check.sh` must run on an image that holds torch and Triton but not the web stack:
   `benchmarks/gpu_roofline.py --cpu-smoke` and the GPU tests' collection run here with FastAPI, Starlette,
   uvicorn, pydantic, plotly, h2 and pytest-asyncio made unimportable.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SLOBENCH_FORCE_TRITON")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    return env


def _aot(*args: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("triton")
    return subprocess.run([sys.executable, str(REPO / "tests" / "aot_compile.py"), *args], cwd=REPO,
                          env=_clean_env(), capture_output=True, text=True, timeout=600)


# ---- 1. ahead-of-time compilation of the launches the engine makes ---------------------------------------


@pytest.mark.kernels
def test_every_kernel_launch_compiles_for_real_gpus() -> None:
    proc = _aot()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    # 2 models x 3 dtypes x 2 archs x (write_kv, decode, decode+reduce, extend, 2 rms_norm, rotary, silu)
    compiled = int(proc.stdout.split("compiled ")[1].split()[0])
    assert compiled >= 2 * 3 * 2 * 8, proc.stdout


@pytest.mark.kernels
def test_the_compile_check_can_fail() -> None:
    """A tile length given as a runtime int is refused by the compiler (the interpreter would run it)."""
    proc = _aot("--refusal-check")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "refused" in proc.stdout


def test_the_compile_check_refuses_to_run_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = _clean_env() | {"TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "aot_compile.py")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unset TRITON_INTERPRET" in proc.stderr


# ---- 2. the GPU check imports nothing the GPU image lacks --------------------------------------------------

# Installed here (the harness's web server, report and HTTP/2 client) but not on a torch-only GPU image.
ABSENT_ON_GPU_IMAGE = ("fastapi", "starlette", "uvicorn", "pydantic", "pydantic_core", "annotated_types",
                       "plotly", "h2", "pytest_asyncio")

_BLOCKER = f"""
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {ABSENT_ON_GPU_IMAGE!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (absent on the GPU image)", name=name)
        return None
sys.meta_path.insert(0, _Absent())
"""


def _run_without_web_stack(code: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _BLOCKER + code], cwd=REPO, env=_clean_env(), capture_output=True,
                          text=True, timeout=timeout)


def test_the_blocker_blocks() -> None:
    proc = _run_without_web_stack("import reference_engine.server", timeout=60)
    assert proc.returncode != 0 and "absent on the GPU image" in proc.stderr


def test_gpu_roofline_runs_without_the_web_stack() -> None:
    code = ("import runpy; sys.argv = ['gpu_roofline.py', '--cpu-smoke']; "
            "runpy.run_path('benchmarks/gpu_roofline.py', run_name='__main__')")
    proc = _run_without_web_stack(code, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "decode graphs:" in proc.stdout and "offline target" in proc.stdout
    assert "failed" not in proc.stdout, proc.stdout[-2000:]  # the offline run catches its own errors


def test_gpu_check_tests_collect_without_the_web_stack() -> None:
    code = ("import pytest; sys.exit(pytest.main(['--collect-only', '-q', '--noconftest', '-p', 'no:cacheprovider', "
            "'tests/test_kernels.py', 'tests/test_gpu_path.py', 'tests/test_fused_kernels.py', "
            "'tests/test_gpu_portability.py']))")
    proc = _run_without_web_stack(code, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " error" not in proc.stdout.lower(), proc.stdout[-4000:]
