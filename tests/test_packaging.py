"""The wheel holds every file the code reads at run time, and its metadata is what a registry page needs.

An editable install reads the checkout, so a data file the wheel leaves out shows only once someone installs
the wheel elsewhere (`.ci/wheel-check.sh` does that in CI). Here the wheel is built from a copy of the
packages, without installing it, and its file list is held against what the code opens.
"""

from __future__ import annotations

import email
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from reference_engine.executor.modeled_executor import PROFILES_DIR
from slobench.version import __version__
from slobench.workload.bundled import DATA_DIR, package_files

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("slobench", "reference_engine")
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in")
# `Path(__file__)` climbing to the folder that holds the package, for a reason other than a data file
ABOVE_THE_PACKAGE_OK = {
    "slobench/targets/workers.py",  # puts the folder holding the package on a worker process's PYTHONPATH
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """A wheel built by setuptools' PEP 517 backend from a copy of what the sdist holds."""
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        shutil.copy(REPO / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    build = ("import sys; from setuptools import build_meta; "
             "print(build_meta.build_wheel(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", build, str(out)], cwd=src, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    with zipfile.ZipFile(out / done.stdout.strip().splitlines()[-1]) as zf:
        yield zf


def run_time_files() -> list[Path]:
    """What the code opens from its own packages: slobench's bundled files and the engine's profiles."""
    return [*package_files(), *sorted(PROFILES_DIR.glob("*.json"))]


def test_every_file_read_at_run_time_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    files = run_time_files()
    assert files, "the code names no run-time files"
    where = {f.relative_to(REPO).as_posix() for f in files}
    outside = sorted(w for w in where if w.split("/")[0] not in PACKAGES)
    assert not outside, f"read at run time from outside the packages (a wheel cannot carry them): {outside}"
    missing = sorted(where - names)
    assert not missing, f"read at run time but missing from the wheel: {missing}"
    for f in files:  # byte for byte, not only by name
        assert wheel.read(f.relative_to(REPO).as_posix()) == f.read_bytes(), f


def test_every_data_file_of_the_package_is_one_the_code_names() -> None:
    """A file put under slobench/data that no lookup names would ship unread, or be read by a path the
    packaging test does not check."""
    on_disk = {p for p in DATA_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert on_disk == set(package_files())


def test_no_run_time_path_climbs_out_of_its_package() -> None:
    climbs = []
    for pkg in PACKAGES:
        for py in sorted((REPO / pkg).rglob("*.py")):
            rel = py.relative_to(REPO)
            inside = len(rel.parts) - 1  # `.parent` steps from the file that stay inside its top-level package
            text = py.read_text()
            steps = [int(n) + 1 for n in re.findall(r"__file__\)(?:\.resolve\(\))?\.parents\[(\d+)\]", text)]
            steps += [len(m) // len(".parent") for m in
                      re.findall(r"__file__\)(?:\.resolve\(\))?((?:\.parent\b)+)", text)]
            if any(s > inside for s in steps) and rel.as_posix() not in ABOVE_THE_PACKAGE_OK:
                climbs.append(rel.as_posix())
    assert not climbs, f"paths built from __file__ that leave the package (the wheel has nothing there): {climbs}"


def test_wheel_metadata_is_what_a_registry_page_needs(wheel: zipfile.ZipFile) -> None:
    meta_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    meta = email.message_from_bytes(wheel.read(meta_name))
    assert meta["Name"] == "slobench" and meta["Version"] == __version__
    assert meta["License-Expression"], "the license as an SPDX expression"
    assert meta["License"] is None, "the deprecated free-text license field"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel.namelist())
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().startswith("# slobench"), "the README as the long description"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Source", "Documentation", "Issues"} <= set(urls)
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")], "PEP 639: the expression, not a classifier"
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"serve", "engine", "dev"} <= extras


def test_the_dev_extra_has_what_the_wheel_check_runs() -> None:
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    names = {re.split(r"[<>=\[;]", r)[0].strip() for r in dev}
    assert "build" in names
    # twine is installed by the check into its fresh venv, not into the checkout's (LiteLLM pins an older rich)
    assert "twine" not in names
