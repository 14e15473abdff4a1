"""Generate the TVM kernels of ``bench/tvm_cases.py`` (bench and GPU test) into a folder, on a machine
with Apache TVM, for a GPU node without it:

    python bench/tvm_kernels_gen.py [--out .carry/tvm]

Each kernel is ``<symbol>.json`` (``rules_tvm.save``: CUDA source over kernels/tvm_prelude.cuh, grid,
block, dynamic shared memory, TVM's version). On the GPU node ``GROKC_TVM_KERNELS=<folder>`` makes
``rules_tvm.load`` read them instead of generating (scripts/device_tvm.sh sets it); nvcc compiles them
there like any kernel. Prints one line per kernel and the folder's size.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tvm_cases import BENCH, ODD

from grokc.targets import rules_tvm

DEFAULT_OUT = Path(__file__).resolve().parents[1] / ".carry" / "tvm"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    t0 = time.perf_counter()
    symbols = sorted({c.symbol for c in BENCH + ODD})
    total = 0
    for symbol in symbols:
        kernel = rules_tvm.generate(symbol)
        if kernel is None:
            print(f"{symbol}: TVM's schedule is not one launch; not covered", file=sys.stderr)
            continue
        path = rules_tvm.save(kernel, args.out)
        total += path.stat().st_size
        print(f"{symbol}: grid {kernel.grid} block {kernel.block} smem {kernel.smem} ({path.stat().st_size // 1024} KB)")
    print(f"wrote {len(symbols)} kernels, {total / 1e6:.1f} MB, to {args.out} in {time.perf_counter() - t0:.0f} s "
          f"(TVM {kernel.tvm})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
