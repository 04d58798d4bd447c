"""What slobench prints and writes stays the same byte for byte: a simulated run, sweep, capacity search,
summary and report are made afresh and compared with tests/golden/golden.json (regen.py beside it says
when and how to rewrite that file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.golden.regen import produce

GOLDEN = Path(__file__).parent / "golden" / "golden.json"


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return produce(tmp_path_factory.mktemp("golden"))


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("verb", ["run", "sweep", "capacity", "summarize", "report"])
def test_every_verb_prints_what_it_printed(produced: dict, golden: dict, verb: str) -> None:
    assert produced["outputs"][verb] == golden["outputs"][verb]


def test_every_file_written_is_the_same_byte_for_byte(produced: dict, golden: dict) -> None:
    assert sorted(produced["files"]) == sorted(golden["files"])
    changed = [name for name, digest in golden["files"].items() if produced["files"][name] != digest]
    assert changed == []
