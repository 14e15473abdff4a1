#!/usr/bin/env bash
# One device call's benchmarks, each bounded in time, each writing its JSON under $OUT as it ends
# (a part that runs out of time loses only itself):
#   bench/run_bench.py per model (artifacts in bench-artifacts/ are reused: build them here and carry
#   the folder), then bench/serve_load.py against `grokc serve` of each SERVE artifact.
#   MODELS="llama1b llama8b" SERVE="llama1b" scripts/device_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. scripts/device_env.sh
for m in ${MODELS:-llama1b}; do
  timeout "${BENCH_TIMEOUT:-240}" python3 bench/run_bench.py --models "$m" > "$OUT/bench-$m.json" 2> "$OUT/bench-$m.err"
  echo "bench $m: rc=$? $(tail -n 1 "$OUT/bench-$m.err")"
done
for a in ${SERVE:-}; do
  timeout "${SERVE_TIMEOUT:-120}" python3 bench/serve_load.py --artifact "bench-artifacts/$a" --device cuda \
    --concurrency 1,8,32 --requests 96 --max-seconds 15 --max-tokens 64 > "$OUT/serve-$a.json" 2> "$OUT/serve-$a.err"
  echo "serve_load $a: rc=$? $(tail -n 1 "$OUT/serve-$a.err")"
done
