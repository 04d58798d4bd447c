"""The `slobench` command. Thin: parses, calls the library, prints.

One module per group of verbs (`run`, `engine`, `capacity`, `gate`, `history`, `workload`, `profile`,
`plan`), each with `add_arguments(verb, parser)` and one handler per verb; `common` holds what they share.
`VERBS` below is the whole map from verb to code. The verb modules import nothing from one another.

Exit codes (each means one thing): `EXIT_CODES`, printed under every `--help`.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NoReturn

from slobench.errors import WRITE_FAILURES, EngineError, ResultsNotWritten, SlobenchError
from slobench.printable import printable
from slobench.redact import redact_text
from slobench.version import __version__

__all__ = ["EXIT_CODES", "HANDLERS", "VERBS", "build_parser", "main"]

EXIT_CODES = """\
  0  ok
  1  SLO not met (run) / gate found a regression
  2  bad usage or bad input (workload file, SLO string, trace, baseline)
  3  target unreachable (preflight failed: wrong URL, server down, wrong model)
  4  inconclusive: gate (more replicates needed) or capacity (replicates that locate no capacity)
  5  internal error: a slobench bug (the traceback is printed; please report it)
  6  results not written: disk full, quota or I/O error (a run stops sending; what reached disk is kept)
  130  interrupted (Ctrl-C or SIGTERM): what finished is kept and summarised
"""
EXIT_INTERNAL_ERROR = 5  # never 1: 1 means "SLO not met" / "regression", and a crash must not read as either

EPILOG = "exit codes:\n" + EXIT_CODES
FORMATTER = argparse.RawDescriptionHelpFormatter

Handler = Callable[[argparse.Namespace], int]

# verb -> (its module under slobench.cli, the handler there, the line `slobench --help` shows for it).
# A verb's module is imported by name (importlib) only when that verb is parsed: each module imports the
# library it drives at its top (targets, simulator, report, fitting), and importing all of them made
# `slobench --help` take about 1.6x as long. Handlers call asyncio.run where they await.
VERBS: dict[str, tuple[str, str, str]] = {
    "run": ("run", "run", "one open-loop run at one rate"),
    "sweep": ("run", "sweep", "one run per offered rate, a table at the end"),
    "summarize": ("results", "summarize", "recompute and print a run's summary"),
    "serve": ("engine", "serve", "serve the bundled reference engine (OpenAI API)"),
    "demo": ("engine", "demo", "start the bundled engine, sweep a workload across its cliff, print the table"),
    "report": ("results", "report", "build the self-contained HTML report from run or sweep directories"),
    "capacity": ("capacity", "capacity", "largest rate meeting the SLO, with an interval from replicates"),
    "tune": ("tune", "tune", "one capacity search per server configuration, ranked by capacity per GPU"),
    "gate": ("gate", "gate", "CI verdict: candidate vs baseline (exit 0/1/4)"),
    "history": ("history", "history", "headline metrics over commits: add a result, report change points"),
    "workload": ("workload", "workload", "convert, fit or show workloads and traces"),
    "profile": ("profile", "profile", "write a roofline cost profile for a model on a GPU (for --simulate --profile)"),
    "calibrate": ("profile", "calibrate", "fit a cost profile from designed probes of a live endpoint"),
    "plan": ("plan", "dispatch", "the cheapest fleet (prefill, decode, co-located) for each window of a day of "
             "traffic"),
}


def verb_module(verb: str) -> ModuleType:
    return importlib.import_module(f"slobench.cli.{VERBS[verb][0]}")


def _run_verb(verb: str, args: argparse.Namespace) -> int:
    return int(getattr(verb_module(verb), VERBS[verb][1])(args))


HANDLERS: dict[str, Handler] = {verb: functools.partial(_run_verb, verb) for verb in VERBS}


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (exit 2) instead of the whole usage block above it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line. Given `argv`, only the verb it names gets its flags (and its module imported);
    the others are listed by name and help line. Without, every verb gets its flags."""
    p = Parser(
        prog="slobench",
        description="SLO-aware open-loop load testing for LLM inference servers.",
        epilog=EPILOG,
        formatter_class=FORMATTER,
    )
    p.add_argument("--version", action="version", version=f"slobench {__version__}")
    sub = p.add_subparsers(dest="verb", required=True)
    named = None if argv is None else next((a for a in argv if not a.startswith("-")), None)
    for verb, (_module, _handler, line) in VERBS.items():
        verb_p = sub.add_parser(verb, help=line, epilog=EPILOG, formatter_class=FORMATTER)
        if argv is None or verb == named:
            verb_module(verb).add_arguments(verb, verb_p)
    return p


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # outside a run (preflight, between sweep points) SIGTERM ends like Ctrl-C


def no_huge_page_stalls() -> None:
    """Large arrays on ordinary pages. numpy asks the kernel for transparent huge pages for every array of
    4 MB or more, and Arrow's allocator (mimalloc) takes huge pages too; where THP defrag is `madvise` (many
    distributions' default) and memory is fragmented, the kernel compacts memory synchronously to find
    them, a stall at each first touch: summarising a million records spent 15 s of its 23 s in the kernel
    so. Read when numpy and pyarrow are imported (after this: each verb imports them); a value already set
    is kept."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    os.environ.setdefault("MIMALLOC_ALLOW_LARGE_OS_PAGES", "0")


def main(argv: Sequence[str] | None = None) -> int:
    no_huge_page_stalls()
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt) if on_main else None
    try:
        return _dispatch(args)
    finally:
        if on_main:
            signal.signal(signal.SIGTERM, previous)


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return int(HANDLERS[args.verb](args))
    except (SlobenchError, EngineError) as e:  # the engine's own errors are bad settings or files: exit 2
        # a URL as typed may hold a password; a server's or a file's words may hold terminal escapes
        print(f"slobench: error: {printable(redact_text(str(e)))}", file=sys.stderr)
        return e.exit_code if isinstance(e, SlobenchError) else 2
    except KeyboardInterrupt:
        print("slobench: interrupted", file=sys.stderr)
        return 130
    except MemoryError:  # a workload too large for this machine (the flags' limits stop the absurd ones)
        print("slobench: error: out of memory building or running this workload; lower --num-requests, "
              "--input-len, --output-len or --duration", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in WRITE_FAILURES:
            return _internal_error(e)
        # a report, a history line or a verdict file the disk refused: what was measured is on disk already
        where = f"{e.filename}: " if e.filename else ""
        print(f"slobench: error: {printable(where)}cannot write ({e.strerror or e})", file=sys.stderr)
        return ResultsNotWritten.exit_code
    except Exception as e:  # a bug, never to be read as "SLO not met" (1)
        return _internal_error(e)


def _internal_error(e: BaseException) -> int:
    traceback.print_exception(e)
    print(f"slobench: internal error ({type(e).__name__}: {printable(e)}); this is a slobench bug, please report it "
          f"with the traceback above; exit {EXIT_INTERNAL_ERROR}", file=sys.stderr)
    return EXIT_INTERNAL_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
