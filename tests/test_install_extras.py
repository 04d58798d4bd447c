"""`pip install slobench` is the harness alone: no server stack, no torch (issue 12, item 7).

Each test runs the CLI in a fresh interpreter where FastAPI, uvicorn, Starlette and torch cannot be
imported, as on a machine that installed the base package only.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVER_STACK = ("fastapi", "uvicorn", "starlette")
MODEL_STACK = ("torch", "triton", "safetensors")

_BLOCKER = f"""
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {SERVER_STACK + MODEL_STACK!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not installed)", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
from slobench.cli import main
sys.exit(main(sys.argv[1:]))
"""


def slobench_base(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _BLOCKER, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})


def _names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("[")[0].strip().lower() for r in requirements}


def test_base_dependencies_carry_no_server_or_model_stack() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = _names(project["dependencies"])
    assert not base & set(SERVER_STACK + MODEL_STACK), base
    extras = project["optional-dependencies"]
    assert {"fastapi", "uvicorn"} <= _names(extras["serve"])
    assert {"torch", "slobench"} <= _names(extras["engine"])  # engine = serve + the model


def test_harness_verbs_work_without_the_server_and_model_stack(tmp_path: Path) -> None:
    help_ = slobench_base("--help", cwd=tmp_path)
    assert help_.returncode == 0, help_.stderr[-2000:]
    for verb in ("run", "sweep", "capacity", "gate", "report", "serve", "workload"):
        assert verb in help_.stdout
    run = slobench_base("run", "--simulate", "--workload", "tiny", "--rate", "4", "--num-requests", "20",
                        "--out", str(tmp_path / "r"), "--no-progress", cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert (tmp_path / "r" / "summary.json").is_file()
    rep = slobench_base("report", str(tmp_path / "r"), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert (tmp_path / "r.html").stat().st_size > 10_000


def test_serve_without_the_extra_is_exit_2_naming_it(tmp_path: Path) -> None:
    for verb in ("serve", "demo"):
        proc = slobench_base(verb, cwd=tmp_path)
        assert proc.returncode == 2, (verb, proc.stderr[-2000:])
        assert "pip install 'slobench[serve]'" in proc.stderr and "fastapi" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
