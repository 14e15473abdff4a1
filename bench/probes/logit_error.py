"""How far an artifact's GPU logits are from the CPU executor's, per prompt length, beside how far
f16-level rounding moves the same logits on the CPU alone (tests/gpu/plan_compare.rounding_spread).

    python3 bench/probes/logit_error.py ARTIFACT [ARTIFACT ...] [--lengths 5,128,256,512]

For each artifact and each length n (a random prompt, the smallest bucket that holds it): ``gpu``,
the prefill's last-position logits' ``rel_err`` (max |GPU - CPU| over their RMS) and ``spread``,
the CPU's own under half-ulp weight noise; their ratio is what the e2e tests bound. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from plan_compare import prefill_logits, rel_err, rounding_spread  # noqa: E402

from grokc.runner import Runner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", nargs="+")
    ap.add_argument("--lengths", default="5,128,256,512")
    a = ap.parse_args()
    rows = []
    for path in a.artifacts:
        gpu, cpu = Runner(path, device="cuda"), Runner(path, device="cpu")
        rng = np.random.default_rng(0)
        for n in (int(v) for v in a.lengths.split(",")):
            bucket = min(b for b in gpu.engine.shapes.buckets if b >= n)
            ids = [int(t) for t in rng.integers(20, 49000, n)]
            clean = prefill_logits(cpu, ids, bucket)
            err = rel_err(prefill_logits(gpu, ids, bucket), clean)
            spread = rounding_spread(cpu, lambda r: prefill_logits(r, ids, bucket), clean)
            rows.append({"artifact": Path(path).name, "n": n, "bucket": bucket, "gpu": err, "spread": spread,
                         "ratio": err / spread})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
