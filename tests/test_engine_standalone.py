"""The bundled engine stands alone (issue 12, item 4): nothing under reference_engine/ imports slobench,
and its errors reach slobench's command line as exit 2 with the engine's own words."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from reference_engine.errors import ConfigError, EngineError
from reference_engine.executor.modeled_executor import CostProfile
from slobench.cli import main
from slobench.errors import EngineConfigError, SpecError

ENGINE = Path(__file__).resolve().parent.parent / "reference_engine"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_engine_module_imports_slobench() -> None:
    offenders = [str(p.relative_to(ENGINE)) for p in sorted(ENGINE.rglob("*.py")) if "slobench" in _imports(p)]
    assert offenders == []


def test_the_engine_builds_and_steps_with_slobench_unimportable() -> None:
    code = """
import importlib.abc, sys
class _No(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'slobench':
            raise ModuleNotFoundError(name, name=name)
sys.meta_path.insert(0, _No())
from reference_engine.builder import build_engine
from reference_engine.config import EngineSpec
from reference_engine.errors import ConfigError
engine, tok = build_engine(EngineSpec(executor='modeled', profile='cpu-tiny', kv_blocks=64))
try:
    build_engine(EngineSpec(executor='modeled', profile='cpu-tiny', kv_blocks=0))
except ConfigError as e:
    print('refused:', e)
try:
    build_engine(EngineSpec(executor='modeled', profile='roofline:h100/llama-3.1-8b', kv_blocks=64))
except ConfigError as e:
    print('refused:', e)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: kv_blocks: must be an integer >= 1 (got 0)" in proc.stdout
    assert "roofline profiles are built by slobench.profiles" in proc.stdout


def test_one_except_catches_a_bad_setting_from_either_side() -> None:
    with pytest.raises(EngineConfigError):
        CostProfile.load("no-such-profile")
    assert issubclass(SpecError, ConfigError) and issubclass(ConfigError, EngineError) and EngineConfigError is ConfigError
    err = SpecError("slo.ttft", -1, "must be a positive duration")
    assert str(err) == "slo.ttft: must be a positive duration (got -1)" and err.exit_code == 2


def test_an_engine_error_is_exit_2_with_its_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--simulate", "--workload", "tiny", "--rate", "2", "--num-requests", "3", "--no-progress",
               "--profile", "no-such-profile", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "profile: no such profile file" in err and "Traceback" not in err
    # a roofline name resolves through slobench.profiles when slobench is the caller
    rc = main(["run", "--simulate", "--workload", "tiny", "--rate", "2", "--num-requests", "3", "--no-progress",
               "--profile", "roofline:h100/llama-3.1-8b", "--out", str(tmp_path / "r2")])
    assert rc in (0, 1), capsys.readouterr().err[-2000:]
