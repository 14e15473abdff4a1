#!/usr/bin/env bash
# Set up (if needed) and run the test suite. Extra arguments go to pytest (e.g. -m gpu, -k name).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. .venv/bin/activate
python -m pytest -q --durations=40 "$@"   # the slowest 40: what to trim when CI nears its limit
