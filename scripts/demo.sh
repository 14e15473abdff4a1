#!/usr/bin/env bash
# The main job on a fresh machine: set up, build SmolLM2-135M for sm80 and sm90, run it on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
MODEL=$(python scripts/smollm2_path.py)
grokc build "$MODEL" --arch sm80 --arch sm90 -o dist/smollm2
grokc inspect dist/smollm2
grokc run dist/smollm2 --device cpu --prompt "The capital of France is" --max-new-tokens 16
