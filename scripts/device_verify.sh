#!/usr/bin/env bash
# One device call: the machine's facts and the `-m gpu` suite, its parts run side by side (16 cores,
# one GPU: nvcc and the test processes overlap), every part's log under $OUT/gpu-suite.log.
#   scripts/device_verify.sh                  the whole suite but the SmolLM2 end-to-end file
#   scripts/device_verify.sh PART [PART ...]  parts of your own, each one quoted pytest argument list
# Carry .carry/whl; add .carry/gguf_a to stage the SmolLM2 GGUF's first half for `scripts/device_e2e.sh run`.
# A part that outlives TEST_TIMEOUT (default 480 s) is killed; its log says how far it came.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[[ -f .carry/gguf_a/gg_00 ]] && scripts/device_e2e.sh stage
. scripts/device_env.sh
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c 'import torch, sys; print(sys.version, torch.__version__, torch.cuda.get_device_name())'; } > "$OUT/env.txt" 2>&1
G=tests/gpu
parts=("$@")
[[ $# -eq 0 ]] && parts=(
  "$G/test_kernels_linear.py"
  "$G/test_kernels_attention.py $G/test_kernels_sample.py"
  "$G/test_kernels_misc.py $G/test_kernels_sparse.py $G/test_kernels_moe.py $G/test_kernels_mlp_decode.py"
  "$G/test_gpu_families.py -k fp16"
  "$G/test_gpu_families.py -k int4"
  "$G/test_gpu_moe.py"
  "$G/test_gpu_executor.py $G/test_gpu_embeddings.py $G/test_gpu_mlp_decode.py $G/test_gpu_deterministic.py $G/test_bench_tools.py"
)
logs=$(mktemp -d)
for i in "${!parts[@]}"; do
  echo "# ${parts[$i]}" > "$logs/$i.log"
  # shellcheck disable=SC2086  # each part is a list of pytest arguments
  timeout -k 10 "${TEST_TIMEOUT:-480}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEsxX --timeout 400 \
    ${parts[$i]} >> "$logs/$i.log" 2>&1 &
done
wait
# the server's tests time requests: they run after the rest, alone on the GPU
[[ $# -eq 0 ]] && { echo "# $G/test_gpu_serve.py"
  timeout -k 10 "${SERVE_TIMEOUT:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEsxX --timeout 120 "$G/test_gpu_serve.py"
} > "$logs/serve.log" 2>&1
for f in "$logs"/*.log; do
  echo "=== $(head -n 1 "$f" | cut -c3-): $(tail -n 1 "$f")"
done | tee "$OUT/summary.txt"
for f in "$logs"/*.log; do echo "=== $f"; cat "$f"; done > "$OUT/gpu-suite.log"
grep -h -E "^(FAILED|ERROR|XPASS)" "$logs"/*.log | head -40
