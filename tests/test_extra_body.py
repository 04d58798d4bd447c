"""--extra-body adds fields; it never silently replaces one slobench sets (the model, the stream, the prompt,
the output length), and a default it may change (temperature) is said and recorded."""

from __future__ import annotations

import json

import pytest

from slobench.cli import main
from slobench.errors import UsageError
from slobench.targets.options import SET_BY_SLOBENCH, TargetOptions


@pytest.mark.parametrize("key", sorted(SET_BY_SLOBENCH))
def test_target_options_refuse_each_field_slobench_sets(key: str) -> None:
    with pytest.raises(UsageError, match=f"--extra-body: '{key}' is set by"):
        TargetOptions(extra_body={key: 1})


@pytest.mark.parametrize(("body", "flag"), [('{"model": "other-model"}', "--model"), ('{"stream": false}', "--no-stream"),
                                            ('{"max_tokens": 5}', "--output-len")])
def test_cli_refuses_before_any_request(tmp_path, capsys, body: str, flag: str) -> None:
    code = main(["run", "--url", "http://127.0.0.1:9/v1", "--extra-body", body, "--num-requests", "3",
                 "--out", str(tmp_path / "r"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--extra-body" in err and flag in err
    assert not (tmp_path / "r").exists()


def test_temperature_is_said_and_recorded(tmp_path, capsys, token_server_url) -> None:
    out = tmp_path / "r"
    code = main(["run", "--url", token_server_url, "--workload", "tiny", "--num-requests", "4", "--rate", "50",
                 "--extra-body", '{"temperature": 0.7, "top_p": 0.9}', "--out", str(out), "--no-progress",
                 "--scrape-interval", "0"])
    assert code == 0
    assert "--extra-body sets temperature to 0.7" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["extra_body_overrides"] == {"temperature": 0.7}


def test_fields_slobench_leaves_alone_pass_quietly() -> None:
    o = TargetOptions(extra_body={"top_p": 0.9, "seed": 3})
    assert o.extra_body_overrides == ()
