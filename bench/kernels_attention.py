#!/usr/bin/env python3
"""Time grokc's attention and sample kernels on the GPU, beside torch on the same shapes: one JSON document.

    python3 bench/kernels_attention.py [--out FILE]     # from the repository root; < 3 minutes on an H200

On a GPU machine with torch, numpy, cuda-bindings and nvcc; where grokc is not installed,
``. scripts/device_env.sh`` first. Prints the JSON on stdout (``--out``: also to FILE) and a table on
stderr. Correctness is ``tests/gpu/test_kernels_attention.py``'s and ``test_kernels_sample.py``'s
job (the same kernels and shapes against the numpy oracle); this script only times them.

Cases (Llama-3.2-1B attention: 32 query heads, 8 kv heads, head_dim 64):

- attention_decode, B = 1 and 8, every slot at context 512 and 4096: achieved GB/s counts the KV
  bytes one step must read (``B * n_kv * ctx * D * 2 * 2``). The cache pool is rotated over enough
  copies (distinct blocks, same block-table shape) that repeated launches do not run from L2.
  Baseline: torch SDPA over a dense (unpaged) KV of the same size, ``enable_gqa``.
- attention_prefill, L = 512 and 2048, all rows real: TFLOP/s counts the causal half of
  ``4 * NH * D * L^2``. Baseline: torch SDPA, causal, ``enable_gqa`` (no RoPE, no cache write).
- sample, V = 128256, M = 1 and 8: greedy, top-p 0.9, top-k 50 + top-p 0.9 (temperature 0.8), every
  sample kernel the GPU runs (the cluster kernel on sm_90+, the one-block kernel everywhere).
  Baseline: torch argmax; softmax + sort + cumsum + exponential race for top-p.

Timings: ``kernel_timing`` (a CUDA graph of >= 20 chained launches replayed 10 times, median of 5),
torch's ops captured in a torch CUDA graph the same way. Also per kernel: its HMMA and local-memory
instruction counts in the SASS (where cuobjdump is found).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from kernel_timing import Timer, torch_graph_us

from grokc.abi.ops import KERNEL_ABI
from grokc.abi.ops import KV_BLOCK_SIZE as S
from grokc.runner import cuda_driver as cd
from grokc.targets import build_kernels, get_target, rules_misc, select
from grokc.targets.base import KernelCall

F16, F32, I32 = np.float16, np.float32, np.int32
NH, NKV, D = 32, 8, 64                  # Llama-3.2-1B
TABLE_LEN = 8192
ROTATE_BYTES = 256 << 20                # per case: enough distinct KV that L2 (60 MB) cannot hold it
CHAIN = 20                              # launches per timed graph, at least


def attn_scalars(rows_name: str, rows: int, max_blocks: int) -> dict:
    """The scalar arguments of an attention launch of the Llama-3.2-1B shape."""
    return {rows_name: rows, "n_heads": NH, "n_kv_heads": NKV, "head_dim": D, "table_len": TABLE_LEN,
            "max_blocks": max_blocks, "window": 0, "scale": D ** -0.5, "mscale": 1.0,
            "softcap": 0.0}


def rope_np(d: int) -> tuple[np.ndarray, np.ndarray]:
    """A RoPE table (theta 500000) of TABLE_LEN positions and its inverse frequencies."""
    inv = 1.0 / 500000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(TABLE_LEN, dtype=np.float64)[:, None] * inv[None, :]
    return np.stack([np.cos(ang), np.sin(ang)], axis=-1).astype(F32), inv.astype(F32)


class Device:
    def __init__(self, torch) -> None:
        torch.cuda.init()
        self.torch = torch
        self.ctx = cd.Context(0)       # the primary context, which torch uses too
        major, minor = self.ctx.compute_capability
        self.target = get_target(f"sm{major}{minor}")
        self.timer = Timer(cd.Stream())
        self.module: cd.Module | None = None

    def load(self, symbols: list[str]) -> dict:
        """Build and load the kernels; returns per-kernel SASS counts (tensor-core ops, local memory)."""
        t0 = time.time()
        cubin = build_kernels(symbols, self.target)
        self.module = cd.Module(cubin)
        print(f"built {len(symbols)} kernels for {self.target.name} in {time.time() - t0:.1f} s", file=sys.stderr)
        return sass_counts(cubin)

    def launch(self, choice, op: str, args: dict) -> cd.KernelLaunch:
        """A launch over device tensors / scalars in ``args`` (None: null)."""
        values = [a.data_ptr() if isinstance(a, self.torch.Tensor) else a for a in (args[p.name] for p in KERNEL_ABI[op])]
        assert self.module is not None
        return cd.KernelLaunch(self.module.function(choice.kernel), choice.grid, choice.block, choice.smem,
                               cd.pack_args(KERNEL_ABI[op], values))

    def time_us(self, launches: list[cd.KernelLaunch]) -> float:
        """Median µs per launch of one chained CUDA graph of ``launches``, cycled to CHAIN launches."""
        n = max(CHAIN, len(launches))
        return self.timer.graph([launches[i % len(launches)] for i in range(n)])[0]


def sass_counts(cubin: bytes) -> dict:
    """{kernel: {"HMMA": n, "LDL/STL": n}} from cuobjdump, or {} where cuobjdump is missing."""
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if not Path(tool).is_file():
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True).stdout
    counts: dict = {}
    name = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\w+)", line)
        if m:
            name = m.group(1)
            counts[name] = {"HMMA": 0, "LDL/STL": 0}
        elif name:
            counts[name]["HMMA"] += " HMMA" in line
            counts[name]["LDL/STL"] += (" LDL" in line) or (" STL" in line)
    return counts


def decode_case(dev: Device, rng, batch: int, ctx: int) -> dict:
    torch, F = dev.torch, dev.torch.nn.functional
    mb = ctx // S
    kv_bytes = batch * NKV * ctx * D * 2 * 2
    sets = max(1, min(64, math.ceil(ROTATE_BYTES / kv_bytes)))
    per_set = batch * mb
    table, inv = rope_np(D)
    scal = attn_scalars("B", batch, mb)
    choice = select(KernelCall("attention_decode", dims=scal), dev.target)
    k_pool = torch.randn(sets * per_set, NKV, S, D, device="cuda", dtype=torch.float16)
    v_pool = torch.randn(sets * per_set, NKV, S, D, device="cuda", dtype=torch.float16)
    tables = [torch.from_numpy(rng.permutation(per_set).reshape(batch, mb).astype(I32) + r * per_set).cuda()
              for r in range(sets)]   # kept alive: a launch holds only the raw address
    host = {"out": np.zeros((batch, NH * D), F16), "qkv": rng.standard_normal((batch, (NH + 2 * NKV) * D)).astype(F16),
            "rope_table": table, "inv_freq": inv, "positions": np.full(batch, ctx - 1, I32),
            "active": np.ones(batch, I32), **scal}
    common = {k: (torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v) for k, v in host.items()}
    common.update(k_cache=k_pool, v_cache=v_pool)
    us = dev.time_us([dev.launch(choice, "attention_decode", {**common, "block_table": t}) for t in tables])

    # torch: dense KV [B, NKV, ctx, D] per set, q [B, NH, 1, D]
    tsets = max(1, min(sets, 16))
    q = torch.randn(batch, NH, 1, D, device="cuda", dtype=torch.float16)
    ks = [torch.randn(batch, NKV, ctx, D, device="cuda", dtype=torch.float16) for _ in range(tsets)]
    vs = [torch.randn(batch, NKV, ctx, D, device="cuda", dtype=torch.float16) for _ in range(tsets)]
    t_us = torch_graph_us(torch, [lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                                  for k, v in zip(ks, vs)])
    return {"op": "attention_decode", "shape": f"B={batch} ctx={ctx}", "kernel": choice.kernel,
            "grid": list(choice.grid), "us": us, "GB/s": kv_bytes / us / 1e3, "torch_us": t_us,
            "torch_GB/s": kv_bytes / t_us / 1e3, "rotated_sets": sets}


def prefill_case(dev: Device, rng, L: int) -> dict:
    torch, F = dev.torch, dev.torch.nn.functional
    mb = L // S
    table, inv = rope_np(D)
    scal = attn_scalars("L", L, mb)
    choice = select(KernelCall("attention_prefill", dims=scal), dev.target)
    host = {"out": np.zeros((L, NH * D), F16), "qkv": rng.standard_normal((L, (NH + 2 * NKV) * D)).astype(F16),
            "rope_table": table, "inv_freq": inv,
            "k_cache": rng.standard_normal((mb, NKV, S, D)).astype(F16),
            "v_cache": rng.standard_normal((mb, NKV, S, D)).astype(F16),
            "block_table": rng.permutation(mb).reshape(1, mb).astype(I32),
            "slot": np.zeros(1, I32), "n_real": np.array([L], I32), **scal}
    args = {k: (torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v) for k, v in host.items()}
    us = dev.time_us([dev.launch(choice, "attention_prefill", args)])
    flops = 4 * NH * D * L * (L + 1) / 2
    q = torch.randn(1, NH, L, D, device="cuda", dtype=torch.float16)
    k = torch.randn(1, NKV, L, D, device="cuda", dtype=torch.float16)
    v = torch.randn(1, NKV, L, D, device="cuda", dtype=torch.float16)
    t_us = torch_graph_us(torch, [lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)])
    return {"op": "attention_prefill", "shape": f"L={L}", "kernel": choice.kernel, "grid": list(choice.grid),
            "us": us, "TFLOP/s": flops / us / 1e6, "torch_us": t_us, "torch_TFLOP/s": flops / t_us / 1e6}


def sample_choices(m: int, target) -> list:
    """Every sample kernel ``target`` runs for M = m, V = 128256 (rules_misc's order)."""
    call = KernelCall("sample", dims={"M": m, "V": 128256, "n_eos": 0, "max_out": 4096})
    return [c for rule in rules_misc.RULES["sample"] if (c := rule(call, target)) is not None]


def sample_case(dev: Device, rng, m: int, mode: str, choice) -> dict:
    torch, v = dev.torch, 128256
    temperature, top_k, top_p = {"greedy": (0.0, 0, 1.0), "top_p": (0.8, 0, 0.9), "top_k+top_p": (0.8, 50, 0.9)}[mode]
    scal = {"M": m, "V": v, "n_eos": 0, "max_out": 4096}
    host = {"logits": (rng.standard_normal((m, v)) * 3).astype(F32), "slot": None, "n_real": None,
            "temperature": np.full(m, temperature, F32), "top_k": np.full(m, top_k, I32),
            "top_p": np.full(m, top_p, F32), "seed": rng.integers(0, 2**31 - 1, m).astype(I32),
            "tokens": np.zeros(m, I32), "positions": np.zeros(m, I32), "active": np.ones(m, I32),
            "out_tokens": np.zeros((m, 4096), I32), "out_count": np.zeros(m, I32),
            "max_new": np.full(m, 2**30, I32), "eos_ids": np.zeros(1, I32), **scal}
    args = {k: (torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) else a) for k, a in host.items()}
    us = dev.time_us([dev.launch(choice, "sample", args)])
    logits = args["logits"]

    def torch_sample():
        if mode == "greedy":
            return torch.argmax(logits, dim=-1)
        probs = torch.softmax(logits / temperature, dim=-1)
        if top_k:
            kth = torch.topk(probs, top_k, dim=-1).values[:, -1:]
            probs = torch.where(probs >= kth, probs, 0.0)
        sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        sorted_p = torch.where(cum - sorted_p < top_p * cum[:, -1:], sorted_p, 0.0)
        kept = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        return torch.argmax(kept / torch.empty_like(kept).exponential_(), dim=-1)

    t_us = torch_graph_us(torch, [torch_sample])
    return {"op": "sample", "shape": f"M={m} V={v} {mode}", "kernel": choice.kernel, "grid": list(choice.grid),
            "us": us, "GB/s": m * v * 4 / us / 1e3, "torch_us": t_us, "torch_GB/s": m * v * 4 / t_us / 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="", help="also write the JSON to this file")
    a = ap.parse_args()
    import torch

    t0 = time.time()
    dev = Device(torch)
    rng = np.random.default_rng(2026)
    calls = [KernelCall("attention_decode", dims=attn_scalars("B", b, c // S)) for b in (1, 8) for c in (512, 4096)]
    calls += [KernelCall("attention_prefill", dims=attn_scalars("L", L, L // S)) for L in (512, 2048)]
    kernels = {select(c, dev.target).kernel for c in calls} | {c.kernel for m in (1, 8) for c in sample_choices(m, dev.target)}
    sass = dev.load(sorted(kernels))

    rows = [decode_case(dev, rng, batch, ctx) for batch in (1, 8) for ctx in (512, 4096)]
    rows += [prefill_case(dev, rng, L) for L in (512, 2048)]
    rows += [sample_case(dev, rng, m, mode, choice) for m in (1, 8) for mode in ("greedy", "top_p", "top_k+top_p")
             for choice in sample_choices(m, dev.target)]
    report = {"device": dev.ctx.name, "target": dev.target.name, "torch": torch.__version__,
              "seconds": time.time() - t0, "rows": rows, "sass": sass}
    text = json.dumps(report, indent=1, sort_keys=True)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    err = sys.stderr
    print(f"\n{report['device']} ({dev.target.name}), {report['seconds']:.0f} s; rate = GB/s (decode, sample) "
          "or TFLOP/s (prefill)", file=err)
    print(f"{'op':<18} {'shape':<24} {'kernel':<32} {'us':>8} {'rate':>7} {'torch us':>9} {'rate':>7}", file=err)
    for r in rows:
        unit = "TFLOP/s" if "TFLOP/s" in r else "GB/s"
        print(f"{r['op']:<18} {r['shape']:<24} {r['kernel']:<32} {r['us']:8.1f} {r[unit]:7.0f} "
              f"{r['torch_us']:9.1f} {r['torch_' + unit]:7.0f}", file=err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
