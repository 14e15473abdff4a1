#!/usr/bin/env bash
# One device call for Apache TVM's kernel candidates (issue 26 item 4), results under $OUT:
# tests/gpu/test_kernels_tvm.py (each TVM kernel against the numpy oracle), then bench/kernels_tvm.py
# (TVM beside the rule's hand-written kernel and torch fp16, one process) as JSON.
#   here, where TVM is:   python bench/tvm_kernels_gen.py      (writes .carry/tvm, ~1.3 MB)
#   on the device:        scripts/device_tvm.sh                (carry .carry/tvm; the node needs no TVM)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. scripts/device_env.sh
export GROKC_TVM_KERNELS=${GROKC_TVM_KERNELS:-$PWD/.carry/tvm}
if ! compgen -G "$GROKC_TVM_KERNELS/linear_tvm_*.json" > /dev/null; then
  echo "no TVM kernels in $GROKC_TVM_KERNELS: run python bench/tvm_kernels_gen.py where TVM is installed and carry .carry/tvm"
  exit 2
fi
python3 -c 'import tvm' 2> /dev/null && echo "note: this node has TVM; the stored kernels are used all the same"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.csv" 2>&1
timeout -k 10 "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -rfEs \
  --junitxml="$OUT/test_kernels_tvm.xml" tests/gpu/test_kernels_tvm.py > "$OUT/test_kernels_tvm.log" 2>&1
echo "test_kernels_tvm: rc=$? $(tail -n 1 "$OUT/test_kernels_tvm.log")"
grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/test_kernels_tvm.log" | head -20
timeout -k 10 "${BENCH_TIMEOUT:-300}" python3 bench/kernels_tvm.py --out "$OUT/kernels_tvm.json" \
  > /dev/null 2> "$OUT/kernels_tvm.err"
echo "kernels_tvm: rc=$?"
grep -E "tvm/hand|failed|Error" "$OUT/kernels_tvm.err" | tail -30
