#!/usr/bin/env python3
"""Verify and time grokc's attention and sample kernels on the GPU, beside torch on the same shapes.

Device script (grokc need not be installed; python3 with torch, numpy and cuda-bindings, and nvcc):

    python3 bench/attention_kernels.py        # from the repository root; < 3 minutes on an H200

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

Each grokc case is first checked against the numpy oracle (``runner/cpu.py``) on the same inputs.
Timings: the median of 5 samples, each a CUDA graph of >= 20 chained launches replayed 10 times,
timed with CUDA events (torch: the same ops captured in a torch CUDA graph). Prints a compact table
last and writes every number to ``$OUT/attention_bench.json`` (``./attention_bench.json`` without OUT).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _grokc_importable() -> None:
    """The distribution maps ``grokc.<part>`` onto ``<part>/`` of the checkout (as kernel_harness does)."""
    try:
        import grokc.artifacts  # noqa: F401
    except ModuleNotFoundError:
        pkg = types.ModuleType("grokc")
        pkg.__path__ = [str(ROOT)]
        sys.modules["grokc"] = pkg


_grokc_importable()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from grokc.abi.ops import KERNEL_ABI  # noqa: E402
from grokc.abi.ops import KV_BLOCK_SIZE as S
from grokc.runner import cuda_driver as cd  # noqa: E402
from grokc.runner.cpu import OPS  # noqa: E402
from grokc.targets import build_kernels, get_target, rules_misc, select  # noqa: E402
from grokc.targets.base import KernelCall  # noqa: E402

F16, F32, I32 = np.float16, np.float32, np.int32
NH, NKV, D = 32, 8, 64                  # Llama-3.2-1B
TABLE_LEN = 8192
ROTATE_BYTES = 256 << 20                # per case: enough distinct KV that L2 (60 MB) cannot hold it
GRAPH_LAUNCHES, REPS, SAMPLES = 20, 10, 5


# -- device plumbing ------------------------------------------------------------------------------

class Device:
    def __init__(self) -> None:
        torch.cuda.init()
        self.ctx = cd.Context(0)       # the primary context, which torch uses too
        major, minor = self.ctx.compute_capability
        self.target = get_target(f"sm{major}{minor}")
        self.stream = cd.Stream()
        self.module: cd.Module | None = None

    def load(self, symbols: list[str]) -> dict:
        """Build and load the kernels; returns per-kernel SASS counts (tensor-core ops, local memory)."""
        t0 = time.time()
        cubin = build_kernels(symbols, self.target)
        self.module = cd.Module(cubin)
        print(f"built {len(symbols)} kernels for {self.target.name} in {time.time() - t0:.1f} s", flush=True)
        return sass_counts(cubin)

    def launch(self, choice, op: str, args: dict) -> cd.KernelLaunch:
        """A launch over device tensors / scalars in ``args`` (None: null)."""
        values = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in (args[p.name] for p in KERNEL_ABI[op])]
        assert self.module is not None
        return cd.KernelLaunch(self.module.function(choice.kernel), choice.grid, choice.block, choice.smem,
                               cd.pack_args(KERNEL_ABI[op], values))

    def run_once(self, k: cd.KernelLaunch) -> None:
        cd.launch(k.function, k.grid, k.block, k.smem, k.args, self.stream)
        self.stream.synchronize()

    def time_us(self, launches: list[cd.KernelLaunch]) -> float:
        """Median microseconds per launch of a chained CUDA graph of ``launches``."""
        n = max(GRAPH_LAUNCHES, len(launches))
        graph = cd.Graph([launches[i % len(launches)] for i in range(n)])
        try:
            graph.launch(self.stream)
            self.stream.synchronize()
            samples = []
            for _ in range(SAMPLES):
                e0, e1 = cd.Event(), cd.Event()
                e0.record(self.stream)
                for _ in range(REPS):
                    graph.launch(self.stream)
                e1.record(self.stream)
                samples.append(e0.elapsed_ms(e1) * 1e3 / (REPS * n))
                e0.close()
                e1.close()
            return statistics.median(samples)
        finally:
            graph.close()


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


def torch_time_us(fns: list) -> float:
    """Median microseconds per call of ``fns`` captured in a torch CUDA graph."""
    n = max(GRAPH_LAUNCHES, len(fns))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for i in range(n):
            fns[i % len(fns)]()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(SAMPLES):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(REPS):
            graph.replay()
        e1.record()
        torch.cuda.synchronize()
        samples.append(e0.elapsed_time(e1) * 1e3 / (REPS * n))
    return statistics.median(samples)


def to_dev(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    g, w = got.astype(np.float64), want.astype(np.float64)
    if np.isnan(g).any():
        return float("nan")
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))


def rope_np(d: int) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / 500000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(TABLE_LEN, dtype=np.float64)[:, None] * inv[None, :]
    return np.stack([np.cos(ang), np.sin(ang)], axis=-1).astype(F32), inv.astype(F32)


# -- attention ------------------------------------------------------------------------------------

def attn_scalars(rows_name: str, rows: int, max_blocks: int) -> dict:
    return {rows_name: rows, "n_heads": NH, "n_kv_heads": NKV, "head_dim": D, "table_len": TABLE_LEN,
            "max_blocks": max_blocks, "window": 0, "scale": D ** -0.5, "mscale": 1.0}


def decode_case(dev: Device, rng, batch: int, ctx: int) -> dict:
    mb = ctx // S
    kv_bytes = batch * NKV * ctx * D * 2 * 2
    sets = max(1, min(64, math.ceil(ROTATE_BYTES / kv_bytes)))
    per_set = batch * mb
    table, inv = rope_np(D)
    scal = attn_scalars("B", batch, mb)
    choice = select(KernelCall("attention_decode", dims=scal), dev.target)
    k_pool = torch.randn(sets * per_set, NKV, S, D, device="cuda", dtype=torch.float16)
    v_pool = torch.randn(sets * per_set, NKV, S, D, device="cuda", dtype=torch.float16)
    tables = [rng.permutation(per_set).reshape(batch, mb).astype(I32) + r * per_set for r in range(sets)]
    host = {"out": np.full((batch, NH * D), np.nan, F16),
            "qkv": rng.standard_normal((batch, (NH + 2 * NKV) * D)).astype(F16),
            "rope_table": table, "inv_freq": inv, "positions": np.full(batch, ctx - 1, I32),
            "active": np.ones(batch, I32), **scal}
    common = {k: (to_dev(v) if isinstance(v, np.ndarray) else v) for k, v in host.items()}
    common.update(k_cache=k_pool, v_cache=v_pool)
    tables_dev = [to_dev(t) for t in tables]  # kept alive: a launch holds only the raw address
    launches = [dev.launch(choice, "attention_decode", {**common, "block_table": t}) for t in tables_dev]

    # verify set 0 against the oracle (its blocks are 0..per_set-1 of the pool)
    want = {**host, "block_table": tables[0], "k_cache": k_pool[:per_set].cpu().numpy(),
            "v_cache": v_pool[:per_set].cpu().numpy()}
    dev.run_once(launches[0])
    got_out = common["out"].cpu().numpy()
    got_k = k_pool[:per_set].cpu().numpy()
    OPS["attention_decode"](want, {})
    err = rel_err(got_out, want["out"])
    # The new k is bit-exact where RoPE comes from the table; past it the kernel's sincosf and numpy's
    # f32 cos/sin may differ by an ulp, which can move one rounded half by one ulp (seen at 16384).
    ulps = np.abs(got_k.view(np.uint16).astype(np.int32) - want["k_cache"].view(np.uint16).astype(np.int32))
    ok = err < 4e-3 and int(ulps.max()) <= (0 if ctx - 1 < TABLE_LEN else 1)
    us = dev.time_us(launches)

    # torch: dense KV [B, NKV, ctx, D] per set, q [B, NH, 1, D]
    tsets = max(1, min(sets, 16))
    q = torch.randn(batch, NH, 1, D, device="cuda", dtype=torch.float16)
    ks = [torch.randn(batch, NKV, ctx, D, device="cuda", dtype=torch.float16) for _ in range(tsets)]
    vs = [torch.randn(batch, NKV, ctx, D, device="cuda", dtype=torch.float16) for _ in range(tsets)]
    t_us = torch_time_us([lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                          for k, v in zip(ks, vs)])
    return {"op": "attention_decode", "shape": f"B={batch} ctx={ctx}", "kernel": choice.kernel,
            "grid": list(choice.grid), "us": us, "GB/s": kv_bytes / us / 1e3, "torch_us": t_us,
            "torch_GB/s": kv_bytes / t_us / 1e3, "rel_err": err, "ok": bool(ok), "rotated_sets": sets}


def prefill_case(dev: Device, rng, L: int) -> dict:
    mb = L // S
    table, inv = rope_np(D)
    scal = attn_scalars("L", L, mb)
    choice = select(KernelCall("attention_prefill", dims=scal), dev.target)
    host = {"out": np.full((L, NH * D), np.nan, F16),
            "qkv": rng.standard_normal((L, (NH + 2 * NKV) * D)).astype(F16),
            "rope_table": table, "inv_freq": inv,
            "k_cache": rng.standard_normal((mb, NKV, S, D)).astype(F16),
            "v_cache": rng.standard_normal((mb, NKV, S, D)).astype(F16),
            "block_table": rng.permutation(mb).reshape(1, mb).astype(I32),
            "slot": np.zeros(1, I32), "n_real": np.array([L], I32), **scal}
    args = {k: (to_dev(v) if isinstance(v, np.ndarray) else v) for k, v in host.items()}
    launch = dev.launch(choice, "attention_prefill", args)
    dev.run_once(launch)
    want = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in host.items()}
    OPS["attention_prefill"](want, {})
    err = rel_err(args["out"].cpu().numpy(), want["out"])
    ok = err < 4e-3 and np.array_equal(args["k_cache"].cpu().numpy().view(np.uint16), want["k_cache"].view(np.uint16))
    us = dev.time_us([launch])
    flops = 4 * NH * D * L * (L + 1) / 2
    q = torch.randn(1, NH, L, D, device="cuda", dtype=torch.float16)
    k = torch.randn(1, NKV, L, D, device="cuda", dtype=torch.float16)
    v = torch.randn(1, NKV, L, D, device="cuda", dtype=torch.float16)
    t_us = torch_time_us([lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)])
    return {"op": "attention_prefill", "shape": f"L={L}", "kernel": choice.kernel, "grid": list(choice.grid),
            "us": us, "TFLOP/s": flops / us / 1e6, "torch_us": t_us, "torch_TFLOP/s": flops / t_us / 1e6,
            "rel_err": err, "ok": bool(ok)}


# -- sample ---------------------------------------------------------------------------------------

def sample_choices(m: int, target) -> list:
    """Every sample kernel ``target`` runs for M = m, V = 128256 (rules_misc's order)."""
    call = KernelCall("sample", dims={"M": m, "V": 128256, "n_eos": 0, "max_out": 4096})
    return [c for rule in rules_misc.RULES["sample"] if (c := rule(call, target)) is not None]


def sample_case(dev: Device, rng, m: int, mode: str, choice) -> dict:
    v = 128256
    temperature, top_k, top_p = {"greedy": (0.0, 0, 1.0), "top_p": (0.8, 0, 0.9), "top_k+top_p": (0.8, 50, 0.9)}[mode]
    scal = {"M": m, "V": v, "n_eos": 0, "max_out": 4096}
    host = {"logits": (rng.standard_normal((m, v)) * 3).astype(F32), "slot": None, "n_real": None,
            "temperature": np.full(m, temperature, F32), "top_k": np.full(m, top_k, I32),
            "top_p": np.full(m, top_p, F32), "seed": rng.integers(0, 2**31 - 1, m).astype(I32),
            "tokens": np.zeros(m, I32), "positions": np.zeros(m, I32), "active": np.ones(m, I32),
            "out_tokens": np.zeros((m, 4096), I32), "out_count": np.zeros(m, I32),
            "max_new": np.full(m, 2**30, I32), "eos_ids": np.zeros(1, I32), **scal}
    args = {k: (to_dev(a) if isinstance(a, np.ndarray) else a) for k, a in host.items()}
    launch = dev.launch(choice, "sample", args)
    dev.run_once(launch)
    want = {k: (a.copy() if isinstance(a, np.ndarray) else a) for k, a in host.items()}
    OPS["sample"](want, {})
    got = args["tokens"].cpu().numpy()
    ok = bool(np.array_equal(got, want["tokens"]))
    us = dev.time_us([launch])
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

    t_us = torch_time_us([torch_sample])
    return {"op": "sample", "shape": f"M={m} V={v} {mode}", "kernel": choice.kernel, "grid": list(choice.grid),
            "us": us, "GB/s": m * v * 4 / us / 1e3, "torch_us": t_us, "torch_GB/s": m * v * 4 / t_us / 1e3,
            "rel_err": 0.0 if ok else 1.0, "ok": ok}


# -- main -----------------------------------------------------------------------------------------

def main() -> int:
    t0 = time.time()
    dev = Device()
    rng = np.random.default_rng(2026)
    calls = [KernelCall("attention_decode", dims=attn_scalars("B", b, c // S)) for b in (1, 8) for c in (512, 4096)]
    calls += [KernelCall("attention_prefill", dims=attn_scalars("L", L, L // S)) for L in (512, 2048)]
    kernels = {select(c, dev.target).kernel for c in calls} | {c.kernel for m in (1, 8) for c in sample_choices(m, dev.target)}
    sass = dev.load(sorted(kernels))
    for kernel, c in sorted(sass.items()):
        print(f"sass {kernel}: {c['HMMA']} HMMA, {c['LDL/STL']} local-memory instructions")

    rows = []
    for batch in (1, 8):
        for ctx in (512, 4096):
            rows.append(decode_case(dev, rng, batch, ctx))
            print(rows[-1], flush=True)
    for L in (512, 2048):
        rows.append(prefill_case(dev, rng, L))
        print(rows[-1], flush=True)
    for m in (1, 8):
        for mode in ("greedy", "top_p", "top_k+top_p"):
            for choice in sample_choices(m, dev.target):
                rows.append(sample_case(dev, rng, m, mode, choice))
                print(rows[-1], flush=True)

    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name(0), "target": dev.target.name, "torch": torch.__version__,
              "seconds": time.time() - t0, "rows": rows, "sass": sass}
    (out_dir / "attention_bench.json").write_text(json.dumps(report, indent=1, sort_keys=True))

    print(f"\n{report['device']} ({dev.target.name}), {report['seconds']:.0f} s; rate = GB/s (decode, sample) "
          "or TFLOP/s (prefill)")
    print(f"{'op':<18} {'shape':<24} {'kernel':<32} {'us':>8} {'rate':>7} {'torch us':>9} {'rate':>7} check")
    for r in rows:
        unit = "TFLOP/s" if "TFLOP/s" in r else "GB/s"
        check = "ok" if r["ok"] else f"FAIL({r['rel_err']:.2g})"
        print(f"{r['op']:<18} {r['shape']:<24} {r['kernel']:<32} {r['us']:8.1f} {r[unit]:7.0f} "
              f"{r['torch_us']:9.1f} {r['torch_' + unit]:7.0f} {check}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
