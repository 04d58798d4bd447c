"""The load options' defaults live in their types, not in argparse, and each group checks its values once,
whether they come from flags or from keywords."""

from __future__ import annotations

import json

import pytest

from slobench.cli import build_parser, main
from slobench.cli.common import options_from_args
from slobench.errors import UsageError
from slobench.load_options import FLAG_NAMES, LoadOptions, RunGroup, TargetGroup, WorkloadGroup


@pytest.mark.parametrize("verb", ["run", "sweep", "capacity"])
def test_argparse_holds_no_load_default(verb: str) -> None:
    args = build_parser([verb]).parse_args([verb, "--slo", "ttft=1s"])
    held = {name: getattr(args, name) for name in FLAG_NAMES if hasattr(args, name) and name != "slo"}
    assert held and all(v is None for v in held.values()), {k: v for k, v in held.items() if v is not None}


def test_flags_and_keywords_give_the_same_options() -> None:
    args = build_parser(["run"]).parse_args(["run", "--url", "http://h:1/v1", "--rate", "4", "--header", "A:b"])
    from_flags = options_from_args(args)
    from_keywords = LoadOptions.make("run", url="http://h:1/v1", rate=4.0, header=("A:b",))
    assert from_flags == from_keywords
    assert from_keywords.timeout == 600.0 and from_keywords.warmup == "0" and from_keywords.scrape_interval == 1.0
    assert from_keywords.headers == {"A": "b"} and from_keywords.seed == 0


@pytest.mark.parametrize(("values", "flag"), [
    ({"client_workers": 0}, "--client-workers"),
    ({"url": "ftp://h/v1"}, "--url"),
    ({"header": ("no colon",)}, "--header"),
    ({"rate": 1e-9}, "--rate"),
    ({"num_requests": 10**12}, "--num-requests"),
    ({"warmup": "soon"}, "--warmup"),
    ({"concurrency": 2, "max_in_flight": 2}, "--concurrency"),
    ({"rate_limit": "600/fortnight"}, "--rate-limit"),
    ({"slo": "ttft=500"}, "ttft"),
    ({"time_scale": 2.0}, "--time-scale"),
    ({"replicas": 3}, "--replicas"),
    ({"warmup": "9", "num_requests": 5}, "--warmup"),
])
def test_each_bad_value_is_named_from_keywords_and_from_flags(tmp_path, capsys, values: dict, flag: str) -> None:
    with pytest.raises(UsageError, match=flag):
        LoadOptions.make("run", **values)
    argv = ["run", "--out", str(tmp_path / "r"), "--no-progress"]
    for name, value in values.items():
        for v in value if isinstance(value, tuple) else (value,):
            argv += [f"--{name.replace('_', '-')}", str(v)]
    assert main(argv) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_groups_stand_alone() -> None:
    assert TargetGroup().transport == "raw" and WorkloadGroup().start == 0.0 and RunGroup().slo is None
    with pytest.raises(TypeError, match="no load flag 'rate_rps'"):
        LoadOptions.make("run", rate_rps=4.0)


def test_the_fleet_topology_is_the_sim_group_not_the_engine_knobs(tmp_path) -> None:
    argv = ["run", "--simulate", "--prefill-replicas", "2", "--decode-replicas", "1", "--kv-link", "50GB/s,20us",
            "--decode-kv-blocks", "300", "--workload", "tiny", "--num-requests", "6", "--no-progress",
            "--out", str(tmp_path / "r")]
    options = options_from_args(build_parser(["run"]).parse_args(argv))
    assert "prefill_replicas" not in options.engine_knobs and options.sim_group.prefill_replicas == 2
    assert main(argv) == 0

    fleet = json.loads((tmp_path / "r" / "manifest.json").read_text())["target"]["fleet"]
    assert (fleet["prefill"], fleet["decode"], fleet["kv_link"]) == (2, 1, "50GB/s,20us")


def test_a_decode_flag_without_a_disaggregated_fleet_is_refused() -> None:
    with pytest.raises(UsageError, match="--decode-profile applies only with --prefill-replicas"):
        LoadOptions.make("run", simulate=True, engine_knobs={}, decode_profile="cpu-tiny")
