"""How fast blocks stream HBM into shared memory, four ways (bench/probes/stream_probe.cu), on this GPU.

    python3 bench/probes/stream_probe.py [--blocks 128] [--kb 192] [--reps 20]

The shape is ``mlp_decode``'s: 128 blocks of 512 threads, 192 KB each, one block an SM. Each launch
reads a different quarter of a buffer 4x the launch's bytes, so nothing comes from L2. Per mode:
the median over ``reps`` launches of the span from the first block's start to the last block's
landing (``%globaltimer``), the chip-wide GB/s that gives, and the median block's own time.
Compare with the copy bandwidth ``grokc bench`` reports. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from grokc.abi.ops import ArgKind, Param
from grokc.runner import cuda_driver as cd

PARAMS = (Param("src", ArgKind.PTR), Param("times", ArgKind.PTR), Param("sink", ArgKind.PTR),
          Param("bytes", ArgKind.I32), Param("copies", ArgKind.I32))
CASES = [("stream_bulk", c) for c in (1, 3, 12, 48, 96)] + [("stream_bulk_lanes", c) for c in (32, 96)] + \
        [("stream_cp_async", 1), ("stream_ldg", 1)]


def cubin() -> bytes:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "p.cubin"
        subprocess.run([nvcc, "-O3", "--cubin", "-arch=sm_90", "-o", str(out),
                        str(Path(__file__).with_name("stream_probe.cu"))], check=True)
        return out.read_bytes()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=128)
    ap.add_argument("--kb", type=int, default=192)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    ctx = cd.Context(0)
    stream = cd.Stream()
    mod = cd.Module(cubin())
    per_block = a.kb * 1024
    launch_bytes = a.blocks * per_block
    src = cd.DeviceBuffer(4 * launch_bytes)
    src.upload(np.random.default_rng(0).integers(0, 256, 4 * launch_bytes, dtype=np.uint8))
    times = cd.DeviceBuffer(16 * a.blocks)
    sink = cd.DeviceBuffer(256)
    out: dict = {"device": ctx.name, "blocks": a.blocks, "kb_per_block": a.kb, "cases": []}
    for name, copies in CASES:
        fn = mod.function(name)
        spans, own = [], []
        for r in range(a.reps + 2):
            args = cd.pack_args(PARAMS, [src.ptr + (r % 4) * launch_bytes, times, sink, per_block, copies])
            cd.launch(fn, (a.blocks, 1, 1), (512, 1, 1), per_block + 1024, args, stream)
            stream.synchronize()
            t = times.download().view(np.uint64).reshape(-1, 2).astype(np.int64)
            if r >= 2:
                spans.append((t[:, 1].max() - t[:, 0].min()) / 1e3)
                own.append(float(np.median(t[:, 1] - t[:, 0])) / 1e3)
        span = statistics.median(spans)
        out["cases"].append({"kernel": name, "copies": copies, "span_us": round(span, 2),
                             "gb_s": round(launch_bytes / span / 1e3, 1),
                             "block_median_us": round(statistics.median(own), 2)})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
