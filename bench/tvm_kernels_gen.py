"""Generate the TVM kernels of ``bench/tvm_cases.py`` (the bench's, the GPU test's and its tiny build's)
into a folder, on a machine with Apache TVM, for a GPU node without it:

    python bench/tvm_kernels_gen.py [--out .carry/tvm]

Each kernel is ``<symbol>.json`` (``rules_tvm.save``: CUDA source over kernels/tvm_prelude.cuh, grid,
block, dynamic shared memory, TVM's version). On the GPU node ``GROKC_TVM_KERNELS=<folder>`` makes
``rules_tvm.load`` read them instead of generating (scripts/device_tvm.sh sets it); nvcc compiles them
there like any kernel. Prints one line per kernel and the folder's size.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tvm_cases import BENCH, ODD, tiny_tvm_build

from grokc.targets import rules_tvm

DEFAULT_OUT = Path(__file__).resolve().parents[1] / ".carry" / "tvm"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    t0 = time.perf_counter()
    for c in BENCH + ODD:
        rules_tvm.load(c.symbol)
    with tempfile.TemporaryDirectory() as tmp:   # what the tiny build selects (any arch: symbols are arch-free)
        tiny_tvm_build(Path(tmp), "sm90")
    total = 0
    for symbol, kernel in sorted(rules_tvm._LOADED.items()):
        if kernel is None:
            print(f"{symbol}: TVM's schedule is not one launch; not covered", file=sys.stderr)
            continue
        path = rules_tvm.save(kernel, args.out)
        total += path.stat().st_size
        print(f"{symbol}: grid {kernel.grid} block {kernel.block} smem {kernel.smem} ({path.stat().st_size // 1024} KB)")
    print(f"wrote {len(rules_tvm._LOADED)} kernels, {total / 1e6:.1f} MB, to {args.out} in "
          f"{time.perf_counter() - t0:.0f} s (TVM {kernel.tvm})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
