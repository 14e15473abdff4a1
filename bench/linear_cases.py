"""The workloads of ``bench/kernels_linear.py``: the ``linear`` calls of the Llama-3.2-1B and
SmolLM2-135M decode steps, a few prefill GEMMs and the two shapes' prefill projections, the kernel variants swept for each (for the prefill GEMMs, the gemm and wgmma families' tiles), and their
random inputs on the host and on the device (weights in enough copies to defeat L2).

Whether those kernels compute the right thing is ``tests/gpu/test_kernels_linear.py``'s job: every
family, format and swept tiling, and the rule's kernel at these model shapes, against the oracle.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from kernel_timing import ROTATE_BYTES, Uploads

from grokc.abi import int4
from grokc.abi.ops import KERNEL_ABI
from grokc.targets import KernelCall, get_target, select
from grokc.targets.rules_linear import WGMMA_FORMATS, Gemm, Gemv, Gemv2, Rows, Wgmma, parse, rule_gemv

F16, F32 = np.float16, np.float32
TARGET = get_target("sm90")
LINEAR = KERNEL_ABI["linear"]


@dataclass(frozen=True)
class Shape:
    name: str
    m: int
    n: int
    k: int
    act: str = "none"      # the op's attr: none | silu_mul
    wf: str = "q4"         # the op's attr: f16 | q4
    out: str = "f16"
    norm: bool = False
    residual: bool = False
    gs: int = 0

    @property
    def nw(self) -> int:
        return 2 * self.n if self.act == "silu_mul" else self.n

    @property
    def weight_bytes(self) -> int:
        return self.nw * self.k * 2 if self.wf == "f16" else self.nw * self.k // 2 + self.nw * 2

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

    def at(self, m: int) -> Shape:
        return dataclasses.replace(self, m=m)


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
# issue 26's prefill comparison: every projection of the Llama-3.2-1B and Llama-3-8B shapes (norms,
# SiLU-mul and residuals as the plan runs them) at prompt lengths 512 .. 4096, the rule's kernel
# against torch's fp16 F.linear of the same [M, K] x [K, NW] (no epilogue: a lower bound for torch)
PREFILL_MS = (512, 1024, 2048, 4096)
PREFILL_SHAPES = [
    Shape(f"{model}_{name}", m, n, k, **kw)
    for model, h, q, kv, inter in (("l1b", 2048, 2048, 512, 8192), ("l8b", 4096, 4096, 1024, 14336))
    for name, n, k, kw in (("qkv", q + 2 * kv, h, dict(norm=True)), ("o", h, q, dict(residual=True)),
                           ("gate_up", inter, h, dict(act="silu_mul", norm=True)),
                           ("down", h, inter, dict(residual=True)))
    for m in PREFILL_MS
]
GEMM_SHAPES = [
    Shape("gemm_up_q4", 512, 8192, 2048),
    Shape("gemm_up_f16", 512, 8192, 2048, wf="f16"),
    Shape("gemm_gate_up_q4", 512, 8192, 2048, act="silu_mul", norm=True),
    Shape("gemm_down_q4", 512, 2048, 8192, residual=True),
    Shape("gemm_qkv_q4_L2048", 2048, 3072, 2048, norm=True),
    Shape("gemm_gate_up_q4_L128", 128, 8192, 2048, act="silu_mul", norm=True),  # where wgmma starts to pay
    Shape("gemm_down_q4_L128", 128, 2048, 8192, residual=True),
]

# GEMV tilings swept at M = 1: (KS, RG, U, minblocks).
GEMV_TILINGS = [(ks, rg, u, 0) for ks, rg in ((2, 2), (2, 4), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2))
                for u in (1, 2, 4, 8)] + [(8, 1, 2, 3), (8, 1, 4, 3), (8, 1, 2, 4), (4, 2, 4, 2), (4, 2, 2, 3), (8, 1, 1, 4)]
GEMV_M16_TILINGS = [(8, 1, 2, 0), (8, 1, 1, 0), (4, 2, 2, 0), (4, 2, 4, 0), (8, 2, 2, 0), (4, 1, 2, 0)]
GEMM_TILINGS = [(128, 128, 2, 4, 3, 0), (128, 128, 2, 4, 4, 0), (128, 128, 2, 4, 3, 1), (64, 128, 2, 4, 3, 0),
                (64, 128, 2, 4, 4, 2), (128, 64, 4, 2, 3, 0), (64, 64, 2, 2, 3, 0), (64, 64, 2, 2, 4, 3)]
# the decode step is also timed (with programmatic edges) with these knobs changed in every
# gemv2 kernel of the rule's choice (nl only where there is a norm): {name: {field: value}}
DECODE_ALTS = {"p2": {"pf": 2}, "n1": {"nl": 1}, "p2n1": {"pf": 2, "nl": 1}, "p0": {"pf": 0}}


def variant(sym: str) -> Gemv | Gemv2 | Rows | Gemm | Wgmma:
    v = parse(sym)
    if v is None:
        raise ValueError(sym)
    return v


def rule(s: Shape) -> str:
    """The kernel the rules pick for the call."""
    return select(KernelCall("linear", s.attrs, s.dims), TARGET).kernel


def rule_pdl(s: Shape) -> list[str]:
    """The rule's kernel when it is launched with a programmatic edge, else nothing."""
    c = select(KernelCall("linear", s.attrs, s.dims), TARGET)
    return [c.kernel] if c.pdl else []


def old_gemv_rule(s: Shape) -> str | None:
    """What the gemv family's own rule picks (the kernel the gemv2 rule now runs ahead of)."""
    c = rule_gemv(KernelCall("linear", s.attrs, s.dims), TARGET)
    return None if c is None else c.kernel


def gemv_variants(s: Shape, tilings) -> list[Gemv]:
    act = "silu" if s.act == "silu_mul" else "none"
    nsteps = -(-s.k // (32 if s.wf == "f16" else 128))
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


def wgmma_variants(s: Shape) -> list[Wgmma]:
    """The wgmma tiles (BM, BN) at 4 and 6 stages (those that fit), for the formats it reads."""
    if s.kernel_wf() not in WGMMA_FORMATS:
        return []
    act = "silu" if s.act == "silu_mul" else "none"
    vs = [Wgmma(s.kernel_wf(), act, s.out, bm, bn, st) for bm, bn in ((128, 256), (128, 128), (64, 256), (64, 128)) for st in (4, 6)]
    return [v for v in vs if v.smem() <= TARGET.smem_per_block]


def gemv2_variants(s: Shape) -> list[Gemv2]:
    """The gemv2 tilings swept for a shape: split-K for few row groups, whole rows for many; the L2
    prefetch the rule gives each (256 B for whole rows, else 128 B), the norm as a pass, no register cap."""
    act = "silu" if s.act == "silu_mul" else "none"
    nsteps = -(-s.k // (32 if s.wf == "f16" else 128))
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
        v = Gemv2(s.kernel_wf(), act, s.out, r, ks, wn, min(d, max(per, 1)), pf=2 if ks == 1 else 1, nl=0, minb=0)
        if v.symbol not in seen and v.smem(s.m, s.k) <= TARGET.smem_per_block:
            seen.add(v.symbol)
            out.append(v)
    return out


def gemv2_focus(s: Shape) -> list[Gemv2]:
    """Around the rule's tiling: each L2 prefetch size, the norm in registers, two warps along N."""
    v = variant(rule(s))
    if not isinstance(v, Gemv2):
        return []
    alts = [dataclasses.replace(v, pf=0), dataclasses.replace(v, pf=2)]
    if s.norm:
        alts += [dataclasses.replace(v, nl=1), dataclasses.replace(v, pf=2, nl=1)]
    if v.ks > 1:
        alts.append(dataclasses.replace(v, wn=2 * v.wn))
    return [a for a in alts if parse(a.symbol) is not None and a.smem(s.m, s.k) <= TARGET.smem_per_block]


def decode_alt(s: Shape, sym: str, alt: dict) -> str:
    """``sym`` with the knobs of one ``DECODE_ALTS`` entry changed (a gemv2 kernel; others as they are)."""
    v = variant(sym)
    if not isinstance(v, Gemv2):
        return sym
    change = {k: x for k, x in alt.items() if k != "nl" or s.norm}
    return dataclasses.replace(v, **change).symbol


def launch_dims(v, s: Shape) -> tuple[tuple, tuple, int]:
    """(grid, block, dynamic shared memory) of variant ``v`` for the call ``s``."""
    if isinstance(v, (Gemv, Gemv2)):
        return (v.blocks(s.n), 1, 1), (v.threads, 1, 1), v.smem(s.m, s.k)
    if isinstance(v, Rows):
        return (v.blocks(s.n, TARGET.num_sms), 1, 1), (v.threads, 1, 1), v.smem(s.k)
    return v.grid(s.m, s.n), (v.threads, 1, 1), v.smem()


# -- inputs ---------------------------------------------------------------------------------------

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
    """Every ``linear`` argument of the call ``s`` on the host, by parameter name."""
    rng = np.random.default_rng((seed, s.m, s.n, s.k))
    a = {"x": rng.standard_normal((s.m, s.k)).astype(F16), "scales": None, "zeros": None, "norm": None,
         "residual": None, "addend": None, "bias": None, **s.dims}
    a["weight"], a["scales"] = host_weights(s, seed)
    if s.norm:
        a["norm"] = rng.uniform(0.5, 1.5, s.k).astype(F16)
    if s.residual:
        a["residual"] = rng.standard_normal((s.m, s.n)).astype(F16)
    a["out"] = np.zeros((s.m, s.n), F16 if s.out == "f16" else F32)
    return a


class DeviceCase:
    """A shape's arrays on the device: the weight (and scales) in enough copies to defeat L2."""

    def __init__(self, s: Shape, seed: int = 0, min_copies: int = 2):
        self.s = s
        host = host_case(s, seed)
        self.copies = max(min_copies, min(64, -(-ROTATE_BYTES // s.weight_bytes)))
        self.up = Uploads()
        self.weights = [self.up.ptr(host["weight"]) for _ in range(self.copies)]
        self.scales = [self.up.ptr(host["scales"]) for _ in range(self.copies)]
        self.vals = {name: self.up.ptr(host[name]) for name in ("x", "norm", "residual", "out")}

    def args(self, i: int) -> list:
        """Launch values in ``KERNEL_ABI["linear"]`` order, weight copy i."""
        v = {**self.vals, "weight": self.weights[i], "scales": self.scales[i], "zeros": None, "addend": None, "bias": None,
             **self.s.dims}
        return [v[p.name] for p in LINEAR]

    def close(self) -> None:
        self.up.close()
