#!/usr/bin/env bash
# The wheel a user installs: build the sdist and, from it, the wheel (`python -m build`), check their
# metadata (`twine check`), install the wheel with the `serve` extra into a fresh virtual environment outside
# the checkout, and from a directory outside the checkout run what a new user runs first: the version, the
# README tour's simulated commands and `slobench demo`. Catches a file a verb reads at run time that the
# wheel leaves out, which an editable install never shows.
#   bash .ci/wheel-check.sh            PYTHON (default .venv/bin/python) needs the dev extra's build
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
base_python=${BASE_PYTHON:-python3}  # the interpreter the fresh venv is made from
tmp=$(mktemp -d "${TMPDIR:-/tmp}/slobench-wheel-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
t0=$SECONDS
say() { echo "wheel-check: $* ($((SECONDS - t0)) s)"; }
fail() { echo "wheel-check: FAILED: $*" >&2; exit 1; }

"$python" -m build --outdir "$tmp/dist" "$repo" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "python -m build"; }
# said, not failed on: a new setuptools release that deprecates something must not turn CI red on its own
grep -i -E "warning|deprecat" "$tmp/build.log" | grep -v -i "byte-compil" | sed 's/^/wheel-check: build: /' || true
wheel=$(ls "$tmp"/dist/*.whl)
say "built $(cd "$tmp/dist" && ls | tr '\n' ' ')"

"$base_python" -m venv "$tmp/venv"
# --no-compile: the commands below compile the modules they import, not all of numpy's and scipy's
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile "${wheel}[serve]" \
  || fail "pip install ${wheel}[serve]"
say "installed into a fresh venv"

mkdir "$tmp/work"
cd "$tmp/work"  # outside the checkout: nothing of the repository is importable or readable from here
export PATH="$tmp/venv/bin:$PATH"
unset PYTHONPATH
python -c 'import slobench, sys; sys.exit(0 if "site-packages" in slobench.__file__ else "slobench imported from " + slobench.__file__)'
version=$(slobench --version)
[ "$(python -m slobench --version)" = "$version" ] || fail "python -m slobench --version differs from slobench --version"
say "slobench --version: $version"

run() {  # run CODES CMD...: CMD must exit with one of CODES (comma-separated)
  local codes=$1 rc=0
  shift
  "$@" >"$tmp/out.log" 2>&1 || rc=$?
  if [[ ",$codes," != *",$rc,"* ]]; then
    cat "$tmp/out.log"
    fail "exit $rc (wanted $codes): $*"
  fi
  say "exit $rc: $*"
}
run 0 slobench run --simulate --num-requests 20 --rate 2 --out runs/default
run 0 slobench run --simulate --workload tiny --num-requests 20 --rate 2 --out runs/tiny
run 0 slobench workload show day
run 0 slobench run --simulate --trace azure-code-sample --num-requests 50 --out runs/trace
run 0 slobench sweep --simulate --kv-blocks 600 --workload chat --rates 2,8,32 --num-requests 100 \
  --slo ttft=300ms,tpot=40ms --out runs/sweep
# 4: inconclusive is a verdict too; what this check guards against is exit 2, a bundled file not found
run 0,4 slobench capacity --simulate --profile h100-llama-1b --workload chat --slo ttft=300ms,tpot=40ms \
  --replicates 2 --out runs/capacity
[ -f runs/capacity/capacity.json ] || fail "capacity wrote no capacity.json"
# the demo's path as `make demo` runs it (the bundled engine in a child process, the modeled executor: no
# torch here), at two fixed rates of 20 requests instead of the rates it finds itself (about a minute)
run 0 slobench demo --rates 4,16 --num-requests 20 --out runs/demo
[ -f runs/demo/report.html ] || fail "the demo wrote no report"
# the metadata a registry page shows, checked by twine from the fresh venv once the user's commands ran (so
# twine's own dependencies cannot stand in for one the wheel forgot; and CI's LiteLLM install, beside this
# check, moves packages of the checkout's venv, rich among them, while twine would import them)
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile twine || fail "pip install twine"
"$tmp/venv/bin/python" -m twine check --strict "$tmp"/dist/* || fail "twine check"
say "done"
