"""The fenced blocks of README.md and docs/guide/*.md, run as a user runs them (tests/test_docs.py).

Sybil reads a page: it finds the fenced ```sh and ```python blocks and the HTML comments before them,
with their line numbers, and evaluates them in page order in one namespace, so a later block sees what
an earlier one wrote. Python blocks are executed as they stand; a shell block runs as one
`bash -euo pipefail` script. Every page runs in a fresh directory of its own.

Two rules apply to every block, with no markup:
- the port: `127.0.0.1:8000` and `--port 8000` become the page's server's port: the module's bundled
  engine's (a free one), or that of the server the page started (below);
- a block whose caption (the paragraph right above it) contains "(illustrative" is not run; the
  caption is what the reader sees.

Anything else is said by one directive, an HTML comment right before the block (GitHub does not show it),
statements separated by `;`:

    <!-- doctest: replace --duration 60 => --duration 2; exit 4; creates runs/x/sweep.json; output pass -->

- `replace OLD => NEW`: shortened for CI; OLD must occur in the block (a directive that no longer
  matches its block fails rather than silently running the long version);
- `exit N` or `exit N|M`: the exit status the page promises (default 0); for Python, 0 only;
- `creates PATH ...`: files the block must leave, relative to the page's directory;
- `output TEXT`: the block's stdout and stderr together must contain TEXT (a verdict, a headline);
- `copy PATH ...`: repository files the block reads, copied into the page's directory first;
- `file PATH`: (a ```toml block) the block is written to PATH, for the blocks after it to read;
- `background`: the block starts a server; it runs until it prints `LISTENING`, then stays up (its
  port then serves the rest of the page) until the page ends.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sybil import Document, Example, Region
from sybil.parsers.markdown.codeblock import CodeBlockParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

REPO = Path(__file__).resolve().parent.parent
BLOCK_TIMEOUT_S = 180.0
LISTEN_TIMEOUT_S = 60.0
PORT_PATTERN = re.compile(r"(127\.0\.0\.1:|--port )8000\b")


@dataclass(frozen=True, slots=True)
class Directive:
    """What the comment before a block says about it (module docstring)."""

    replacements: tuple[tuple[str, str], ...] = ()
    exit_codes: tuple[int, ...] = (0,)
    creates: tuple[str, ...] = ()
    output: tuple[str, ...] = ()
    copies: tuple[str, ...] = ()
    file: str | None = None
    is_background: bool = False

    @classmethod
    def parse(cls, text: str) -> Directive:
        fields: dict[str, list] = {"replacements": [], "creates": [], "output": [], "copies": []}
        exit_codes: tuple[int, ...] = (0,)
        is_background = False
        file = None
        for statement in filter(None, (s.strip() for s in text.split(";"))):
            verb, _, rest = statement.partition(" ")
            rest = rest.strip()
            if verb == "replace":
                old, sep, new = rest.partition(" => ")
                if not sep or not old:
                    raise ValueError(f"doctest directive: expected `replace OLD => NEW`, got {statement!r}")
                fields["replacements"].append((old, new))
            elif verb == "exit":
                exit_codes = tuple(int(code) for code in rest.split("|"))
            elif verb in ("creates", "copy"):
                fields["creates" if verb == "creates" else "copies"].extend(rest.split())
            elif verb == "output":
                fields["output"].append(rest)
            elif verb == "file" and rest:
                file = rest
            elif verb == "background" and not rest:
                is_background = True
            else:
                raise ValueError(f"doctest directive: unknown statement {statement!r}")
        return cls(**{k: tuple(v) for k, v in fields.items()}, exit_codes=exit_codes, file=file,
                   is_background=is_background)

    def apply(self, source: str, where: str) -> str:
        for old, new in self.replacements:
            if old not in source:
                raise AssertionError(f"{where}: the directive replaces {old!r}, which the block no longer holds")
            source = source.replace(old, new)
        return source


@dataclass
class Page:
    """One page's run: its directory, the port its live commands reach, the servers it started."""

    workdir: Path
    engine_port: Callable[[], int]  # the module's bundled engine, started on first use
    port: int | None = None
    servers: list[subprocess.Popen[str]] = field(default_factory=list)
    pending: Directive | None = None
    pending_end: int = 0  # where the pending directive's comment ends in the page
    ran: list[str] = field(default_factory=list)  # "page:line" of every block run, in order
    skipped: list[str] = field(default_factory=list)  # the illustrative ones

    def take_directive(self) -> Directive:
        directive, self.pending = self.pending or Directive(), None
        return directive

    def substitute(self, source: str) -> str:
        if PORT_PATTERN.search(source) is None:
            return source
        port = self.port if self.port is not None else self.engine_port()
        return PORT_PATTERN.sub(lambda m: f"{m.group(1)}{port}", source)

    def stop(self) -> None:
        for proc in self.servers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def is_illustrative(example: Example) -> bool:
    """The caption: the paragraph right above the block (directives left out)."""
    before = example.document.text[: example.start].rstrip("\n").splitlines()
    caption: list[str] = []
    for line in reversed(before):
        if line.lstrip().startswith("<!--"):
            continue
        if not line.strip():
            if caption:
                break
            continue
        caption.append(line)
    return "(illustrative" in " ".join(reversed(caption))


def where(example: Example) -> str:
    return f"{Path(example.path).relative_to(REPO)}:{example.line}"


def environment() -> dict[str, str]:
    """The user's shell: `slobench` and `python` are this interpreter's, the repository importable."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
    env["COLUMNS"] = "160"
    return env


def start_server(command: str, cwd: Path) -> tuple[subprocess.Popen[str], int]:
    """Start a command that prints `LISTENING <port>`; return it once it has."""
    proc = subprocess.Popen(["bash", "-c", f"exec {command.strip()}"], cwd=cwd, env=environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    seen: list[str] = []
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while sel.select(timeout=LISTEN_TIMEOUT_S):
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith("LISTENING "):
                return proc, int(line.split()[1])
    proc.kill()
    raise AssertionError(f"{command!r} did not print LISTENING:\n{''.join(seen)}")


def _prepare(example: Example, page: Page) -> tuple[Directive, str, str] | None:
    at = where(example)
    if page.pending is not None:
        between = example.document.text[page.pending_end: example.start]
        assert re.fullmatch(r"\s*-*>?\s*", between), f"{at}: the doctest directive above is not right before this block"
    directive = page.take_directive()
    if is_illustrative(example):
        page.skipped.append(at)
        return None
    for path in directive.copies:
        target = page.workdir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, target)
    page.ran.append(at)
    source = directive.apply(str(example.parsed), at)
    if directive.is_background:  # its own port: the one it prints
        return directive, at, PORT_PATTERN.sub(lambda m: f"{m.group(1)}0", source)
    return directive, at, page.substitute(source)


Runner = Callable[[Page, Directive, str, str, dict], str]


def evaluator(run: Runner) -> Callable[[Example], None]:
    """A block's evaluator: its directive taken, the block run (unless illustrative), then what the
    directive says it leaves checked: words in its output, files."""

    def evaluate(example: Example) -> None:
        page: Page = example.namespace["page"]
        prepared = _prepare(example, page)
        if prepared is None:
            return
        directive, at, source = prepared
        said = run(page, directive, at, source, example.namespace)
        for text in directive.output:
            assert text in said, f"{at}: the output lacks {text!r}\n{said[-4000:]}"
        missing = [p for p in directive.creates if not (page.workdir / p).exists()]
        assert not missing, f"{at}: the block should have written {missing}"

    return evaluate


def _shell(page: Page, directive: Directive, at: str, source: str, namespace: dict) -> str:
    if directive.is_background:
        proc, page.port = start_server(source, page.workdir)
        page.servers.append(proc)
        return ""
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", source], cwd=page.workdir, env=environment(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    said = done.stdout + done.stderr
    assert done.returncode in directive.exit_codes, (
        f"{at}: exit {done.returncode}, the page says {directive.exit_codes}\n$ {source}\n{said[-4000:]}")
    return said


def _python(page: Page, directive: Directive, at: str, source: str, namespace: dict) -> str:
    assert directive.exit_codes == (0,) and not directive.is_background, f"{at}: a Python block exits 0"
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        exec(compile(source, at, "exec"), namespace["python"])  # the page's own code, as a reader runs it
    return said.getvalue()


def _toml(page: Page, directive: Directive, at: str, source: str, namespace: dict) -> str:
    assert directive.file is not None, f"{at}: a ```toml block is run through `file PATH` (a directive before it)"
    (page.workdir / directive.file).write_text(source)
    return ""


run_shell, run_python, write_file = evaluator(_shell), evaluator(_python), evaluator(_toml)


def take_directive(example: Example) -> None:
    page: Page = example.namespace["page"]
    assert page.pending is None, f"{where(example)}: the directive before this one has no block"
    page.pending, page.pending_end = Directive.parse(str(example.parsed)), example.end


class DirectiveParser:
    """`<!-- doctest: ... -->`: remembered for the block that follows it."""

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(directive="doctest", arguments=".*?")

    def __call__(self, document: Document) -> Iterator[Region]:
        for region in self.lexer(document):
            region.parsed = region.lexemes["arguments"]
            region.evaluator = take_directive
            yield region


def run_page(relpath: str, workdir: Path, engine_port: Callable[[], int]) -> Page:
    """Every block of one page, in order, in `workdir` (the process's working directory meanwhile)."""
    document = Document.parse(str(REPO / relpath), DirectiveParser(), CodeBlockParser("sh", run_shell),
                              CodeBlockParser("python", run_python), CodeBlockParser("toml", write_file))
    page = Page(workdir=workdir, engine_port=engine_port)
    document.namespace.update(page=page, python={"__name__": "__doc_block__"})
    previous = Path.cwd()
    os.chdir(workdir)
    try:
        for example in document.examples():
            example.evaluate()
    finally:
        os.chdir(previous)
        page.stop()
    assert page.pending is None, f"{relpath}: a doctest directive at the end of the page has no block after it"
    return page
