from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import slobench.workload as workload
from slobench.errors import SpecError, UsageError
from slobench.workload import (
    FixedLength,
    GammaArrivals,
    LogNormalLength,
    PoissonArrivals,
    WorkloadSpec,
    generate,
    list_workloads,
    load_workload,
)

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-2023"

SPEC_TOML = """\
name = "demo"
description = "a test workload"
num_requests = 50
min_tokens = "max"

[arrival]
process = "gamma"
rate_rps = 4.0
cv = 2.0

[input]
dist = "lognormal"
median = 200
p99 = 900
max = 2048

[output]
dist = "uniform"
min = 4
max = 32
"""


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def small_spec(**kw) -> WorkloadSpec:
    base = WorkloadSpec(
        name="small",
        input=LogNormalLength(100, 400, 1, 1000),
        output=LogNormalLength(20, 80, 1, 200),
        arrival=PoissonArrivals(5.0),
        num_requests=200,
    )
    return replace(base, **kw)


def test_public_api_is_pinned():
    assert set(workload.__all__) == {
        "DEFAULT_TOKEN_ID_RANGE", "WORDS", "WORKLOADS_DIR", "ArrivalProcess", "ConstantArrivals",
        "EmpiricalLength", "FixedLength", "GammaArrivals", "LengthDist", "LogNormalLength", "ParetoLength",
        "PoissonArrivals", "UniformLength", "WorkloadSpec", "ZipfLength", "generate", "length_from_dict",
        "list_workloads", "load_workload", "make_arrivals", "random_text", "random_token_ids",
        "text_prompts", "token_prompts",
        # traces, phases, sessions (issue 6)
        "CurveArrivals", "DiurnalArrivals", "Phase", "RequestClass", "SessionSpec", "SystemPrompts",
        "ThinkTime", "Trace", "TraceEntry", "TraceReplay", "detect_format", "load_trace",
        "phase_boundaries", "replay",
        "Workload",  # the protocol every source of requests implements (issue 12)
    }
    assert all(hasattr(workload, name) for name in workload.__all__)


def test_from_toml_reads_every_section(tmp_path):
    spec = WorkloadSpec.from_toml(write(tmp_path, SPEC_TOML))
    assert spec.name == "demo" and spec.num_requests == 50 and spec.min_tokens == "max"
    assert spec.arrival == GammaArrivals(4.0, 2.0)
    assert spec.input == LogNormalLength(200, 900, 1, 2048)
    assert str(spec.output) == "uniform[4,32]"
    assert spec.ignore_eos is True and spec.api == "completions" and spec.prompt == "tokens"


def test_name_defaults_to_file_stem(tmp_path):
    text = SPEC_TOML.replace('name = "demo"\n', "")
    assert WorkloadSpec.from_toml(write(tmp_path, text, "my-load.toml")).name == "my-load"


@pytest.mark.parametrize("name", ["chat", "code", "long-doc", "long-gen", "tiny"])
def test_bundled_specs_load_and_round_trip(name):
    spec = load_workload(name)
    assert spec.name == name and spec.description
    assert WorkloadSpec.from_dict(spec.to_dict()) == spec
    assert None not in spec.to_dict().values()


def test_list_workloads_has_the_bundled_ones():
    assert {"chat", "code", "long-doc", "long-gen", "tiny"} <= set(list_workloads())


def test_load_workload_by_path(tmp_path):
    path = write(tmp_path, SPEC_TOML)
    assert load_workload(str(path)) == load_workload(path) == WorkloadSpec.from_toml(path)


def test_unknown_workload_lists_the_available_names():
    with pytest.raises(SpecError) as e:
        load_workload("chatt")
    assert e.value.field == "workload" and "chat" in str(e.value) and "long-doc" in str(e.value)


def test_missing_file_and_bad_toml_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        load_workload(tmp_path / "nope.toml")
    with pytest.raises(UsageError, match="not valid TOML"):
        WorkloadSpec.from_toml(write(tmp_path, "name = [unclosed"))


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("rate_rps = 4.0", "rate_rps = -4.0", "arrival.rate_rps"),
        ("cv = 2.0", "cv = 0", "arrival.cv"),
        ('process = "gamma"', 'process = "gama"', "arrival.process"),
        ("cv = 2.0", "cv = 2.0\nrate = 3", "arrival.rate"),
        ("p99 = 900", "p99 = 100", "input.p99"),
        ('dist = "uniform"', 'dist = "gauss"', "output.dist"),
        ("max = 2048", "max = 2048\nmeadian = 3", "input.meadian"),
        ("num_requests = 50", "num_request = 50", "num_request"),
        ("num_requests = 50", "num_requests = 0", "num_requests"),
        ("num_requests = 50", "duration_s = -1", "duration_s"),
        ('min_tokens = "max"', 'min_tokens = "all"', "min_tokens"),
        ('min_tokens = "max"', 'api = "grpc"', "api"),
        ('min_tokens = "max"', 'api = "chat"', "prompt"),
        ('min_tokens = "max"', "ignore_eos = 1", "ignore_eos"),
        ('min_tokens = "max"', "token_ids = [500, 100]", "token_ids"),
        ("[output]", "[outputs]", "outputs"),
    ],
)
def test_bad_spec_values_name_the_field_and_the_file(tmp_path, old, new, field):
    assert old in SPEC_TOML
    path = write(tmp_path, SPEC_TOML.replace(old, new, 1))
    with pytest.raises(SpecError) as e:
        WorkloadSpec.from_toml(path)
    assert e.value.field == field
    assert str(e.value).startswith(f"{path}: {field}:")


def test_missing_length_table_is_named():
    d = small_spec().to_dict()
    del d["output"]
    with pytest.raises(SpecError) as e:
        WorkloadSpec.from_dict(d)
    assert e.value.field == "output"


def test_generate_fills_request_specs():
    spec = small_spec(min_tokens="max")
    reqs = generate(spec, seed=3)
    assert [r.request_id for r in reqs] == list(range(200))
    assert all(r.tag == "small" and r.ignore_eos for r in reqs)
    assert all(len(r.prompt) == r.input_tokens for r in reqs)
    assert all(r.min_tokens == r.max_tokens for r in reqs)
    times = [r.arrival_s for r in reqs]
    assert times == sorted(times) and times[0] > 0
    assert generate(small_spec(), seed=3)[0].min_tokens is None


def test_same_seed_same_requests_different_seed_different():
    spec = small_spec()
    assert generate(spec, seed=5) == generate(spec, seed=5)
    a, b = generate(spec, seed=5), generate(spec, seed=6)
    assert [r.input_tokens for r in a] != [r.input_tokens for r in b]
    assert [r.arrival_s for r in a] != [r.arrival_s for r in b]


def test_changing_the_rate_keeps_lengths_and_scales_arrivals():
    spec = small_spec(arrival=GammaArrivals(2.0, 2.0))
    slow, fast = generate(spec, seed=1), generate(spec, seed=1, rate_rps=8.0)
    assert [r.input_tokens for r in slow] == [r.input_tokens for r in fast]
    assert [r.max_tokens for r in slow] == [r.max_tokens for r in fast]
    np.testing.assert_allclose([r.arrival_s * 4 for r in fast], [r.arrival_s for r in slow], rtol=1e-12)
    # ...but not prompt content: runs of a sweep must not hit each other's prefix cache.
    assert slow[0].prompt[:16] != fast[0].prompt[:16]


def test_first_requests_do_not_depend_on_the_total():
    spec = small_spec()
    assert generate(spec, num_requests=20, seed=2) == generate(spec, num_requests=300, seed=2)[:20]


def test_overrides_win_over_the_spec():
    spec = small_spec()
    reqs = generate(spec, num_requests=30, input_len=64, output_len=8, api="chat")
    assert len(reqs) == 30
    assert all(r.input_tokens == 64 and r.max_tokens == 8 for r in reqs)
    assert all(isinstance(r.prompt, str) and len(r.prompt.split()) == 64 for r in reqs)


def test_duration_override_replaces_the_spec_count():
    reqs = generate(small_spec(), duration_s=100.0)  # spec says 200 requests; 5 rps x 100 s ≈ 500
    assert len(reqs) > 400 and reqs[-1].arrival_s < 100.0


def test_generate_needs_a_bound_and_valid_overrides():
    with pytest.raises(SpecError) as e:
        generate(small_spec(num_requests=None))
    assert e.value.field == "num_requests"
    for kwargs, field in [
        ({"input_len": 0}, "input_len"),
        ({"rate_rps": -1.0}, "rate_rps"),
        ({"api": "grpc"}, "api"),
        ({"seed": -1}, "seed"),
    ]:
        with pytest.raises(SpecError) as e:
            generate(small_spec(), **kwargs)
        assert e.value.field == field


def test_text_prompt_spec_gives_text_on_completions():
    reqs = generate(small_spec(prompt="text"), num_requests=5)
    assert all(isinstance(r.prompt, str) for r in reqs)


def test_tiny_spec_uses_its_id_range():
    reqs = generate(load_workload("tiny"))
    assert len(reqs) == 64
    assert all(32 <= t < 256 for r in reqs for t in r.prompt)
    assert all(32 <= r.input_tokens <= 256 and 8 <= r.max_tokens <= 64 for r in reqs)


@pytest.mark.parametrize(
    ("name", "in_p50", "in_p99", "out_p50", "out_p99"),
    [("chat", 1020, 4140, 129, 600), ("code", 1470, 7440, 13, 250)],
)
def test_bundled_specs_generate_their_target_quantiles(name, in_p50, in_p99, out_p50, out_p99):
    reqs = generate(load_workload(name), num_requests=10_000, seed=0)
    ins = np.array([r.input_tokens for r in reqs])
    outs = np.array([r.max_tokens for r in reqs])
    assert np.quantile(ins, 0.5) == pytest.approx(in_p50, rel=0.10)
    assert np.quantile(ins, 0.99) == pytest.approx(in_p99, rel=0.10)
    assert np.quantile(outs, 0.5) == pytest.approx(out_p50, rel=0.10)
    assert np.quantile(outs, 0.99) == pytest.approx(out_p99, rel=0.10)


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"Azure traces not present at {TRACES}")
@pytest.mark.parametrize(("name", "trace"), [("chat", "conv"), ("code", "code")])
def test_bundled_specs_match_the_trace_they_were_fitted_to(name, trace):
    data = np.loadtxt(
        TRACES / f"AzureLLMInferenceTrace_{trace}.csv", delimiter=",", skiprows=1, usecols=(1, 2)
    )
    spec = load_workload(name)
    assert isinstance(spec.input, LogNormalLength) and isinstance(spec.output, LogNormalLength)
    for dist, column in ((spec.input, data[:, 0]), (spec.output, data[:, 1])):
        assert dist.median == pytest.approx(np.median(column), rel=0.01)
        assert dist.p99 == pytest.approx(np.quantile(column, 0.99), rel=0.01)
    # The arrival rate is the trace's own mean rate (one hour sample).
    assert spec.arrival.rate_rps == pytest.approx(len(data) / 3500, rel=0.05)


def test_fixed_override_equals_a_fixed_spec():
    spec = small_spec()
    a = generate(spec, input_len=33, seed=4)
    b = generate(replace(spec, input=FixedLength(33)), seed=4)
    assert a == b
