"""Run a test file again inside a network namespace of its own, where only loopback exists.

Ray left to itself reaches for this machine's network address, which is off limits for test traffic, so
every test that starts Ray runs in such a namespace: a launcher test calls `rerun_in_own_netns(__file__)`,
which re-runs the file under `unshare -n` (root) or `unshare -rn` (a user namespace of its own) with
SLOBENCH_RAY_NETNS=1; the tests marked `in_netns` run only there. Without ray or a permitted unshare it
skips, unless SLOBENCH_REQUIRE_RAY=1 (CI), which turns either into a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

IN_NETNS = os.environ.get("SLOBENCH_RAY_NETNS") == "1"
REQUIRE = os.environ.get("SLOBENCH_REQUIRE_RAY") == "1"
in_netns = pytest.mark.skipif(not IN_NETNS, reason="runs inside its own network namespace (see the launcher test)")


def unshare_command() -> tuple[list[str] | None, str | None]:
    """The command that gives a child its own network namespace, or why there is none."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return None, "ray is not installed (pip install 'slobench[ray]')"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return None, "unshare or ip not found"
    why = ""
    for cmd in (["unshare", "-n"], ["unshare", "-rn"]):
        probe = subprocess.run([*cmd, "true"], capture_output=True, text=True)
        if probe.returncode == 0:
            return cmd, None
        why += f"{' '.join(cmd)}: {probe.stderr.strip()[:200]}; "
    return None, f"no network namespace permitted here ({why.rstrip('; ')})"


def rerun_in_own_netns(test_file: str, *, timeout_s: float) -> None:
    """The launcher: re-run `test_file` in its own namespace and fail with its output if it fails."""
    if IN_NETNS:
        pytest.skip("this is the launcher; the suite is running")
    unshare, why = unshare_command()
    if unshare is None:
        if REQUIRE:
            pytest.fail(f"SLOBENCH_REQUIRE_RAY=1 but {why}")
        pytest.skip(str(why))
    env = {**os.environ, "SLOBENCH_RAY_NETNS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = 'ip link set lo up && exec "$0" -m pytest -q -p no:cacheprovider -x "$1"'
    proc = subprocess.run([*unshare, "bash", "-c", cmd, sys.executable, test_file], env=env, capture_output=True,
                          text=True, timeout=timeout_s, cwd=Path(__file__).resolve().parents[1])
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " skipped" in proc.stdout, tail  # the suite did run (and skipped this)
