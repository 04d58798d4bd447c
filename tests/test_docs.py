"""README.md and every page of docs/guide run as written (tests/docs_blocks.py says how a page is read).

One test a page: its blocks run in order in a fresh directory, against one bundled engine (the modeled
executor) started for the module on a free port, or against the server the page itself starts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slobench.cli import EXIT_CODES

REPO = Path(__file__).resolve().parent.parent
PAGES = ("README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs" / "guide").glob("*.md")))


def runner() -> Any:
    """tests/docs_blocks.py, which needs Sybil (the dev extra)."""
    pytest.importorskip("sybil", reason="the docs runner needs Sybil (pip install -e '.[dev]')")
    import docs_blocks

    return docs_blocks


@pytest.fixture(scope="module")
def engine_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], int]]:
    """The module's bundled engine, started the first time a page needs it."""
    blocks = runner()
    holder = blocks.Page(workdir=tmp_path_factory.mktemp("engine"), engine_port=lambda: 0)

    def port() -> int:
        if holder.port is None:
            proc, holder.port = blocks.start_server("slobench serve --executor modeled --port 0", holder.workdir)
            holder.servers.append(proc)
        return holder.port

    yield port
    holder.stop()


@pytest.mark.parametrize("page", PAGES)
def test_the_page_runs_as_written(page: str, tmp_path: Path, engine_port: Callable[[], int]) -> None:
    ran = runner().run_page(page, tmp_path, engine_port)
    assert ran.ran or ran.skipped or "```" not in (REPO / page).read_text(), page


def test_every_exit_code_is_in_the_help_and_in_each_table() -> None:
    codes = re.findall(r"^\s*(\d+)\s", EXIT_CODES, re.M)
    assert {"6", "130"} <= set(codes)
    for page in ("README.md", "docs/guide/running-load.md"):
        text = (REPO / page).read_text()
        table = re.findall(r"^\| (\d+) \|", text.split("## Exit codes", 1)[1], re.M)
        assert table == codes, (page, table, codes)


def test_a_directive_that_no_longer_matches_its_block_fails() -> None:
    Directive = runner().Directive
    directive = Directive.parse("replace --duration 60 => --duration 2; exit 0|4; creates a b; output pass")
    assert directive.exit_codes == (0, 4) and directive.creates == ("a", "b") and directive.output == ("pass",)
    assert directive.apply("x --duration 60", "p:1") == "x --duration 2"
    with pytest.raises(AssertionError, match="no longer holds"):
        directive.apply("x --duration 30", "p:1")
    with pytest.raises(ValueError, match="unknown statement"):
        Directive.parse("skip")
