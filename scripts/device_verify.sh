#!/usr/bin/env bash
# One device call: the machine's facts and the `-m gpu` suite (or the test paths given), results
# under $OUT.
#   scripts/device_verify.sh [test paths and pytest args]   (carry .carry/whl; add .carry/gguf_a to
#                                 stage the SmolLM2 GGUF's first half for scripts/device_e2e.sh run)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.csv" 2>&1
[[ -f .carry/gguf_a/gg_00 ]] && scripts/device_e2e.sh stage
. scripts/device_env.sh
python3 -c 'import torch, sys; print(sys.version, torch.__version__, torch.cuda.get_device_name())' > "$OUT/env.txt" 2>&1
args=("$@"); [[ $# -eq 0 ]] && args=(tests/gpu)
timeout -k 10 "${TEST_TIMEOUT:-3600}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfEsx --timeout 300 \
  --junitxml="$OUT/gpu-suite.xml" "${args[@]}" 2>&1 | tee "$OUT/gpu-suite.log" | tail -60
