"""Device benchmark of the ``linear`` kernels: correctness, speed, and the baselines, in one run.

    python3 bench/linear_kernels.py            # from the repository root, on a GPU machine
    python3 bench/linear_kernels.py --sections gemv2,decode1,decode8,tvm   # a subset, in this order
    python3 bench/linear_kernels.py --sections gemv2 --gemv2-sweep-full    # every gemv2 tiling

Needs numpy, cuda-python (``cuda.bindings``), torch (baselines and the copy bandwidth) and nvcc;
not grokc installed (it maps ``grokc`` onto the checkout) and not TVM (the TVM kernels come as CUDA
source in ``bench/tvm_linear_kernels.json``, made by ``bench/tvm_linear_gen.py``). Writes
``$OUT/linear_bench.json`` (``./bench-out`` without ``$OUT``) and prints a table last.

What it does:

1. Measures the device-to-device copy bandwidth (bytes read + written), the roofline used below.
2. Builds every kernel variant it times (grokc's with ``build_kernels``, in parallel chunks; TVM's
   sources with nvcc).
3. gemv2 (M <= 8), Llama-3.2-1B and SmolLM2-135M shapes at M = 1, 2, 4, 8: the rule's kernel (also
   with programmatic edges between launches), the gemv family's, at M = 1 and 8 the variants
   around the rule's (L2 prefetch, norm in registers, warps along N; ``--gemv2-sweep-full``: every
   tiling at M = 1, then the fastest at M = 2, 4, 8), torch at M = 1 and 8.
   GEMV sweep, M = 1, Llama-3.2-1B shapes: every tiling of the sweep, the tiling the rules pick,
   TVM's dlight GEMV and torch's fp16 ``F.linear``; M = 4 and 16 for the rule's choice; the
   SmolLM2-135M shapes for the rule's choice.
4. GEMM sweep (prefill), a few shapes: every tile config, the rule's, TVM's dlight Matmul (f16 and
   int4-dequant), torch fp16.
5. One Llama-3.2-1B decode step's linears (16 layers + LM head, the rule's kernels, one CUDA graph)
   against torch fp16 doing the same matmuls; with programmatic edges also with each gemv2 knob
   of ``DECODE_ALTS`` changed and with each shape's fastest gemv2 kernel of section 3.

Timing: CUDA events around replays of a CUDA graph of L launches, each launch on another copy of
the weights (copies together > 3x the 60 MB L2, so weights come from HBM); median of 5 timings,
their spread reported. Every timed grokc and TVM output is compared with the numpy oracle
(``runner/cpu.py``) after timing (outputs poisoned with NaN first).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
try:
    import grokc.artifacts  # noqa: F401
except ModuleNotFoundError:  # a bare checkout: grokc.<part> is the folder <part>/ of the repository
    _pkg = types.ModuleType("grokc")
    _pkg.__path__ = [str(ROOT)]
    sys.modules["grokc"] = _pkg

if os.environ.get("GROKC_BENCH_FAKE_DEVICE"):  # a dry run of this script's plumbing on a CPU machine
    import runpy

    runpy.run_path(os.environ["GROKC_BENCH_FAKE_DEVICE"])

from grokc.abi import int4  # noqa: E402
from grokc.abi.ops import KERNEL_ABI, ArgKind, Param  # noqa: E402
from grokc.runner import cuda_driver as cd  # noqa: E402
from grokc.runner.cpu import OPS  # noqa: E402
from grokc.targets import KernelCall, build_kernels, get_target, select  # noqa: E402
from grokc.targets.nvcc import find_nvcc  # noqa: E402
from grokc.targets.rules_linear import Gemm, Gemv, Gemv2, rule_gemv  # noqa: E402

F16, F32 = np.float16, np.float32
L2_BYTES = 60 * 2**20
ROTATE_BYTES = 3 * L2_BYTES
PEAK_TFLOPS = 790.0  # dense bf16 matrix rate measured on this H200 kind (KINDS.md)
TARGET = get_target("sm90")
LINEAR = KERNEL_ABI["linear"]
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


# -- workloads -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    name: str
    m: int
    n: int
    k: int
    act: str = "none"      # kernel_abi attr: none | silu_mul
    wf: str = "q4"         # kernel_abi attr: f16 | q4
    out: str = "f16"
    norm: bool = False
    residual: bool = False
    gs: int = 0

    @property
    def nw(self) -> int:
        return 2 * self.n if self.act == "silu_mul" else self.n

    @property
    def weight_bytes(self) -> int:
        w = self.nw * self.k * 2 if self.wf == "f16" else self.nw * self.k // 2 + self.nw * 2
        return w

    @property
    def attrs(self) -> dict:
        return {"weight_format": self.wf, "act": self.act, "out_dtype": self.out}

    @property
    def dims(self) -> dict:
        return {"M": self.m, "N": self.n, "K": self.k, "group_size": self.gs, "eps": 1e-5}

    def kernel_wf(self) -> str:
        if self.wf == "f16":
            return "f16"
        return "q4" if self.gs == 0 or self.gs >= self.k else "q4g"


LLAMA_DECODE = [
    Shape("qkv", 1, 3072, 2048, norm=True),
    Shape("o", 1, 2048, 2048, residual=True),
    Shape("gate_up", 1, 8192, 2048, act="silu_mul", norm=True),
    Shape("down", 1, 2048, 8192, residual=True),
    Shape("lm_head", 1, 128256, 2048, wf="f16", out="f32", norm=True),
]
SMOL_DECODE = [
    Shape("smol_qkv", 1, 960, 576, norm=True), Shape("smol_o", 1, 576, 576, residual=True),
    Shape("smol_gate_up", 1, 1536, 576, act="silu_mul", norm=True),
    Shape("smol_down", 1, 576, 1536, residual=True),
    Shape("smol_lm_head", 1, 49152, 576, wf="f16", out="f32", norm=True),
]
GEMM_SHAPES = [
    Shape("gemm_up_q4", 512, 8192, 2048),
    Shape("gemm_up_f16", 512, 8192, 2048, wf="f16"),
    Shape("gemm_gate_up_q4", 512, 8192, 2048, act="silu_mul", norm=True),
    Shape("gemm_down_q4", 512, 2048, 8192, residual=True),
    Shape("gemm_qkv_q4_L2048", 2048, 3072, 2048, norm=True),
]

# GEMV tilings swept at M = 1: (KS, RG, U, minblocks).
GEMV_TILINGS = [(ks, rg, u, 0) for ks, rg in ((2, 2), (2, 4), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2))
                for u in (1, 2, 4, 8)] + [(8, 1, 2, 3), (8, 1, 4, 3), (8, 1, 2, 4), (4, 2, 4, 2), (4, 2, 2, 3), (8, 1, 1, 4)]
GEMV_M16_TILINGS = [(8, 1, 2, 0), (8, 1, 1, 0), (4, 2, 2, 0), (4, 2, 4, 0), (8, 2, 2, 0), (4, 1, 2, 0)]
GEMM_TILINGS = [(128, 128, 2, 4, 3, 0), (128, 128, 2, 4, 4, 0), (128, 128, 2, 4, 3, 1), (64, 128, 2, 4, 3, 0),
                (64, 128, 2, 4, 4, 2), (128, 64, 4, 2, 3, 0), (64, 64, 2, 2, 3, 0), (64, 64, 2, 2, 4, 3)]


def gemv_variants(s: Shape, tilings) -> list[Gemv]:
    act = "silu" if s.act == "silu_mul" else "none"
    step_k = 32 if s.wf == "f16" else 128
    nsteps = -(-s.k // step_k)
    out = []
    for ks, rg, u, b in tilings:
        v = Gemv(s.kernel_wf(), act, s.out, 8 if s.m <= 8 else 16, ks, rg, u, b)
        if ks * u <= max(nsteps, 1) and v.smem(s.m, s.k) <= TARGET.smem_per_block:
            out.append(v)
    return out


def gemm_variants(s: Shape) -> list[Gemm]:
    act = "silu" if s.act == "silu_mul" else "none"
    vs = [Gemm(s.kernel_wf(), act, s.out, *t) for t in GEMM_TILINGS]
    return [v for v in vs if v.valid() and v.smem() <= TARGET.smem_per_block]


def gemv2_variants(s: Shape) -> list[Gemv2]:
    """The gemv2 tilings swept for a shape: split-K for few row groups, whole rows for many."""
    act = "silu" if s.act == "silu_mul" else "none"
    step_k = 32 if s.wf == "f16" else 128
    nsteps = -(-s.k // step_k)
    groups = -(-s.n // 8) if act == "silu" else -(-s.nw // 16)
    if groups >= 16 * TARGET.num_sms:  # LM-head-like: (R, KS, WN, D)
        tilings = [(r, ks, wn, d) for r in (1, 2, 4) for ks in (1, 2) for wn in (2, 4, 8) for d in (2, 3, 4, 6)
                   if r * d <= 8 and ks * wn <= 8 and not (r == 1 and d < 3)]
    else:
        tilings = ([(1, ks, 1, d) for ks in (1, 2, 4, 8, 16) for d in (1, 2, 4, 8)]
                   + [(2, ks, 1, d) for ks in (2, 4, 8) for d in (1, 2, 4)]
                   + [(1, ks, 2, d) for ks in (4, 8) for d in (1, 2)])
    out, seen = [], set()
    for r, ks, wn, d in tilings:
        per = -(-nsteps // ks)
        if ks > nsteps or (d > per and d // 2 >= per):  # a deeper ring than the warp has steps: a duplicate
            continue
        v = Gemv2(s.kernel_wf(), act, s.out, r, ks, wn, min(d, max(per, 1)), 0)
        if v.symbol not in seen and v.smem(s.m, s.k) <= TARGET.smem_per_block:
            seen.add(v.symbol)
            out.append(v)
    return out


def gemv2_rule(s: Shape) -> Gemv2 | None:
    v = _parse(select(KernelCall("linear", s.attrs, s.dims), TARGET).kernel)
    return v if isinstance(v, Gemv2) else None


def gemv2_focus(s: Shape) -> list[Gemv2]:
    """Around the rule's tiling: each L2 prefetch size, the norm in registers, two warps along N."""
    v = gemv2_rule(s)
    if v is None:
        return []
    alts = [dataclasses.replace(v, pf=0), dataclasses.replace(v, pf=2)]
    if s.norm:
        alts += [dataclasses.replace(v, nl=1), dataclasses.replace(v, pf=2, nl=1)]
    if v.ks > 1:
        alts.append(dataclasses.replace(v, wn=2 * v.wn))
    from grokc.targets.rules_linear import parse

    return [a for a in alts if parse(a.symbol) is not None and a.smem(s.m, s.k) <= TARGET.smem_per_block]


# the decode step is also timed (with programmatic edges) with these knobs changed in every
# gemv2 kernel of the rule's choice (nl only where there is a norm): {name: {field: value}}
DECODE_ALTS = {"p2": {"pf": 2}, "n1": {"nl": 1}, "p2n1": {"pf": 2, "nl": 1}, "p0": {"pf": 0}}


def decode_alt(s: Shape, sym: str, alt: dict) -> str:
    v = _parse(sym)
    if not isinstance(v, Gemv2):
        return sym
    change = {k: x for k, x in alt.items() if k != "nl" or s.norm}
    return dataclasses.replace(v, **change).symbol


def launch_dims(v, s: Shape) -> tuple[tuple, tuple, int]:
    if isinstance(v, (Gemv, Gemv2)):
        return (v.blocks(s.n), 1, 1), (v.threads, 1, 1), v.smem(s.m, s.k)
    return v.grid(s.m, s.n), (v.threads, 1, 1), v.smem()


# -- host data, oracle -------------------------------------------------------------------------------

_WEIGHTS: dict[tuple, tuple] = {}


def host_weights(s: Shape, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Random weight (and scales) of a shape, made once per (format, size, seed): packing is slow."""
    key = (s.wf, s.nw, s.k, s.gs, seed)
    if key not in _WEIGHTS:
        rng = np.random.default_rng((seed, s.nw, s.k))
        if s.wf == "f16":
            _WEIGHTS[key] = ((rng.standard_normal((s.nw, s.k), F32) / np.sqrt(s.k)).astype(F16), None)
        else:
            g = -(-s.k // (s.gs or s.k))
            _WEIGHTS[key] = (int4.pack(rng.integers(0, 16, (s.nw, s.k), dtype=np.uint8)),
                             (rng.uniform(0.5, 1.5, (s.nw, g)) / (4 * np.sqrt(s.k))).astype(F16))
    return _WEIGHTS[key]


def host_case(s: Shape, seed: int) -> dict:
    rng = np.random.default_rng((seed, s.m, s.n, s.k))
    a = {"x": rng.standard_normal((s.m, s.k)).astype(F16), "scales": None, "zeros": None, "norm": None,
         "residual": None, "addend": None, "bias": None, **s.dims}
    a["weight"], a["scales"] = host_weights(s, seed)
    if s.norm:
        a["norm"] = rng.uniform(0.5, 1.5, s.k).astype(F16)
    if s.residual:
        a["residual"] = rng.standard_normal((s.m, s.n)).astype(F16)
    a["out"] = np.full((s.m, s.n), np.nan, F16 if s.out == "f16" else F32)
    return a


def oracle(s: Shape, a: dict) -> np.ndarray:
    ref = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in a.items()}
    OPS["linear"](ref, s.attrs)
    return ref["out"].astype(np.float64)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    got = got.astype(np.float64)
    if np.isnan(got).any():
        return float("nan")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def tol(s: Shape) -> float:
    return 2e-3 if s.gs == 0 else 5e-3


# -- device data ----------------------------------------------------------------------------------

class DeviceCase:
    """A shape's arrays on the device: the weight (and scales) in enough copies to defeat L2."""

    def __init__(self, s: Shape, seed: int = 0, min_copies: int = 2):
        self.s = s
        self.host = host_case(s, seed)
        self.want = oracle(s, self.host)
        self.copies = max(min_copies, min(64, -(-ROTATE_BYTES // s.weight_bytes)))
        self.bufs: list[cd.DeviceBuffer] = []
        self.weights = [self._up(self.host["weight"]) for _ in range(self.copies)]
        self.scales = [self._up(self.host["scales"]) for _ in range(self.copies)] if s.wf == "q4" else None
        self.x = self._up(self.host["x"])
        self.norm = self._up(self.host["norm"]) if s.norm else None
        self.residual = self._up(self.host["residual"]) if s.residual else None
        self.out = self._up(self.host["out"])

    def _up(self, a: np.ndarray) -> cd.DeviceBuffer:
        b = cd.DeviceBuffer(max(a.nbytes, 256))
        b.upload(np.ascontiguousarray(a))
        self.bufs.append(b)
        return b

    def poison(self) -> None:
        self.out.upload(np.full(self.host["out"].shape, np.nan, self.host["out"].dtype))

    def read_out(self) -> np.ndarray:
        o = self.host["out"]
        return self.out.download(0, o.nbytes).view(o.dtype).reshape(o.shape)

    def args(self, i: int) -> list:
        """Launch values in KERNEL_ABI["linear"] order, weight copy i."""
        ptr = lambda b: None if b is None else b.ptr  # noqa: E731
        v = {"out": self.out.ptr, "x": self.x.ptr, "weight": self.weights[i].ptr,
             "scales": ptr(self.scales[i]) if self.scales else None, "zeros": None, "norm": ptr(self.norm),
             "residual": ptr(self.residual), "addend": None, "bias": None, **self.s.dims}
        return [v[p.name] for p in LINEAR]

    def close(self) -> None:
        for b in self.bufs:
            b.close()


# -- timing -----------------------------------------------------------------------------------------

class Timer:
    def __init__(self, stream: cd.Stream):
        self.stream = stream
        self.e0, self.e1 = cd.Event(), cd.Event()

    def graph(self, launches: list[cd.KernelLaunch], reps: int = 10, repeats: int = 5) -> tuple[float, float]:
        """(median µs per launch, spread (max - min) / median) over replays of one graph of ``launches``."""
        g = cd.Graph(launches)
        try:
            g.launch(self.stream)
            self.stream.synchronize()
            times = []
            for _ in range(repeats):
                self.e0.record(self.stream)
                for _ in range(reps):
                    g.launch(self.stream)
                self.e1.record(self.stream)
                self.e1.synchronize()
                times.append(self.e0.elapsed_ms(self.e1) * 1e3 / (reps * len(launches)))
        finally:
            g.close()
        med = statistics.median(times)
        return med, (max(times) - min(times)) / med


def n_launches(copies: int) -> int:
    """Launches per graph: a multiple of the copies, >= 16, so the last launch uses copy 0."""
    return copies * max(1, -(-16 // copies))


def time_kernel(timer: Timer, fn: cd.Function, v, dc: DeviceCase, pdl: bool = False) -> dict:
    """``pdl``: launches joined by programmatic edges (each may start while the one before ends)."""
    grid, block, smem = launch_dims(v, dc.s)
    L = n_launches(dc.copies)
    launches = [cd.KernelLaunch(fn, grid, block, smem, cd.pack_args(LINEAR, dc.args((j + 1) % dc.copies)),
                                pdl=pdl and j > 0) for j in range(L)]
    dc.poison()
    us, spread = timer.graph(launches)
    err = rel_err(dc.read_out(), dc.want)
    return {"us": us, "spread": spread, "err": err, "ok": bool(err <= tol(dc.s)),
            "grid": list(grid), "block": list(block), "smem": smem}


# -- torch baselines ---------------------------------------------------------------------------------

def torch_linear_us(torch, s: Shape) -> float:
    """torch.nn.functional.linear, fp16 weights [NW, K], copies rotating, CUDA graph replays."""
    bytes_w = s.nw * s.k * 2
    copies = max(2, min(64, -(-ROTATE_BYTES // bytes_w)))
    L = n_launches(copies)
    ws = [torch.randn(s.nw, s.k, device="cuda", dtype=torch.float16) for _ in range(copies)]
    x = torch.randn(s.m, s.k, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for w in ws:
            torch.nn.functional.linear(x, w)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for j in range(L):
            torch.nn.functional.linear(x, ws[(j + 1) % copies])
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        e0.record()
        for _ in range(10):
            g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / (10 * L))
    g = ws = None
    torch.cuda.empty_cache()
    return statistics.median(times)


def copy_bandwidth(torch) -> float:
    """Device-to-device copy, bytes read + written per second."""
    n = 2 * 2**30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.fill_(1)
    b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        b.copy_(a)
    e1.record()
    e1.synchronize()
    bw = 2 * n * 10 / (e0.elapsed_time(e1) * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return bw


# -- builds -----------------------------------------------------------------------------------------

def build_all(symbols: list[str], jobs: int) -> dict[str, bytes]:
    symbols = sorted(set(symbols))
    n = max(1, min(jobs, len(symbols)))
    chunks = [symbols[i::n] for i in range(n)]
    with ThreadPoolExecutor(n) as pool:
        built = list(pool.map(lambda c: build_kernels(c, TARGET), chunks))
    return {s: cubin for chunk, cubin in zip(chunks, built) for s in chunk}


def build_tvm(entries: list[dict], jobs: int) -> dict[str, bytes]:
    nvcc = find_nvcc()

    def one(e: dict) -> bytes:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "k.cu"
            src.write_text(e["source"])
            cmd = [nvcc, "--cubin", "-O3", "-arch=sm_90", "-U__CUDA_NO_HALF_OPERATORS__",
                   "-U__CUDA_NO_HALF_CONVERSIONS__", "--expt-relaxed-constexpr", "-o", "k.cubin", "k.cu"]
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"nvcc failed on {e['name']}: {proc.stderr[-2000:]}")
            return (Path(tmp) / "k.cubin").read_bytes()

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return dict(zip([e["name"] for e in entries], pool.map(one, entries)))


# -- jobs: each runs in its own process, so a kernel fault cannot take the whole run down ---------------

class Kernels:
    """Cubins built by the parent, loaded on demand in a child: symbol -> cd.Function."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.index = json.loads((folder / "index.json").read_text())
        self.modules: dict[str, cd.Module] = {}

    def function(self, symbol: str, kernel: str | None = None) -> cd.Function:
        file = self.index[symbol]
        if file not in self.modules:
            self.modules[file] = cd.Module((self.folder / file).read_bytes())
        return self.modules[file].function(kernel or symbol)


class Emitter:
    """What a child reports, one JSON line at a time, flushed, so the parent keeps it across a crash."""

    def __init__(self, path: Path):
        self.f = path.open("w")

    def __call__(self, **item) -> None:
        self.f.write(json.dumps(item, default=float) + "\n")
        self.f.flush()


def run_job(job: dict, folder: Path, emit: Emitter) -> None:
    """One job in this process: {"kind": "copy" | "plan" | "tvm" | "decode", ...}.

    Emits ``start`` (the kernel or step about to run), ``record`` (a timed result) and ``result``
    (a job-level result) lines.
    """
    import torch

    ctx = cd.Context(0)
    try:
        torch.zeros(1, device="cuda")
        have_torch = True
    except (RuntimeError, AssertionError) as exc:  # a torch without CUDA: no baselines
        log(f"torch has no CUDA ({exc}); skipping its baselines")
        have_torch = False
    ctx.make_current()
    stream = cd.Stream()
    timer = Timer(stream)
    kernels = Kernels(folder)
    if job["kind"] == "copy":
        emit(result={"copy_bandwidth": copy_bandwidth(torch), "device": ctx.name,
                     "sms": ctx.attribute("MULTIPROCESSOR_COUNT"), "torch": torch.__version__})
        return
    if job["kind"] == "plan":
        for item_no, item in enumerate(job["items"]):
            section, shape, syms, with_torch = item[:4]
            pdl_syms = item[4] if len(item) > 4 else []
            s = Shape(**shape)
            emit(start=[item_no, "setup"])
            dc = DeviceCase(s)
            for sym, pdl in [(x, False) for x in syms] + [(x, True) for x in pdl_syms]:
                emit(start=[item_no, ("pdl:" if pdl else "") + sym])
                r = time_kernel(timer, kernels.function(sym), _parse(sym), dc, pdl=pdl)
                emit(record=dict(section=section, shape=s.name, m=s.m, n=s.n, k=s.k, kernel=sym, pdl=pdl,
                                 rule_choice=sym == job["rules"][s.name + str(s.m)] and not pdl,
                                 old_rule=sym == job.get("old_rules", {}).get(s.name + str(s.m)),
                                 bytes=s.weight_bytes,
                                 gbps=s.weight_bytes / r["us"] / 1e3, tflops=2 * s.m * s.nw * s.k / r["us"] / 1e6, **r))
                log(f"{section:6s} {s.name:18s} M={s.m:<4d} {sym:48s}{' pdl' if pdl else '    '} {r['us']:8.2f} us "
                    f"{s.weight_bytes / r['us'] / 1e3:6.0f} GB/s err {r['err']:.1e}")
            dc.close()
            if with_torch and have_torch:
                emit(start=[item_no, "torch"])
                us = torch_linear_us(torch, s)
                emit(record=dict(section=section, shape=s.name, m=s.m, n=s.n, k=s.k, kernel="torch_f16_linear",
                                 rule_choice=False, bytes=s.nw * s.k * 2, us=us, gbps=s.nw * s.k * 2 / us / 1e3,
                                 tflops=2 * s.m * s.nw * s.k / us / 1e6, ok=True, err=0.0, spread=0.0))
                log(f"{section:6s} {s.name:18s} M={s.m:<4d} torch fp16 {us:.2f} us")
        return
    if job["kind"] == "tvm":
        spec = {e["name"]: e for e in json.loads((ROOT / "bench" / "tvm_linear_kernels.json").read_text())["kernels"]}
        for item_no, name in enumerate(job["names"]):
            emit(start=[item_no, name])
            e, s = spec[name], Shape(**job["shapes"][name])
            dc = DeviceCase(s)
            params = [Param(p, ArgKind.PTR) for p in e["launches"][0]["args"]]

            def ptrs(i: int) -> dict:
                return {"x": dc.x.ptr, "w": dc.weights[i].ptr, "s": dc.scales[i].ptr if dc.scales else None,
                        "y": dc.out.ptr}

            launches = []
            for j in range(n_launches(dc.copies)):
                for lz in e["launches"]:
                    f = kernels.function(name, lz["kernel"])
                    vals = [ptrs((j + 1) % dc.copies)[a] for a in lz["args"]]
                    launches.append(cd.KernelLaunch(f, tuple(lz["grid"]), tuple(lz["block"]), lz["smem"],
                                                    cd.pack_args(params, vals)))
            dc.poison()
            us, spread = timer.graph(launches)
            us *= len(e["launches"])  # per workload, not per kernel
            err = rel_err(dc.read_out(), dc.want)
            emit(record=dict(section="tvm", shape=s.name, m=s.m, n=s.n, k=s.k, kernel=name, rule_choice=False,
                             bytes=s.weight_bytes, us=us, spread=spread, err=err, ok=bool(err <= tol(s)),
                             gbps=s.weight_bytes / us / 1e3, tflops=2 * s.m * s.nw * s.k / us / 1e6))
            log(f"tvm    {name:30s} {us:.2f} us err {err:.1e}")
            dc.close()
        return
    if job["kind"] == "decode":
        emit(start=[0, f"decode M={job['m']}"])
        r = decode_step(timer, kernels, job["m"], torch if have_torch else None, job.get("best") or {})
        log(f"decode step M={r['m']}: grokc {r['us']:.1f} us ({r['gbps']:.0f} GB/s), with PDL {r['pdl_us']:.1f} us, "
            f"torch fp16 {r['torch_us']:.1f} us")
        emit(result={"decode_step": [r]})
        return
    raise ValueError(job["kind"])


TVM_SHAPES = {
    "tvm_gemv_q4_3072x2048": Shape("qkv", 1, 3072, 2048),
    "tvm_gemv_q4_2048x2048": Shape("o", 1, 2048, 2048),
    "tvm_gemv_q4_16384x2048": Shape("gate_up", 1, 16384, 2048),
    "tvm_gemv_q4_2048x8192": Shape("down", 1, 2048, 8192),
    "tvm_gemv_f16_128256x2048": Shape("lm_head", 1, 128256, 2048, wf="f16", out="f32"),
    "tvm_matmul_f16_512x8192x2048": Shape("gemm_up_f16", 512, 8192, 2048, wf="f16"),
    "tvm_matmul_q4_512x8192x2048": Shape("gemm_up_q4", 512, 8192, 2048),
}


def remainder(job: dict, item_no: int, at: str) -> dict | None:
    """The part of a crashed job after the step ``at`` of item ``item_no``, or None when nothing is left."""
    if job["kind"] == "plan":
        items = [list(it) for it in job["items"][item_no:]]
        sec, shape, syms, with_torch = items[0][:4]
        pdl_syms = items[0][4] if len(items[0]) > 4 else []
        if at in ("setup", "torch"):  # the shape itself failed, or its last step: skip it
            items = items[1:]
        elif at.startswith("pdl:"):
            items[0] = [sec, shape, [], with_torch, pdl_syms[pdl_syms.index(at[4:]) + 1:]]
        else:
            items[0] = [sec, shape, syms[syms.index(at) + 1:], with_torch, pdl_syms]
        return {**job, "items": items} if items else None
    if job["kind"] == "tvm":
        names = job["names"][item_no + 1:]
        return {**job, "names": names} if names else None
    return None


DEADLINE_S = float(os.environ.get("GROKC_BENCH_DEADLINE_S", 240))  # inside one device call, tests included


def run_isolated(job: dict, folder: Path, failures: list) -> dict:
    """Run ``job`` in a child process; after a crash keep what it reported, note the step at fault
    and run the rest of the job in a fresh process."""
    out: dict = {"records": []}
    while job is not None:
        if time.perf_counter() - T0 > DEADLINE_S:
            failures.append({"job": job["kind"], "at": "-", "log": ["skipped: out of time"]})
            return out
        with tempfile.TemporaryDirectory() as tmp:
            jf, of = Path(tmp) / "job.json", Path(tmp) / "out.jsonl"
            jf.write_text(json.dumps(job))
            try:
                proc = subprocess.run([sys.executable, __file__, "--child", str(jf), str(folder), str(of)],
                                      capture_output=True, text=True, timeout=240)
                sys.stdout.write(proc.stdout)
                ok = proc.returncode == 0
                tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-6:]
            except subprocess.TimeoutExpired:
                ok, tail = False, ["timed out after 240 s (a hang?)"]
            lines = [json.loads(ln) for ln in of.read_text().splitlines() if ln.strip()] if of.exists() else []
        at = None
        for ln in lines:
            if "record" in ln:
                out["records"].append(ln["record"])
            elif "result" in ln:
                out.update(ln["result"])
            elif "start" in ln:
                at = ln["start"]
        if ok:
            return out
        where = f"{job['kind']} at {at[1] if at else 'start-up'}"
        log(f"job failed ({where}): {' / '.join(tail)}")
        failures.append({"job": job["kind"], "at": at[1] if at else "start-up", "log": tail})
        job = remainder(job, *at) if at else None
    return out


SECTIONS = ("gemv2", "decode1", "decode8", "tvm", "gemv", "gemm", "gemv_m", "decode16", "smol")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        run_job(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]), Emitter(Path(sys.argv[4])))
        return
    sections = list(SECTIONS)
    if "--sections" in sys.argv:  # e.g. --sections gemv2,tvm,decode1,decode8
        sections = sys.argv[sys.argv.index("--sections") + 1].split(",")
        unknown = set(sections) - set(SECTIONS)
        if unknown:
            raise SystemExit(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    out_dir = Path(os.environ.get("OUT", "bench-out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = os.cpu_count() or 8
    plan = [p for p in make_plan() if p[0] in sections or (p[0] == "gemv2_m" and "gemv2" in sections)]
    decode_ms = [int(sec[6:]) for sec in sections if sec.startswith("decode")]
    symbols = sorted({sym for _, _, syms, psyms in plan for sym in syms + psyms} | set(decode_symbols(decode_ms)))
    tvm_spec = json.loads((ROOT / "bench" / "tvm_linear_kernels.json").read_text())
    if "tvm" not in sections:
        tvm_spec["kernels"] = []
    log(f"sections {','.join(sections)}: building {len(symbols)} grokc kernels and {len(tvm_spec['kernels'])} "
        f"TVM kernels on {jobs} cores")
    t_build = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        f_ours = pool.submit(build_all, symbols, max(1, jobs - 2))
        f_tvm = pool.submit(build_tvm, tvm_spec["kernels"], 2)
        cubins, tvm_cubins = f_ours.result(), f_tvm.result()
    build_s = time.perf_counter() - t_build
    log(f"built in {build_s:.1f} s")

    with tempfile.TemporaryDirectory(prefix="grokc-bench-") as tmp:
        folder = Path(tmp)
        index, files = {}, {}
        for sym, cubin in cubins.items():
            files.setdefault(id(cubin), (f"grokc_{len(files)}.cubin", cubin))
            index[sym] = files[id(cubin)][0]
        for name, cubin in tvm_cubins.items():
            files[name] = (f"{name}.cubin", cubin)
            index[name] = f"{name}.cubin"
        for fname, cubin in files.values():
            (folder / fname).write_bytes(cubin)
        (folder / "index.json").write_text(json.dumps(index))

        failures: list = []
        meta = run_isolated({"kind": "copy"}, folder, failures)
        meta.pop("records", None)
        meta.setdefault("copy_bandwidth", 4.3e12)
        meta["build_s"] = build_s
        log(f"{meta.get('device')}: copy bandwidth {meta['copy_bandwidth'] / 1e12:.2f} TB/s")
        rules = {s.name + str(s.m): syms[0] for _, s, syms, _ in plan}
        old_rules = {s.name + str(s.m): old_gemv_rule(s) for _, s, _, _ in plan}
        records, chain = [], []

        def section(name: str) -> None:
            items = [[sec, dataclasses.asdict(s), syms, not (sec == "gemv2" and s.m in (2, 4)), psyms]
                     for sec, s, syms, psyms in plan if sec == name]
            if items:
                records.extend(run_isolated({"kind": "plan", "items": items, "rules": rules, "old_rules": old_rules},
                                            folder, failures)["records"])

        # in the order given (most important first: the time budget cuts from the end)
        for sec in sections:
            if sec == "gemv2" and GEMV2_SWEEP != "full":
                section("gemv2")
            elif sec == "gemv2":
                section("gemv2")
                top = gemv2_followups(records, plan)
                items = [["gemv2", dataclasses.asdict(s), top[(s.name, s.m)], s.m == 8, psyms]
                         for sec_, s, syms, psyms in plan if sec_ == "gemv2_m"]
                items.sort(key=lambda it: -it[1]["m"])  # M = 8 first
                records.extend(run_isolated({"kind": "plan", "items": items, "rules": rules, "old_rules": old_rules},
                                            folder, failures)["records"])
            elif sec == "tvm":
                records.extend(run_isolated({"kind": "tvm", "names": list(TVM_SHAPES),
                                             "shapes": {k: dataclasses.asdict(v) for k, v in TVM_SHAPES.items()}},
                                            folder, failures)["records"])
            elif sec.startswith("decode"):
                m = int(sec[6:])
                chain += run_isolated({"kind": "decode", "m": m, "best": fastest_gemv2(records, m)},
                                      folder, failures).get("decode_step", [])
            else:
                section(sec)
            # what is done so far, in case the run is cut short
            (out_dir / "linear_bench.json").write_text(json.dumps(
                {"meta": meta, "records": records, "decode_step": chain, "failures": failures, "partial": True},
                indent=1, default=float) + "\n")

    report = {"meta": meta, "records": records, "decode_step": chain, "failures": failures}
    (out_dir / "linear_bench.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
    print_table(report)


GEMV2_FOLLOW = {8: 8, 4: 2, 2: 2}  # fastest M = 1 tilings also timed at larger M


def gemv2_followups(records: list, plan: list) -> dict:
    """(shape, M) -> symbols for M = 2, 4, 8: the rule's, the gemv rule's, the fastest at M = 1."""
    out = {}
    for sec, s, syms, _ in plan:
        if sec != "gemv2_m":
            continue
        m1 = sorted((r for r in records if r["section"] == "gemv2" and r["shape"] == s.name and r["m"] == 1
                     and r["ok"] and not r.get("pdl") and r["kernel"].startswith("linear_gemv2_")), key=lambda r: r["us"])
        fast = [r["kernel"] for r in m1[:GEMV2_FOLLOW.get(s.m, 3)]]
        out[(s.name, s.m)] = list(dict.fromkeys(syms[:2] + [k for k in fast if k in syms]))
    return out


GEMV2_SWEEP = "full" if "--gemv2-sweep-full" in sys.argv else "focus"


def LLAMA_DECODE_M(m: int) -> list[Shape]:  # noqa: N802
    return [dataclass_replace(s, m=m) for s in LLAMA_DECODE]


def old_gemv_rule(s: Shape) -> str | None:
    """What the gemv family's own rule picks (the kernel the gemv2 rule now runs ahead of)."""
    c = rule_gemv(KernelCall("linear", s.attrs, s.dims), TARGET)
    return None if c is None else c.kernel


def make_plan() -> list[tuple[str, Shape, list[str], list[str]]]:
    """(section, shape, kernel symbols, symbols also timed with programmatic edges): the rule's
    choice first, then the sweep's other tilings."""
    def rule(s: Shape) -> str:
        return select(KernelCall("linear", s.attrs, s.dims), TARGET).kernel

    def pdl(s: Shape) -> list[str]:
        c = select(KernelCall("linear", s.attrs, s.dims), TARGET)
        return [c.kernel] if c.pdl else []

    plan = []
    for s in (dataclass_replace(s, m=m) for m in (1, 8, 2, 4) for s in LLAMA_DECODE + SMOL_DECODE):
        old = old_gemv_rule(s)
        if GEMV2_SWEEP == "full":
            # the whole sweep at M = 1; at M = 2, 4, 8 the rule's choice, the gemv rule's and (added
            # at run time by gemv2_followups) the fastest tilings of M = 1
            sweep = [v.symbol for v in gemv2_variants(s)]
            syms = [rule(s)] + [x for x in [old] + sweep if x and x != rule(s)]
            plan.append(("gemv2" if s.m == 1 else "gemv2_m", s, list(dict.fromkeys(syms)), pdl(s)))
        else:
            # the rule's choice, the gemv rule's, and at M = 1 and 8 the variants around the rule's
            focus = [v.symbol for v in gemv2_focus(s)] if s.m in (1, 8) and s in LLAMA_DECODE_M(s.m) else []
            syms = [rule(s)] + [x for x in [old] + focus if x and x != rule(s)]
            plan.append(("gemv2", s, list(dict.fromkeys(syms)), pdl(s)))
    for s in LLAMA_DECODE:
        plan.append(("gemv", s, [rule(s)] + [v.symbol for v in gemv_variants(s, GEMV_TILINGS) if v.symbol != rule(s)], []))
    for s in (dataclass_replace(s, m=m) for s in LLAMA_DECODE[:4] for m in (4, 16)):
        # at M = 16, also the GEMM's small tiles: which family should own 9 <= M <= 16?
        sweep = [v.symbol for v in gemv_variants(s, GEMV_M16_TILINGS)] + [
            v.symbol for v in gemm_variants(s) if v.bm == 64] if s.m == 16 else []
        plan.append(("gemv_m", s, [rule(s)] + [sym for sym in sweep if sym != rule(s)], []))
    for s in SMOL_DECODE:
        plan.append(("smol", s, [rule(s)], []))
    for s in GEMM_SHAPES:
        plan.append(("gemm", s, [rule(s)] + [v.symbol for v in gemm_variants(s) if v.symbol != rule(s)], []))
    return plan


def dataclass_replace(s: Shape, **kw) -> Shape:
    return dataclasses.replace(s, **kw)


def _parse(sym: str):
    from grokc.targets.rules_linear import parse

    v = parse(sym)
    if v is None:
        raise ValueError(sym)
    return v


def decode_symbols(ms=(1, 16)) -> list[str]:
    out = []
    for s in (dataclass_replace(s, m=m) for m in ms for s in LLAMA_DECODE):
        sym = select(KernelCall("linear", s.attrs, s.dims), TARGET).kernel
        out += [sym] + [decode_alt(s, sym, alt) for alt in DECODE_ALTS.values()]
    return list(dict.fromkeys(out))


def fastest_gemv2(records: list, m: int) -> dict:
    """Shape name -> the fastest correct gemv2 kernel timed for it at M = m (plain graphs)."""
    best: dict = {}
    for r in records:
        if (r["section"] == "gemv2" and r["m"] == m and r["ok"] and not r.get("pdl")
                and r["kernel"].startswith("linear_gemv2_") and r["shape"] in {s.name for s in LLAMA_DECODE}):
            if r["shape"] not in best or r["us"] < best[r["shape"]][1]:
                best[r["shape"]] = (r["kernel"], r["us"])
    return {k: v[0] for k, v in best.items()}


def decode_step(timer: Timer, kernels: Kernels, m: int, torch, best: dict | None = None) -> dict:
    """16 layers x (qkv+norm, o+residual, gate_up+norm+silu, down+residual) + LM head, one graph."""
    layers = 16
    shapes = [dataclass_replace(s, m=m) for s in LLAMA_DECODE]
    sel = {s.name: select(KernelCall("linear", s.attrs, s.dims), TARGET) for s in shapes}
    rng = np.random.default_rng(1)
    bufs: list[cd.DeviceBuffer] = []

    def up(a: np.ndarray) -> int:
        b = cd.DeviceBuffer(max(a.nbytes, 256))
        b.upload(np.ascontiguousarray(a))
        bufs.append(b)
        return b.ptr

    h = up(rng.standard_normal((m, 2048)).astype(F16))
    attn = up(rng.standard_normal((m, 2048)).astype(F16))
    qkv = up(np.zeros((m, 3072), F16))
    mlp = up(np.zeros((m, 8192), F16))
    logits = up(np.zeros((m, 128256), F32))
    launches, weight_bytes = [], 0
    for layer in range(layers + 1):
        for s in shapes if layer < layers else shapes[4:]:
            if layer < layers and s.name == "lm_head":
                continue
            a = host_case(s, seed=0)
            w, sc = up(a["weight"]), (up(a["scales"]) if a["scales"] is not None else None)
            nrm = up(a["norm"]) if s.norm else None
            weight_bytes += s.weight_bytes
            x_ptr, out_ptr, res_ptr = {"qkv": (h, qkv, None), "o": (attn, h, h), "gate_up": (h, mlp, None),
                                       "down": (mlp, h, h), "lm_head": (h, logits, None)}[s.name]
            vals = {"out": out_ptr, "x": x_ptr, "weight": w, "scales": sc, "zeros": None, "norm": nrm,
                    "residual": res_ptr, "addend": None, **s.dims}
            c = sel[s.name]
            launches.append(cd.KernelLaunch(kernels.function(c.kernel), c.grid, c.block, c.smem,
                                            cd.pack_args(LINEAR, [vals[p.name] for p in LINEAR]), pdl=c.pdl))
    pdl_us = float("nan")
    alts = {}
    if any(k.pdl for k in launches[1:]):  # the same graph with programmatic edges where the kernels allow
        pdl_us = timer.graph(launches, reps=5)[0] * len(launches)
        names = [s.name for layer in range(layers + 1) for s in (shapes if layer < layers else shapes[4:])
                 if not (layer < layers and s.name == "lm_head")]
        by_name = {s.name: s for s in shapes}
        def swap(k: cd.KernelLaunch, name: str, sym: str) -> cd.KernelLaunch:
            # another tiling has its own grid and shared memory (the first version of this kept
            # the rule's and faulted once a swapped kernel needed more shared memory)
            grid, block, smem = launch_dims(_parse(sym), by_name[name])
            return dataclasses.replace(k, function=kernels.function(sym), grid=grid, block=block, smem=smem)

        for alt_name, alt in DECODE_ALTS.items():
            swapped = [swap(k, name, decode_alt(by_name[name], sel[name].kernel, alt)) for k, name in zip(launches, names)]
            alts[alt_name] = timer.graph(swapped, reps=5)[0] * len(swapped)
        if best:  # each shape's fastest kernel of the gemv2 section
            swapped = [swap(k, name, best.get(name, sel[name].kernel)) for k, name in zip(launches, names)]
            alts["best"] = timer.graph(swapped, reps=5)[0] * len(swapped)
    for k in launches:
        k.pdl = False
    us, spread = timer.graph(launches, reps=5)
    us *= len(launches)
    for b in bufs:
        b.close()

    result = {"m": m, "launches": len(launches), "us": us, "pdl_us": pdl_us, "pdl_alts_us": alts, "best": best or {},
              "spread": spread,
              "weight_bytes": weight_bytes,
              "gbps": weight_bytes / us / 1e3, "torch_us": float("nan"), "torch_gbps": float("nan"),
              "kernels": {k: c.kernel for k, c in sel.items()}}
    if torch is None:
        return result
    # torch: the same matmuls with fp16 weights (no norm, residual or silu kernels: a lower bound)
    ws = [[torch.randn(s.nw, s.k, device="cuda", dtype=torch.float16) * 0.02 for s in shapes[:4]] for _ in range(layers)]
    head = torch.randn(128256, 2048, device="cuda", dtype=torch.float16) * 0.02
    xs = {s.name: torch.randn(m, s.k, device="cuda", dtype=torch.float16) for s in shapes}

    def step():
        for lw in ws:
            for s, w in zip(shapes[:4], lw):
                torch.nn.functional.linear(xs[s.name], w)
        torch.nn.functional.linear(xs["lm_head"], head)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        e0.record()
        for _ in range(5):
            g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / 5)
    torch_us = statistics.median(times)
    torch_bytes = sum(s.nw * s.k * 2 for s in shapes[:4]) * layers + 128256 * 2048 * 2
    g = ws = head = None  # free the torch weights before the next job
    torch.cuda.empty_cache()
    return {**result, "torch_us": torch_us, "torch_gbps": torch_bytes / torch_us / 1e3}


def print_gemv2_table(report: dict) -> None:
    """One line per (shape, M) of the gemv2 section: the rule's kernel (plain graph and with
    programmatic edges), the best gemv2 tiling, the gemv rule's kernel, TVM (M = 1) and torch."""
    bw = report["meta"]["copy_bandwidth"] / 1e9
    recs = [r for r in report["records"] if r["section"] == "gemv2"]
    if not recs:
        return
    nan = float("nan")
    tvm = {(r["shape"], r["m"]): r["us"] for r in report["records"] if r["section"] == "tvm"}
    print(f"gemv2 (M <= 8): us, % of copy bw ({bw:.0f} GB/s) by weight bytes; pdl = programmatic edges between launches")
    print(f"{'shape':14s} {'M':>2s} | {'rule kernel (linear_gemv2_...)':30s} {'us':>7s} {'%':>4s} {'pdl us':>7s} | "
          f"{'best tiling':30s} {'us':>7s} {'%':>4s} | {'gemv':>7s} {'TVM':>7s} {'torch':>7s} | {'xTVM':>5s} {'xtorch':>6s} | err")
    keys = list(dict.fromkeys((r["shape"], r["m"]) for r in recs))
    for shape, m in keys:
        group = [r for r in recs if (r["shape"], r["m"]) == (shape, m)]
        ours = [r for r in group if r["kernel"].startswith("linear_gemv2_") and not r.get("pdl") and r["ok"]]
        rule = next((r for r in group if r["rule_choice"]), None) or {"kernel": "linear_gemv2_(none)", "us": nan}
        rpdl = next((r["us"] for r in group if r.get("pdl") and r["kernel"] == rule["kernel"]), nan)
        best = min(ours, key=lambda r: r["us"]) if ours else {"kernel": "linear_gemv2_(none)", "us": nan}
        old = next((r["us"] for r in group if r.get("old_rule") and not r.get("pdl")), nan)
        t_us = next((r["us"] for r in group if r["kernel"] == "torch_f16_linear"), nan)
        v_us = tvm.get((shape, m), nan)
        b = group[0]["bytes"]
        pct = lambda us: 100 * b / us / 1e3 / bw  # noqa: E731
        worst = max((r["err"] for r in group if r["kernel"] != "torch_f16_linear"), default=0.0)
        short = lambda k: k[len("linear_gemv2_"):] if k.startswith("linear_gemv2_") else k[7:]  # noqa: E731
        print(f"{shape:14s} {m:2d} | {short(rule['kernel']):30s} {rule['us']:7.2f} {pct(rule['us']):3.0f}% {rpdl:7.2f} | "
              f"{short(best['kernel']):30s} {best['us']:7.2f} {pct(best['us']):3.0f}% | {old:7.2f} {v_us:7.2f} {t_us:7.2f} | "
              f"{v_us / rule['us']:5.2f} {t_us / rule['us']:6.2f} | {worst:.0e}")


def print_table(report: dict) -> None:
    bw = report["meta"]["copy_bandwidth"] / 1e9
    recs = report["records"]
    bad = [r for r in recs if not r["ok"]]
    nan = float("nan")
    print("\n==== linear kernels on", report["meta"].get("device"), f"(copy bandwidth {bw:.0f} GB/s) ====")
    print_gemv2_table(report)
    if any(r["section"] not in ("tvm", "gemv2") for r in recs):
        print("GEMV rows: GB/s of weight bytes and % of the copy bandwidth; GEMM rows: TFLOP/s and % of 790")
        print(f"{'shape':18s} {'M':>4s} | {'rule kernel (linear_...)':36s} {'us':>7s} {'rate':>6s} {'%':>4s} | "
              f"{'best tiling':36s} {'us':>7s} {'%':>4s} | {'torch':>7s} {'TVM':>7s} | {'x torch':>7s} {'x TVM':>6s} | err")
    seen = []
    for r in recs:
        key = (r["section"], r["shape"], r["m"])
        if r["section"] in ("tvm", "gemv2") or key in seen or r.get("pdl"):
            continue
        seen.append(key)
        group = [x for x in recs if (x["section"], x["shape"], x["m"]) == key]
        ours = [x for x in group if x["kernel"] != "torch_f16_linear"]
        if not ours:
            continue
        rule = next((x for x in ours if x["rule_choice"]), None) or {"kernel": "linear_(failed)", "us": nan,
                                                                      "gbps": nan, "tflops": nan}
        best = min(ours, key=lambda x: x["us"])
        t_us = next((x["us"] for x in group if x["kernel"] == "torch_f16_linear"), nan)
        v_us = next((x["us"] for x in recs if x["section"] == "tvm" and x["shape"] == r["shape"] and x["m"] == r["m"]), nan)
        gemm = r["section"] == "gemm"
        rate = (lambda x: x["tflops"]) if gemm else (lambda x: x["gbps"])
        pct = (lambda x: 100 * x["tflops"] / PEAK_TFLOPS) if gemm else (lambda x: 100 * x["gbps"] / bw)
        worst = max((x["err"] for x in ours), default=0.0)
        print(f"{r['shape']:18s} {r['m']:4d} | {rule['kernel'][7:43]:36s} {rule['us']:7.2f} {rate(rule):6.0f} {pct(rule):3.0f}% | "
              f"{best['kernel'][7:43]:36s} {best['us']:7.2f} {pct(best):3.0f}% | {t_us:7.2f} {v_us:7.2f} | "
              f"{t_us / rule['us']:7.2f} {v_us / rule['us']:6.2f} | {worst:.0e}")
    for c in report["decode_step"]:
        print(f"decode step (1B linears: 16 layers + LM head) M={c['m']}: grokc {c['us']:.1f} us "
              f"({c['gbps']:.0f} GB/s, {100 * c['gbps'] / bw:.0f}% of copy bw, {c['launches']} launches), "
              f"with PDL edges {c.get('pdl_us', float('nan')):.1f} us "
              f"({', '.join(f'{k} {v:.1f}' for k, v in c.get('pdl_alts_us', {}).items())}) | torch fp16 "
              f"{c['torch_us']:.1f} us ({c['torch_gbps']:.0f} GB/s) | {c['torch_us'] / c['us']:.2f}x faster")
    print(f"correctness: {len(recs) - len(bad)} of {len(recs)} timed outputs within tolerance"
          + ("" if not bad else "; OUT OF TOLERANCE: " + ", ".join(
              f"{b['kernel']}@{b['shape']}/M{b['m']} ({b['err']:.1e})" for b in bad[:12])))
    for f in report.get("failures", []):
        print(f"CRASHED: {f['job']} at {f['at']}: {' / '.join(f['log'])[-400:]}")
    print(f"total {time.perf_counter() - T0:.0f} s; JSON: $OUT/linear_bench.json")


if __name__ == "__main__":
    main()
