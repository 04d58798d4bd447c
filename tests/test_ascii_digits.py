"""A number in a flag, a profile name or a server's metric label is ASCII digits: `str.isdigit()` also takes
`²` and `٣`, which `int()` then refuses with a traceback (or reads as another number)."""

from __future__ import annotations

import pytest

from reference_engine.errors import ConfigError
from reference_engine.executor.modeled_executor import CostProfile
from slobench.cli import main
from slobench.errors import SpecError, UsageError
from slobench.profiles.roofline import roofline_from_name

SIM = ["run", "--simulate", "--num-requests", "4", "--rate", "2", "--no-progress"]


@pytest.mark.parametrize(("argv", "needle"), [
    (["--warmup", "\u00b2"], "--warmup"),
    (["--rate-limit", "\u00b2/s"], "--rate-limit"),
    (["--warmup", "\u0663"], "--warmup"),
])
def test_a_digit_that_is_not_ascii_is_refused_by_name(argv, needle, tmp_path, capsys):
    assert main([*SIM, "--out", str(tmp_path / "r"), *argv]) == 2
    assert needle in capsys.readouterr().err


def test_a_tensor_parallel_size_in_another_script_is_not_a_size():
    with pytest.raises((SpecError, UsageError)):
        roofline_from_name("roofline:h100/llama-3.1-8b/tp\u00b2")


def test_a_distserve_fit_with_a_superscript_tensor_parallel_size_is_refused_by_name():
    with pytest.raises(ConfigError, match="distserve:PATH@MODEL/tpN"):
        CostProfile.from_distserve("distserve:x.json@facebook/opt-13b/tp\u00b2")
