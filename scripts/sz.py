#!/usr/bin/env python3
"""Lines per folder of the grokc package, and a size check in tinygrad's spirit (its sz.py).

    python3 scripts/sz.py            # prints a table; exit 1 when a limit is passed

Limits: no Python file of the package (tests, bench and scripts aside) above MAX_FILE lines, and
runner/ without its CPU oracle and its CUDA driver bindings above MAX_RUNNER lines, so the runner
stays an hour's read.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ("core", "abi", "artifacts", "quant", "passes", "targets", "compiler", "runner", "serve", "cli")
MAX_FILE = 600
MAX_RUNNER = 800
# The numpy oracle of every op (cpu.py, its parameter readers and its MoE ops); the ctypes-level driver calls.
RUNNER_EXEMPT = ("cpu.py", "cpu_params.py", "cpu_moe.py", "cuda_driver.py")


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def main() -> int:
    failures = []
    print(f"{'folder':<12}{'files':>6}{'lines':>8}   largest")
    for folder in PACKAGE:
        files = sorted((ROOT / folder).rglob("*.py"))
        if not files:
            continue
        sizes = {f: lines(f) for f in files}
        big = max(sizes, key=sizes.get)
        print(f"{folder:<12}{len(files):>6}{sum(sizes.values()):>8}   {big.relative_to(ROOT)} ({sizes[big]})")
        failures += [f"{f.relative_to(ROOT)} has {n} lines (limit {MAX_FILE}): split it by job"
                     for f, n in sizes.items() if n > MAX_FILE]
        if folder == "runner":
            counted = sum(n for f, n in sizes.items() if f.name not in RUNNER_EXEMPT)
            print(f"{'':<12}{'':>6}{counted:>8}   runner/ without {', '.join(RUNNER_EXEMPT)} (limit {MAX_RUNNER})")
            if counted > MAX_RUNNER:
                failures.append(f"runner/ has {counted} lines without its oracle and driver (limit {MAX_RUNNER})")
    for f in failures:
        print(f"sz: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
