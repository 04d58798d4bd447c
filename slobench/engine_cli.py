"""CLI verbs around the bundled reference engine and the later analyses: serve, demo, report."""

from __future__ import annotations

import argparse
from typing import Any

VERBS: frozenset[str] = frozenset()


def add_parsers(sub: Any, *, epilog: str) -> None:
    """Add the engine/report verbs. Filled in as those capabilities land."""


def dispatch(args: argparse.Namespace) -> int:
    raise SystemExit(f"slobench: unknown verb {args.verb!r}")
