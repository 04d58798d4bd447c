"""The `Target` protocol is complete: every concrete target has every member, the optional ones from
`TargetBase`, and nobody reads a target's members by probing (`hasattr`/`getattr`)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest

import slobench.fleet
import slobench.targets
from slobench.errors import UsageError
from slobench.fleet.client_routed import FleetTarget
from slobench.run.clock import Clock
from slobench.run.records import RequestRecord, RequestSpec
from slobench.run.runner import RunOptions, run
from slobench.targets.base import Target, TargetBase
from slobench.targets.capabilities import Capabilities
from slobench.targets.engine import EngineTarget
from slobench.targets.openai import OpenAITarget
from slobench.targets.options import TargetOptions
from slobench.targets.ray_pool import RayPool
from slobench.targets.workers import WorkerPool

ROOT = Path(__file__).resolve().parents[1]
QUIET = RunOptions(progress=False)


def protocol_members() -> set[str]:
    names = set(Target.__annotations__)
    names |= {k for k, v in vars(Target).items() if not k.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


def concrete_targets() -> set[type]:
    """Every class in slobench.targets and slobench.fleet that sends requests (has `send`)."""
    found: set[type] = set()
    for pkg in (slobench.targets, slobench.fleet):
        for info in pkgutil.iter_modules(pkg.__path__):
            mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
            for _, cls in inspect.getmembers(mod, inspect.isclass):
                if cls.__module__ == mod.__name__ and cls is not TargetBase and issubclass(cls, TargetBase) and (
                        hasattr(cls, "send")):
                    found.add(cls)
    return found


def instances(clock: Clock) -> dict[type, Any]:
    url, options = "http://127.0.0.1:9/v1", TargetOptions(model="m")
    one = OpenAITarget(url, options, clock)
    return {
        OpenAITarget: one,
        EngineTarget: EngineTarget({"executor": "modeled", "profile": "cpu-tiny", "kv_blocks": 64}, clock, model_name="m"),
        WorkerPool: WorkerPool(2, url, options, clock),
        RayPool: RayPool(2, url, options, clock),
        FleetTarget: FleetTarget([one, OpenAITarget(url, options, clock)]),
    }


def test_the_protocol_lists_the_optional_parts() -> None:
    assert protocol_members() == {
        "clock", "send_lead_s", "records_live", "model", "caps", "start", "preflight", "send", "close", "check_compatible",
        "describe", "fleet_summary", "negotiation_notes",
    }


def test_every_concrete_target_has_every_member() -> None:
    made = instances(Clock())
    assert concrete_targets() == set(made), "a new target: add it to instances() here"
    for cls, target in made.items():
        missing = [m for m in sorted(protocol_members()) if not hasattr(target, m)]
        assert not missing, f"{cls.__name__} lacks {missing}"
        assert isinstance(target.send_lead_s, float) and target.model == "m" and target.clock is made[OpenAITarget].clock
        assert isinstance(target.describe(), dict) and isinstance(target.negotiation_notes(), list)
        # what reaches a server is each target's own, never a default
        for m in ("send", "preflight"):
            assert getattr(cls, m) is not getattr(TargetBase, m, None), f"{cls.__name__}.{m} is not its own"


class Fake(TargetBase):
    def __init__(self, clock: Clock, *, lead_s: float = 0.0, notes: tuple[str, ...] = (), refuse: bool = False):
        self.clock = clock
        self.send_lead_s = lead_s
        self.caps = Capabilities(notes=notes)
        self.refuse = refuse
        self.model = "fake"

    def check_compatible(self, spec: RequestSpec) -> None:
        if self.refuse:
            raise UsageError(f"request {spec.request_id}: refused")

    async def send(self, spec: RequestSpec, record: RequestRecord) -> None:
        record.sent_s = record.first_token_s = record.done_s = self.clock.now_s()
        record.output_tokens = 1


def test_defaults() -> None:
    class Bare(TargetBase):
        def __init__(self) -> None:
            self.clock = Clock()

    t = Bare()
    spec = RequestSpec(0, 0.0, (1,), 1, 1)
    assert t.send_lead_s == 0.0 and t.model == "" and t.caps is None
    assert t.check_compatible(spec) is None and t.fleet_summary() is None and t.negotiation_notes() == []
    assert t.describe() == {"kind": "Bare"}


def test_fleet_joins_its_replicas_members() -> None:
    clock = Clock()
    a = Fake(clock, lead_s=0.005, notes=("no ignore_eos", "usage counted"))
    b = Fake(clock, lead_s=0.25, notes=("usage counted", "text prompts"))
    fleet = FleetTarget([a, b], "round-robin")
    assert fleet.send_lead_s == 0.005 and fleet.model == "fake" and not fleet.records_live
    assert fleet.negotiation_notes() == ["no ignore_eos", "usage counted", "text prompts"]
    assert fleet.describe() == {"kind": "Fake", "fleet": {"replicas": 2, "router": "round-robin",
                                                          "targets": [{"kind": "Fake"}, {"kind": "Fake"}]}}
    spec = RequestSpec(3, 0.0, (1,), 1, 1)
    fleet.check_compatible(spec)
    b.refuse = True
    with pytest.raises(UsageError, match="request 3: refused"):
        fleet.check_compatible(spec)


async def test_runner_reads_the_members_directly(tmp_path: Path) -> None:
    clock = Clock()
    specs = [RequestSpec(i, 0.001 * i, (1,), 1, 1) for i in range(4)]
    res = await run(specs, Fake(clock), opts=QUIET, handle_sigint=False)
    assert res.summary.num_ok == 4 and res.summary.fleet is None  # fleet_summary() is None
    res = await run(specs, FleetTarget([Fake(clock), Fake(clock)], "round-robin"), opts=QUIET, handle_sigint=False)
    assert res.summary.fleet == {"replicas": 2, "router": "round-robin", "requests_per_replica": [2, 2]}
    with pytest.raises(UsageError, match="refused"):  # refused before anything is sent
        await run(specs, Fake(clock, refuse=True), opts=QUIET, handle_sigint=False, run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match="target's own clock"):
        await run(specs, Fake(clock), clock=Clock(), opts=QUIET, handle_sigint=False)


# names a target goes by in the code that drives targets
_TARGET_NAME = re.compile(r"(^|\.)_?(targets?|t|inner|probe)(\[[^\]]*\])?$")


def _probes_on_targets(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text())
    target_classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and any(
        isinstance(f, ast.AsyncFunctionDef) and f.name == "send" for f in n.body)]
    in_target_class = {id(n) for c in target_classes for n in ast.walk(c)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr") and node.args):
            continue
        obj = ast.unparse(node.args[0])
        if _TARGET_NAME.search(obj) or (obj == "self" and id(node) in in_target_class):
            found.append((node.lineno, node.col_offset, f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}"))
    return [hit for *_, hit in sorted(found)]


def test_probe_finder_finds_probes(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text("class A:\n    async def send(self):\n        return getattr(self, 'x', 0)\n"
                   "def f(target, targets, spec):\n    hasattr(target, 'a'); getattr(targets[0], 'b', 1)\n"
                   "    getattr(spec, 'fill', None); getattr(self.target, 'c', None)\n")
    found = [hit.split(": ", 1)[1] for hit in _probes_on_targets(src, tmp_path)]
    assert found == ["getattr(self, 'x', 0)", "hasattr(target, 'a')", "getattr(targets[0], 'b', 1)",
                     "getattr(self.target, 'c', None)"]


def test_no_target_is_probed_with_hasattr_or_getattr() -> None:
    files = [ROOT / "slobench" / "run" / "runner.py", *sorted((ROOT / "slobench" / "targets").glob("*.py")),
             *sorted((ROOT / "slobench" / "fleet").glob("*.py"))]
    found = [hit for f in files for hit in _probes_on_targets(f)]
    assert not found, "read the Target protocol's members directly:\n" + "\n".join(found)
