"""Issue 12's thin command line, held by reading the code: a verb -> handler table that covers every verb,
no verb module importing another or a private name of any slobench module, and one HTTP seam."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import slobench
from slobench import cli
from slobench.workload import TraceReplay, Workload, WorkloadSpec, load_workload
from slobench.workload.base import RunShape

ROOT = Path(slobench.__file__).parent
CLI = ROOT / "cli"
SHARED = {"__init__", "common"}  # the table and what the verbs share; every other module is a verb module
VERB_MODULES = sorted(p.stem for p in CLI.glob("*.py") if p.stem not in SHARED)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))  # __version__ is public


def imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every import anywhere in the file, function-level ones included."""
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.module, a.name) for a in node.names]
    return out


def test_every_verb_has_a_handler_and_every_handler_a_verb() -> None:
    sub = next(a for a in cli.build_parser()._actions if a.dest == "verb")
    assert set(sub.choices) == set(cli.HANDLERS)  # type: ignore[attr-defined]
    assert len(VERB_MODULES) >= 7


@pytest.mark.parametrize("stem", [*VERB_MODULES, "common"])
def test_no_verb_module_imports_another(stem: str) -> None:
    for module, name in imports(CLI / f"{stem}.py"):
        assert not any(module == f"slobench.cli.{v}" for v in VERB_MODULES if v != stem), (stem, module)
        if module == "slobench.cli":
            assert name not in VERB_MODULES, (stem, name)
        assert (module, name) != ("slobench", "cli"), stem


@pytest.mark.parametrize("stem", sorted(p.stem for p in CLI.glob("*.py")))
def test_the_cli_imports_no_private_name(stem: str) -> None:
    for module, name in imports(CLI / f"{stem}.py"):
        if module.startswith("slobench") or module.startswith("reference_engine"):
            assert not any(is_private(part) for part in module.split(".")), (stem, module)
            assert name is None or not is_private(name), (stem, module, name)


def test_no_module_but_the_transport_speaks_http_itself() -> None:
    # the seam: slobench/targets/transport.py; the test servers under slobench/testing/ serve, not fetch
    allowed = {ROOT / "targets" / "transport.py"}
    offenders = []
    for path in ROOT.rglob("*.py"):
        if path in allowed or "testing" in path.relative_to(ROOT).parts:
            continue
        for module, _name in imports(path):
            if module.split(".")[0] in ("httpx", "aiohttp", "requests", "urllib3"):
                offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert offenders == []


def test_the_run_verb_starts_without_what_only_reports_and_fits_need() -> None:
    # `slobench run` (and its --help) imports the whole load path; plotly, scipy and pyarrow are imported
    # where a report is drawn, a distribution fitted or a Parquet file written, each a tenth of a second
    # to a second of CPU that a run's start would otherwise pay.
    code = ("import sys, slobench.cli.run, slobench.cli.common; "
            "print(sorted(m for m in ('plotly', 'scipy', 'pyarrow', 'narwhals') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_demo_sweeps_without_reparsing_an_argument_list() -> None:
    tree = ast.parse((CLI / "engine.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    assert not [c for c in calls if c.func.attr in ("parse_args", "build_parser")]  # type: ignore[attr-defined]


def test_a_spec_and_a_trace_replay_are_both_workloads(tmp_path: Path) -> None:
    from slobench.errors import SpecError

    spec = load_workload("tiny")
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     + "".join(f"2023-11-16 18:15:0{i}.000000,{10 + i},{3 + i}\n" for i in range(5)))
    replay = TraceReplay.open(str(trace))
    assert isinstance(spec, WorkloadSpec) and isinstance(spec, Workload) and isinstance(replay, Workload)
    # one call for both: what LoadSetup.specs makes, and what the capacity search on a trace crashed on
    assert len(spec.specs(RunShape(rate_rps=5.0, num_requests=7, seed=1))) == 7
    assert [s.input_tokens for s in replay.specs(RunShape(rate_rps=2.0, seed=1))] == [10, 11, 12, 13, 14]
    assert [s.input_tokens for s in spec.specs(RunShape(num_requests=3, input_len=9))] == [9, 9, 9]
    with pytest.raises(SpecError, match="input_len"):
        replay.specs(RunShape(input_len=9))  # a trace has its own lengths: never silently ignored


def test_load_options_are_the_flags_defaults_with_the_values_given() -> None:
    from slobench.cli.common import load_options
    from slobench.cli.engine import DEMO_SLO
    from slobench.load_setup import LoadSetup

    # what demo hands LoadSetup: every name a load flag, the rest at the flags' defaults
    opts = load_options(url="http://127.0.0.1:9/v1", workload="tiny", rates="4,8", num_requests=80, slo=DEMO_SLO,
                        seed=3, out="runs/x", scrape_interval=0.5, no_progress=True)
    setup = LoadSetup(opts)
    assert setup.urls == ["http://127.0.0.1:9/v1"] and setup.workload.name == "tiny" and setup.slo is not None
    assert opts.timeout == 600.0 and opts.transport == "raw" and opts.warmup == "0"
    assert len(setup.specs(4.0)) == 80
    with pytest.raises(TypeError, match="no load flag 'rate_rps'"):
        load_options(rate_rps=4.0)
