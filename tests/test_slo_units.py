"""A bare number in an SLO is refused with the fix named, wherever the SLO comes from."""

from __future__ import annotations

import pytest

from slobench.analysis.slo import SLO
from slobench.ci_action import Inputs
from slobench.cli import main
from slobench.errors import SpecError


@pytest.mark.parametrize(("text", "hint"), [
    ("ttft=500", "ttft=500ms or ttft=0.5s"),
    ("ttft=500ms,tpot=0.05", "tpot=0.05s or tpot=50ms"),
    ("e2e=2", "e2e=2ms or e2e=0.002s"),
])
def test_flag_text_with_a_bare_number_is_refused(text: str, hint: str) -> None:
    with pytest.raises(SpecError, match=f"give a unit, e.g. {hint}"):
        SLO.parse(text)


def test_units_are_read() -> None:
    s = SLO.parse("ttft=500ms,tpot=40ms,e2e=2s")
    assert (s.ttft_s, s.tpot_s, s.e2e_s) == (0.5, 0.04, 2.0)


def test_toml_bare_number_refused_but_seconds_in_the_name_kept(tmp_path) -> None:
    bare = tmp_path / "bare.toml"
    bare.write_text("[slo]\nttft = 500\n")
    with pytest.raises(SpecError, match="slo.ttft: give a unit"):
        SLO.from_toml(bare)
    named = tmp_path / "named.toml"
    named.write_text('[slo]\nttft_s = 0.5\ntpot = "50ms"\n')
    assert SLO.from_toml(named) == SLO(ttft_s=0.5, tpot_s=0.05)


def test_summary_round_trip_still_reads() -> None:
    s = SLO.parse("ttft=300ms,target=95%")
    assert SLO.from_dict(s.to_dict()) == s


def test_cli_refuses_before_running(tmp_path, capsys) -> None:
    code = main(["run", "--simulate", "--workload", "tiny", "--num-requests", "5", "--slo", "ttft=500",
                 "--out", str(tmp_path / "r"), "--no-progress"])
    assert code == 2
    assert "ttft=500ms or ttft=0.5s" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_api_refuses() -> None:
    from slobench import run_load
    with pytest.raises(SpecError, match="give a unit"):
        run_load("http://127.0.0.1:9/v1", model="m", slo="ttft=500", num_requests=1, rate=1.0)


def test_action_input_refused_before_the_server_starts() -> None:
    with pytest.raises(SpecError, match="give a unit"):
        Inputs.from_env({"INPUT_SLO": "ttft=500,tpot=50ms"})
