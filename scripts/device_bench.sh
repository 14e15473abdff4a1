#!/usr/bin/env bash
# One device call's benchmarks, each bounded in time, each writing its JSON under $OUT as it ends
# (a part that runs out of time loses only itself; every part's stderr goes to $OUT/bench.log):
#   bench/run_bench.py per group of models ($OUT/bench-N.json; a group is comma-separated and shares one
#   document, so llama1b's variants sit beside its baselines; artifacts in bench-artifacts/ are reused:
#   build them here and carry the folder), bench/kernels_linear.py's LINEAR sections
#   ($OUT/linear.json), then bench/serve_load.py against `grokc serve` of each SERVE artifact.
#   MODELS="llama1b,llama1b-det llama8b" LINEAR=prefill SERVE="llama1b" scripts/device_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. scripts/device_env.sh
log=$OUT/bench.log
n=0
for group in ${MODELS:-llama1b}; do
  n=$((n + 1))
  timeout "${BENCH_TIMEOUT:-240}" python3 bench/run_bench.py --models "$group" > "$OUT/bench-$n.json" 2>> "$log"
  echo "bench $group: rc=$? -> bench-$n.json" | tee -a "$log"
done
if [[ -n ${LINEAR:-} ]]; then
  timeout "${LINEAR_TIMEOUT:-200}" python3 bench/kernels_linear.py --sections "$LINEAR" --deadline 150 \
    --out "$OUT/linear.json" > /dev/null 2>> "$log"
  echo "kernels_linear $LINEAR: rc=$?" | tee -a "$log"
fi
for a in ${SERVE:-}; do
  timeout "${SERVE_TIMEOUT:-120}" python3 bench/serve_load.py --artifact "bench-artifacts/$a" --device cuda \
    --concurrency 1,8,32 --requests 96 --max-seconds 15 --max-tokens 64 > "$OUT/serve-$a.json" 2>> "$log"
  echo "serve_load $a: rc=$?" | tee -a "$log"
done
