"""One check for every value, whether it comes from a workload TOML, the Python API or a flag: the same
field, value and (for a file) the file named, never a traceback."""

from __future__ import annotations

import pytest

from slobench.cli import main
from slobench.errors import SlobenchError, SpecError, UsageError
from slobench.workload import WorkloadSpec
from slobench.workload.arrivals import PoissonArrivals
from slobench.workload.base import RunShape
from slobench.workload.lengths import FixedLength, LogNormalLength

LENGTHS = '[input]\ndist = "fixed"\nvalue = 16\n[output]\ndist = "fixed"\nvalue = 8\n'

# (TOML text, the field the message names, a fragment of the bad value as printed)
CASES = {
    "num_requests": ("num_requests = 100000000000000000000000\n" + LENGTHS, "num_requests", "100000000000000000000000"),
    "duration_s": ("duration_s = 1e300\n" + LENGTHS, "duration_s", "1e+300"),
    "rate_rps": ("num_requests = 10\n" + LENGTHS + '[arrival]\nprocess = "poisson"\nrate_rps = 1e-300\n',
                 "arrival.rate_rps", "1e-300"),
    "token_ids": ("num_requests = 10\ntoken_ids = [0, 100000000000000000000]\n" + LENGTHS, "token_ids",
                  "100000000000000000000"),
    "sigma": ('num_requests = 10\n[input]\ndist = "lognormal"\nmu = 5.0\nsigma = 1e6\n'
              '[output]\ndist = "fixed"\nvalue = 8\n', "input.sigma", "1000000.0"),
    "value": ('num_requests = 10\n[input]\ndist = "fixed"\nvalue = 100000000000\n[output]\ndist = "fixed"\n'
              'value = 8\n', "input.value", "100000000000"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_toml_value_is_refused_naming_field_value_and_file(tmp_path, case: str) -> None:
    text, field, value = CASES[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        WorkloadSpec.from_toml(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: {field}:") and value in msg


@pytest.mark.parametrize("case", sorted(CASES))
def test_toml_value_from_the_cli_is_exit_2(tmp_path, capsys, case: str) -> None:
    path = tmp_path / f"{case}.toml"
    path.write_text(CASES[case][0])
    code = main(["run", "--simulate", "--workload", str(path), "--out", str(tmp_path / "r"), "--no-progress"])
    assert code == 2
    assert f"{path}: {CASES[case][1]}" in capsys.readouterr().err


def test_deep_nesting_is_named_not_a_recursion_error(tmp_path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n" + LENGTHS)
    with pytest.raises(UsageError, match="deep.toml: arrays or inline tables nested too deeply"):
        WorkloadSpec.from_toml(path)


def _spec(**kw) -> WorkloadSpec:
    return WorkloadSpec(name="api", input=FixedLength(16), output=FixedLength(8), **kw)


@pytest.mark.parametrize(("build", "field"), [
    (lambda: _spec(num_requests=10**23), "num_requests"),
    (lambda: _spec(duration_s=1e300), "duration_s"),
    (lambda: _spec(token_ids=(0, 10**20)), "token_ids"),
    (lambda: PoissonArrivals(1e-300), "rate_rps"),
    (lambda: LogNormalLength.from_mu_sigma(5.0, 1e6), "sigma"),
    (lambda: FixedLength(10**11), "value"),
    (lambda: RunShape(num_requests=10**23), "num_requests"),
    (lambda: RunShape(rate_rps=1e-300), "rate_rps"),
    (lambda: RunShape(rate_rps=1e6, duration_s=1e5), "duration_s"),
    (lambda: RunShape(input_len=10**9), "input_len"),
])
def test_python_api_values_meet_the_same_check(build, field: str) -> None:
    with pytest.raises(SpecError) as err:
        build()
    assert err.value.field == field


def test_a_generated_run_stays_in_range() -> None:
    spec = _spec(num_requests=10, arrival=PoissonArrivals(2.0))
    assert len(list(spec.specs(RunShape(seed=1)))) == 10


def test_run_load_refuses_before_connecting() -> None:
    from slobench import run_load
    with pytest.raises(SlobenchError, match="num_requests|num-requests"):
        run_load("http://127.0.0.1:9/v1", model="m", num_requests=10**23, rate=1.0)
