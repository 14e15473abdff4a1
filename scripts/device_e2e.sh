#!/usr/bin/env bash
# The SmolLM2 end-to-end GPU tests (tests/gpu/test_gpu_e2e.py) on a device machine that has no network
# and takes at most 64 MiB per call: the 98 MB GGUF travels in two halves, in two calls made while the
# machine stays warm (files outside the checkout, under /tmp/stage, survive between such calls).
#
#   here:            scripts/device_e2e.sh pack      # .carry/gguf_a, .carry/gguf_b, .carry/whl (git-excluded)
#   device, call 1:  scripts/device_e2e.sh stage     # carry .carry/gguf_a
#   device, call 2:  scripts/device_e2e.sh run      # carry .carry/gguf_b and .carry/whl; logs under $OUT
#
# `stage` may share its call with other work (e.g. the rest of tests/gpu); `run` needs the gguf wheel,
# which scripts/device_env.sh installs from .carry/whl.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=/tmp/stage
case "${1:-}" in
  pack)
    src=$(python3 scripts/smollm2_path.py)
    rm -rf .carry/gguf_a .carry/gguf_b && mkdir -p .carry/gguf_a .carry/gguf_b .carry/whl
    half=$(( ($(stat -c %s "$src") + 1) / 2 ))
    head -c "$half" "$src" > .carry/gguf_a/gg_00
    tail -c +"$((half + 1))" "$src" > .carry/gguf_b/gg_01
    python3 -m pip download -q --no-deps --only-binary=:all: -d .carry/whl "gguf==$(python3 -c 'import importlib.metadata as m; print(m.version("gguf"))')"
    sha256sum "$src" | cut -c1-16
    ;;
  stage)
    mkdir -p "$STAGE" && cp .carry/gguf_a/gg_00 "$STAGE/"
    ;;
  run)
    shift
    [[ -f $STAGE/gg_00 || -f $STAGE/smollm2.gguf ]] || { echo "no $STAGE/gg_00: run 'stage' in the call before, on the same warm machine" >&2; exit 2; }
    [[ -f $STAGE/smollm2.gguf ]] || { cat "$STAGE/gg_00" .carry/gguf_b/gg_01 > "$STAGE/smollm2.gguf" && rm "$STAGE/gg_00"; }
    sha256sum "$STAGE/smollm2.gguf" | cut -c1-16
    export GROKC_TEST_GGUF=$STAGE/smollm2.gguf
    T=tests/gpu/test_gpu_e2e.py   # one part per build, side by side (scripts/device_verify.sh)
    exec scripts/device_verify.sh "$T -k fp16" "$T -k int4]" "$T -k int4-r" "$T -k int4-h8" "$T -k wrong_arch" \
      "$T -k synthetic_weights"
    ;;
  *)
    echo "usage: scripts/device_e2e.sh pack | stage | run" >&2
    exit 2
    ;;
esac
