"""One model-name vocabulary (`slobench.profiles.specs.MODEL_NAMES`): every flag that takes a model name
takes every name it lists."""

from __future__ import annotations

import json

import pytest

from slobench.cli import main
from slobench.profiles.specs import MODEL_NAMES


def test_the_vocabulary_holds_the_engine_configs_and_the_roofline_models() -> None:
    assert {"tiny", "llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b"} <= set(MODEL_NAMES)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_profile_takes_every_name(tmp_path, name: str) -> None:
    out = tmp_path / "p.json"
    assert main(["profile", "--gpu", "h200", "--model", name, "--tp", "8", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["name"]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_roofline_profile_and_disaggregated_model_take_every_name(tmp_path, name: str) -> None:
    out = tmp_path / "r"
    code = main(["run", "--simulate", "--profile", f"roofline:h200/{name}/tp8", "--model", name,
                 "--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "50GB/s,20us", "--workload", "tiny",
                 "--input-len", "16", "--output-len", "4", "--num-requests", "5", "--out", str(out), "--no-progress"])
    assert code == 0
    knobs = json.loads((out / "manifest.json").read_text())["target"]["knobs"]
    assert knobs["model"] == name and knobs["profile"] == f"roofline:h200/{name}/tp8"


def test_an_unknown_name_lists_the_vocabulary(tmp_path, capsys) -> None:
    code = main(["run", "--simulate", "--model", "llama-9-9b", "--prefill-replicas", "1", "--decode-replicas", "1",
                 "--workload", "tiny", "--num-requests", "3", "--out", str(tmp_path / "r"), "--no-progress"])
    assert code == 2
    assert "llama-3.1-8b" in capsys.readouterr().err
