#!/usr/bin/env bash
# Dogfood the regression gate on the bundled engine (modeled executor, baselines/ci-profile.json), twice:
#  1. a capacity search on the virtual clock (the engine's real scheduler and block manager, no HTTP, no
#     wall time): deterministic for its seeds, so a capacity change beyond 2% is a regression with
#     certainty, not a matter of noise;
#  2. the same engine served over HTTP on 127.0.0.1, 5 seeds at two fixed rates below its cliff, gated on
#     median TTFT/TPOT/E2E (+10%) and attainment (-2pt), paired by seed. Medians of a 30 ms-step engine
#     move < 3% between identical runs here, and a 15% slower step fails them all (p < 0.01); a capacity
#     search through HTTP was tried first and was too noisy per seed (~35%) to decide anything.
#   exit 0  no regression (an inconclusive verdict is printed as a warning; SLOBENCH_GATE_STRICT=1 fails it)
#   exit 1  regression          exit 2  bad input (baseline missing, workloads or SLOs differ)
# Re-record the baselines after an intended change:  .ci/gate.sh --write-baseline
# Runtime: about 1.5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${SLOBENCH_GATE_OUT:-runs/ci-gate}
HTTP_BASELINE=baselines/http-fixed-rates-ci.json
SIM_BASELINE=baselines/simulated-ci.json
SERVER_LOG=$(mktemp)
rm -rf "$OUT"
mkdir -p "$OUT"
ENGINE=(--profile baselines/ci-profile.json --kv-blocks 60)
LOAD=(--workload tiny --input-len 32 --output-len 16 --slo ttft=300ms,tpot=70ms,target=0.9 --no-progress)

"$PY" -m slobench capacity --simulate "${ENGINE[@]}" "${LOAD[@]}" --num-requests 600 \
  --start-rate 8 --tolerance 5% --replicates 5 --out "$OUT/simulated" >/dev/null

"$PY" -m reference_engine.server --executor modeled "${ENGINE[@]}" --host 127.0.0.1 --port 0 >"$SERVER_LOG" 2>&1 &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; rm -f "$SERVER_LOG"' EXIT
PORT=""
for _ in $(seq 150); do  # bounded wait for the LISTENING line (30 s), not a fixed sleep
  PORT=$(awk '/^LISTENING/{print $2; exit}' "$SERVER_LOG")
  [ -n "$PORT" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "gate: the engine exited:"; cat "$SERVER_LOG"; exit 2; }
  sleep 0.2
done
[ -n "$PORT" ] || { echo "gate: the engine did not print LISTENING within 30 s"; cat "$SERVER_LOG"; exit 2; }

"$PY" -m slobench capacity --url "http://127.0.0.1:$PORT/v1" --model tiny "${LOAD[@]}" --num-requests 80 \
  --rates 12,20 --replicates 5 --scrape-interval 0 --out "$OUT/http" >/dev/null

if [ "${1:-}" = "--write-baseline" ]; then
  "$PY" -m slobench gate --candidate "$OUT/simulated" --write-baseline "$SIM_BASELINE"
  "$PY" -m slobench gate --candidate "$OUT/http" --write-baseline "$HTTP_BASELINE"
  exit 0
fi

rc=0
"$PY" -m slobench gate --baseline "$SIM_BASELINE" --candidate "$OUT/simulated" \
  --max-drop capacity=2% --junit "$OUT/gate-simulated.xml" --markdown "$OUT/gate-simulated.md" || rc=$?
if [ "$rc" = 0 ]; then
  "$PY" -m slobench gate --baseline "$HTTP_BASELINE" --candidate "$OUT/http" \
    --max-rise ttft.p50=10% --max-rise tpot.p50=10% --max-rise e2e.p50=10% --max-drop attainment=2pt \
    --junit "$OUT/gate-http.xml" --markdown "$OUT/gate-http.md" || rc=$?
fi
if [ "$rc" = 4 ] && [ "${SLOBENCH_GATE_STRICT:-0}" != 1 ]; then
  echo "gate: WARNING: inconclusive (see above for how many replicates would decide); not failing CI"
  exit 0
fi
exit "$rc"
