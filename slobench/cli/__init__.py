"""The `slobench` command. Thin: parses, calls the library, prints.

One module per group of verbs (`run`, `engine`, `gate`, `history`, `workload`, `profile`, `plan`), each
with `add_parsers(sub, *, epilog)` and one handler per verb; `common` holds what they share. `HANDLERS`
below is the whole map from verb to code. The verb modules import nothing from one another.

Exit codes (each means one thing): see `common.EXIT_CODES`, printed under every `--help`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from slobench import __version__
from slobench.cli import engine, gate, history, plan, profile, run, workload
from slobench.cli.common import EPILOG, EXIT_CODES, EXIT_INTERNAL_ERROR, FORMATTER
from slobench.errors import EngineError, SlobenchError
from slobench.redact import redact_text

__all__ = ["EXIT_CODES", "HANDLERS", "build_parser", "main"]

Handler = Callable[[argparse.Namespace], int]

# verb -> the code that runs it (asyncio.run inside a handler where it awaits)
HANDLERS: dict[str, Handler] = {
    "run": run.run,
    "sweep": run.sweep,
    "summarize": run.summarize,
    "serve": engine.serve,
    "demo": engine.demo,
    "report": engine.report,
    "capacity": gate.capacity,
    "gate": gate.gate,
    "history": history.history,
    "workload": workload.workload,
    "profile": profile.profile,
    "calibrate": profile.calibrate,
    "plan": plan.dispatch,
}

# the order `slobench --help` lists them in
_PARSER_GROUPS = (run, engine, gate, history, workload, profile, plan)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slobench",
        description="SLO-aware open-loop load testing for LLM inference servers.",
        epilog=EPILOG,
        formatter_class=FORMATTER,
    )
    p.add_argument("--version", action="version", version=f"slobench {__version__}")
    sub = p.add_subparsers(dest="verb", required=True)
    for group in _PARSER_GROUPS:
        group.add_parsers(sub, epilog=EPILOG)
    return p


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # outside a run (preflight, between sweep points) SIGTERM ends like Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
        print(f"slobench: error: {redact_text(str(e))}", file=sys.stderr)  # a URL as typed may hold a password
        return e.exit_code if isinstance(e, SlobenchError) else 2
    except KeyboardInterrupt:
        print("slobench: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, never to be read as "SLO not met" (1)
        traceback.print_exc()
        print(f"slobench: internal error ({type(e).__name__}: {e}); this is a slobench bug, please report it "
              f"with the traceback above; exit {EXIT_INTERNAL_ERROR}", file=sys.stderr)
        return EXIT_INTERNAL_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
