"""The README's headline figures, each page's headline section and the page's JSON say the same thing.

`benchmarks/headlines.py --write` makes the first two from the third; a benchmark writes the JSON
(`benchmarks/result_json.py`). Figures copied by hand into the README drift from their pages: this fails
when they do.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "benchmarks"))  # after everything else: a script never shadows a module

import headlines  # noqa: E402  (benchmarks/ is not a package: its scripts import each other by file name)
import result_json  # noqa: E402


def copy_of_the_docs(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    shutil.copytree(ROOT / "docs" / "measurements", tmp_path / "docs" / "measurements")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    return tmp_path


def test_readme_pages_and_json_agree() -> None:
    assert headlines.check(ROOT) == []


def test_every_readme_headline_row_comes_from_a_page_json() -> None:
    readme = (ROOT / "README.md").read_text()
    table = headlines.between(readme, headlines.README_BEGIN, headlines.README_END)
    assert table is not None, "the README's headline table is not the generated one"
    section = readme[readme.index("## Headline results"):]
    rows = [line for line in section.split("\n## ")[0].splitlines() if line.startswith("| [")]
    assert rows and all(row in table for row in rows), "a headline row outside the generated table"
    assert len(rows) == len(headlines.HEADLINES)


def test_a_figure_changed_in_the_json_is_caught_until_the_page_and_readme_are_remade(tmp_path: Path) -> None:
    root = copy_of_the_docs(tmp_path)
    path = root / "docs" / "measurements" / "soak.json"
    doc = json.loads(path.read_text())
    doc["figures"]["aborted"] = 4321
    path.write_text(json.dumps(doc))
    problems = headlines.check(root)
    assert any("soak.md" in p for p in problems) and any("README.md" in p for p in problems)
    headlines.write(root)
    assert headlines.check(root) == []
    assert "4,321 aborted by the client" in (root / "README.md").read_text()
    assert "| aborted by the client | 4,321 |" in (root / "docs" / "measurements" / "soak.md").read_text()


def test_a_figure_edited_on_the_page_or_in_the_readme_alone_is_caught(tmp_path: Path) -> None:
    root = copy_of_the_docs(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("3,950 aborted", "3,951 aborted"))
    page = root / "docs" / "measurements" / "gate_false_alarm.md"
    page.write_text(page.read_text().replace("| trials a candidate | 20 |", "| trials a candidate | 21 |"))
    problems = headlines.check(root)
    assert any("README.md" in p for p in problems) and any("gate_false_alarm.md" in p for p in problems)


def test_a_json_short_of_a_figure_its_headline_quotes_is_named(tmp_path: Path) -> None:
    root = copy_of_the_docs(tmp_path)
    path = root / "docs" / "measurements" / "trace_replay.json"
    doc = json.loads(path.read_text())
    del doc["figures"]["whole_rss_mib"]
    path.write_text(json.dumps(doc))
    assert any("trace_replay.json: no whole_rss_mib" in p for p in headlines.check(root))


def test_the_writer_refuses_part_of_a_headline_and_writes_one_the_page_takes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = copy_of_the_docs(tmp_path)
    out = root / "docs" / "measurements"
    before = (out / "soak.json").read_text()
    assert result_json.write_result("soak", {"requests": 4000, "aborted": 800}, out_dir=out) is None
    assert "harness_rss_growth_pct" in capsys.readouterr().err
    assert (out / "soak.json").read_text() == before
    figures = {"requests": 4000, "aborted": 800, "harness_rss_growth_pct": 1.25}
    assert result_json.write_result("soak", figures, out_dir=out) == out / "soak.json"
    doc = json.loads((out / "soak.json").read_text())
    assert doc["figures"] == figures and doc["command"].startswith("python benchmarks/")
    headlines.write(root)
    assert "4,000 requests, 800 aborted by the client: one record each, no KV block held, RSS +1.2%" in (
        root / "README.md").read_text()


def test_a_headline_made_of_several_runs_keeps_the_other_runs_figures(tmp_path: Path) -> None:
    out = copy_of_the_docs(tmp_path) / "docs" / "measurements"
    before = json.loads((out / "validate_published.json").read_text())["figures"]
    result_json.write_result("validate_published", {"vllm_within_3": 1, "vllm_runs": 5}, part=True, out_dir=out)
    doc = json.loads((out / "validate_published.json").read_text())
    assert doc["figures"] == {**before, "vllm_within_3": 1}
    assert "vllm_runs, vllm_within_3:" in doc["note"] and "the rest:" in doc["note"]


def test_every_headline_page_has_a_benchmark_that_writes_its_json() -> None:
    for h in headlines.HEADLINES:
        script = ROOT / "benchmarks" / f"{h.page}.py"
        assert f'write_result("{h.page}"' in script.read_text(), f"{script.name} does not write {h.page}.json"


def test_one_run_range_reads_as_one_value() -> None:
    h = headlines.headline_of("simulate_speed")
    one = headlines.sentence(h, {"figures": {"cpu_s_100k_min": 22.3, "cpu_s_100k_max": 22.3}})
    two = headlines.sentence(h, {"figures": {"cpu_s_100k_min": 2.3, "cpu_s_100k_max": 22.3}})
    assert "in 22.3 CPU s" in one and "in 2.3–22.3 CPU s" in two
