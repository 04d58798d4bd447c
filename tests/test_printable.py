"""Text a server sends is shown, never obeyed: escape sequences in a model name or an error message reach
the terminal as visible escapes (`printable`), through the real CLI; the HTML report keeps them inert."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from slobench.cli import main
from slobench.printable import printable

TITLE = "\x1b]0;owned\x07"  # sets the window title
CLEAR = "\x1b[2J\x1b[H"  # clears the screen
MODEL = f"evil{TITLE}model\u202e"
ERROR = f"boom{CLEAR}\rgone\x9b31m\x00"


@pytest.mark.parametrize(("raw", "shown"), [
    ("plain text, tab\tand\nnewline", "plain text, tab\tand\nnewline"),
    (TITLE, "\\x1b]0;owned\\x07"),
    ("a\rb\x7fc\x9bd", "a\\x0db\\x7fc\\x9bd"),
    ("left\u202eright\u2066", "left\\u202eright\\u2066"),
    ("é ü 漢字", "é ü 漢字"),
])
def test_printable_escapes_only_what_a_terminal_obeys(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def hostile_url() -> Iterator[str]:
    """A server whose model name and error messages carry escape sequences: its first two answers are fine
    (preflight), every later one an HTTP 500 with the hostile message."""
    count = 0

    async def models(_r: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def completions(r: web.Request) -> web.Response:
        nonlocal count
        count += 1
        body = await r.json()
        if count > 2:
            return web.json_response({"error": {"message": ERROR, "type": "x"}}, status=500)
        n = int(body.get("max_tokens", 1))
        return web.json_response({"id": "c", "object": "text_completion", "model": MODEL,
                                  "choices": [{"index": 0, "text": "x" * n, "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    port = _free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}/v1"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_a_hostile_model_name_and_error_text_print_escaped(hostile_url: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = main(["run", "--url", hostile_url, "--no-stream", "--server-profile", "generic", "--workload", "tiny",
                 "--num-requests", "4", "--rate", "50", "--scrape-interval", "0", "--no-progress",
                 "--out", str(out), "--report", str(tmp_path / "r.html")])
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert code in (0, 1), text
    for c in ("\x1b", "\x07", "\x9b", "\x00", "\r", "\u202e"):
        assert c not in text, (c, text)
    assert "evil\\x1b]0;owned\\x07model" in text  # the title names the model, escaped
    assert "HTTP 500" in text and "boom" in text  # the error example
    # the files keep what the server sent; the HTML report escapes it for the page
    assert json.loads((out / "manifest.json").read_text())["target"]["model"] == MODEL
    html = (tmp_path / "r.html").read_text()
    assert "\x1b" not in html and "\x00" not in html


def test_an_error_line_from_a_server_is_escaped(hostile_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the model is not served: the preflight's error line quotes the server's answer
    assert main(["run", "--url", hostile_url, "--model", f"no{CLEAR}such", "--workload", "tiny",
                 "--num-requests", "2", "--out", str(tmp_path / "r")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "\x1b" not in err[0] and "no\\x1b[2J" in err[0], err
