"""Apache TVM's ``linear`` kernels beside the hand-written kernel the rules pick and torch fp16, in one
process on one GPU: one JSON document.

    GROKC_TVM_KERNELS=.carry/tvm python3 bench/kernels_tvm.py [--out FILE] [--cases qkv,down]

From the repository root on a GPU machine with numpy, cuda-python, torch and nvcc (``. scripts/device_env.sh``
where grokc is not installed). The node needs no TVM: the kernels come from ``$GROKC_TVM_KERNELS``,
generated where TVM is by ``bench/tvm_kernels_gen.py``; nvcc compiles them here with the rest.

For each call of ``tvm_cases.BENCH`` (Llama-3.2-1B's matrices at M = 1, 512, 2048, as TVM covers them:
no norm, no activation): the kernel ``--kernels tvm`` selects (``linear.tvm_gemv`` / ``tvm_gemm``),
the kernel the default rule list selects for the same call (plain graph, and with programmatic
edges where the runner would use them), and ``torch.nn.functional.linear`` on fp16 weights (4x the
bytes for int4). Timing: ``kernel_timing.Timer``, a CUDA graph of launches over weight copies larger
than L2, median of 5, µs per launch. Each record also has ``vs_hand``: the largest relative
difference of the TVM kernel's output from the hand-written one's on the same inputs (correctness
itself is tests/gpu/test_kernels_tvm.py's). ``--out``: the JSON is rewritten after each call, so a
run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from kernel_timing import ROTATE_BYTES, Timer, Uploads, build_parallel, chain_length, torch_graph_us
from tvm_cases import BENCH, SM90_TVM, Case, host_args

from grokc.abi.ops import KERNEL_ABI
from grokc.runner import cuda_driver as cd
from grokc.targets import get_target, rules_tvm, select

LINEAR = KERNEL_ABI["linear"]
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class DeviceCase:
    """A call's arguments on the device, the weight (with its scales and zeros) in enough copies to defeat L2."""

    def __init__(self, c: Case):
        host = host_args(c)
        self.copies = max(2, min(64, -(-ROTATE_BYTES // c.weight_bytes)))
        self.up = Uploads()
        per_copy = ("weight", "scales", "zeros")
        self.rotating = {name: [self.up.ptr(host[name]) for _ in range(self.copies)] for name in per_copy}
        self.fixed = {p.name: (self.up.ptr(host[p.name]) if p.kind.value == "ptr" else host[p.name])
                      for p in LINEAR if p.name not in (*per_copy, "out")}
        self.out_shape, self.out_dtype = host["out"].shape, host["out"].dtype
        self.out = self.up.buffer(host["out"])
        self.fixed["out"] = self.out.ptr

    def args(self, i: int) -> cd.PackedArgs:
        values = {**self.fixed, **{name: ptrs[i] for name, ptrs in self.rotating.items()}}
        return cd.pack_args(LINEAR, [values[p.name] for p in LINEAR])

    def read_out(self) -> np.ndarray:
        n = int(np.prod(self.out_shape)) * np.dtype(self.out_dtype).itemsize
        return self.out.download(0, n).view(self.out_dtype).reshape(self.out_shape).astype(np.float64)

    def close(self) -> None:
        self.up.close()


def time_choice(timer: Timer, fn: cd.Function, choice, dc: DeviceCase, pdl: bool = False) -> dict:
    launches = [cd.KernelLaunch(fn, choice.grid, choice.block, choice.smem, dc.args((j + 1) % dc.copies),
                                pdl=pdl and j > 0) for j in range(chain_length(dc.copies))]
    us, spread = timer.graph(launches)
    return {"us": us, "spread": spread}


def run_once(stream: cd.Stream, fn: cd.Function, choice, dc: DeviceCase) -> np.ndarray:
    cd.launch(fn, choice.grid, choice.block, choice.smem, dc.args(0), stream)
    stream.synchronize()
    return dc.read_out()


def torch_us(torch, c: Case) -> float:
    copies = max(2, min(64, -(-ROTATE_BYTES // (c.n * c.k * 2))))
    ws = [torch.randn(c.n, c.k, device="cuda", dtype=torch.float16) for _ in range(copies)]
    x = torch.randn(c.m, c.k, device="cuda", dtype=torch.float16)
    us = torch_graph_us(torch, [lambda w=w: torch.nn.functional.linear(x, w) for w in ws], calls=chain_length(copies))
    del ws
    torch.cuda.empty_cache()
    return us


def record(c: Case, which: str, choice, r: dict) -> dict:
    return {"case": c.name, "m": c.m, "n": c.n, "k": c.k, "wf": c.wf, "out": c.out, "zeros": c.zeros,
            "residual": c.residual, "which": which, "kernel": choice.kernel if choice else "torch_f16_linear",
            "rule": choice.rule if choice else "torch", "grid": list(choice.grid) if choice else None,
            "block": list(choice.block) if choice else None, "smem": choice.smem if choice else None,
            "bytes": c.weight_bytes if choice else c.n * c.k * 2,
            "gbps": (c.weight_bytes if choice else c.n * c.k * 2) / r["us"] / 1e3,
            "tflops": 2 * c.m * c.n * c.k / r["us"] / 1e6, **r}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="", help="also write the JSON here, after every call")
    ap.add_argument("--cases", default="", help="comma-separated case names (qkv, o, gate_up, down, lm_head); default all")
    a = ap.parse_args()
    cases = [c for c in BENCH if not a.cases or c.name in a.cases.split(",")]
    hand_target = get_target("sm90")
    picks = {c: (select(c.call(), SM90_TVM), select(c.call(), hand_target)) for c in cases}
    symbols = sorted({ch.kernel for pair in picks.values() for ch in pair})
    log(f"building {len(symbols)} kernels (TVM kernels from ${rules_tvm.KERNELS_ENV}="
        f"{os.environ.get(rules_tvm.KERNELS_ENV, '(unset: generated with TVM)')})")
    cubins = build_parallel(symbols, hand_target, os.cpu_count() or 8)
    log("built")
    import torch

    ctx = cd.Context(0)
    torch.zeros(1, device="cuda")
    ctx.make_current()
    from grokc.cli.baselines import copy_bandwidth_gbps

    stream = cd.Stream()
    timer, modules = Timer(stream), {}

    def function(symbol: str) -> cd.Function:
        if symbol not in modules:
            modules[symbol] = cd.Module(cubins[symbol])
        return modules[symbol].function(symbol)

    report = {"meta": {"device": ctx.name, "sms": ctx.attribute("MULTIPROCESSOR_COUNT"), "torch": torch.__version__,
                       "copy_bandwidth_GBps": copy_bandwidth_gbps()}, "records": [], "failures": []}
    ctx.make_current()
    for c in cases:
        tvm_choice, hand = picks[c]
        dc = DeviceCase(c)
        try:
            tvm_fn, hand_fn = function(tvm_choice.kernel), function(hand.kernel)
            want = run_once(stream, hand_fn, hand, dc)
            got = run_once(stream, tvm_fn, tvm_choice, dc)
            diff = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
            recs = [record(c, "tvm", tvm_choice, {**time_choice(timer, tvm_fn, tvm_choice, dc), "vs_hand": diff}),
                    record(c, "hand", hand, time_choice(timer, hand_fn, hand, dc))]
            if hand.pdl:
                recs.append(record(c, "hand_pdl", hand, time_choice(timer, hand_fn, hand, dc, pdl=True)))
        except cd.CudaError as exc:
            report["failures"].append({"case": c.label, "error": str(exc)})
            log(f"{c.label}: {exc}")
            dc.close()
            continue
        dc.close()
        recs.append(record(c, "torch", None, {"us": torch_us(torch, c), "spread": 0.0}))
        ctx.make_current()
        report["records"] += recs
        by = {r["which"]: r["us"] for r in recs}
        log(f"{c.label:22s} tvm {by['tvm']:8.2f} us  hand {by['hand']:8.2f}" + (f" (pdl {by['hand_pdl']:.2f})" if 'hand_pdl' in by else "")
            + f"  torch {by['torch']:8.2f}  tvm/hand {by['tvm'] / by['hand']:.2f}  vs_hand {recs[0]['vs_hand']:.1e}")
        if a.out:
            Path(a.out).write_text(json.dumps({**report, "partial": True}, indent=1) + "\n")
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
