"""Instructions per MMA in the loops of a cubin's SASS: a CPU-side proxy for a kernel's issue cost.

    python3 bench/probes/sass_loops.py KERNEL.cubin [...]

Disassembles with ``cuobjdump -sass`` (the CUDA toolkit's, or the one pip's ``nvidia`` wheels put
under ``nvidia/cu13/bin``), finds every backward branch whose body holds HMMA instructions and
prints, per such loop: its instruction count, its HMMAs, the instructions per HMMA and the most
frequent opcodes. docs/performance.md: the probe's MLP kernel ran 11.8 (gate/up) and 15.8 (down)
per HMMA.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path


def cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia  # the pip wheels' tools (nvidia-cuda-cuobjdump, with nvidia-cuda-nvdisasm beside it)
    except ImportError:
        nvidia = None
    for base in getattr(nvidia, "__path__", []):
        for path in Path(base).glob("cu*/bin/cuobjdump"):
            return str(path)
    raise SystemExit("sass_loops: no cuobjdump on PATH or in the nvidia wheels "
                     "(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def loops(sass: str) -> list[tuple[int, int, int, int, list[tuple[str, int]]]]:
    """(start, end, instructions, HMMAs, top opcodes) of each loop with MMAs."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    where = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA.*?0x([0-9a-f]+)", text)
        if not m or int(m.group(1), 16) >= a or int(m.group(1), 16) not in where:
            continue
        body = [t for _, t in ins[where[int(m.group(1), 16)]:i + 1]]
        mma = sum("HMMA" in t for t in body)
        if mma:
            ops: dict[str, int] = {}
            for t in body:
                op = re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
                ops[op] = ops.get(op, 0) + 1
            found.append((int(m.group(1), 16), a, len(body), mma, sorted(ops.items(), key=lambda kv: -kv[1])[:10]))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cubins", nargs="+", metavar="KERNEL.cubin")
    for cubin in ap.parse_args().cubins:
        sass = subprocess.run([cuobjdump(), "-sass", cubin], check=True, capture_output=True, text=True).stdout
        print(f"== {cubin}")
        for start, end, n, mma, ops in loops(sass):
            print(f"loop {start:#x}-{end:#x}: {n} instructions, {mma} HMMA, {n / mma:.1f} per HMMA  {ops}")


if __name__ == "__main__":
    main()
