"""Kernel rules for the ``linear`` op, and the kernel variants they name.

Five kernel families, tried in this order (``RULES["linear"]``; docs/kernels-linear.md has the
gemv2 family, the first):

- ``gemv``: few rows of x (decode, ``M <= 16``). Streams the weight once at full bandwidth, int4
  dequantised in registers, on tensor cores (``kernels/linear_gemv.cuh``). Symbol
  ``linear_gemv_<wf>_<act>_<out>_m<MT>k<KS>r<RG>u<U>b<B>``: ``MT`` rows of x per MMA (8 or 16),
  ``KS`` warps split K, ``RG`` row groups of 8 weight rows per block, ``U`` 16-byte loads per
  lane per round, ``B`` the ``__launch_bounds__`` minimum of blocks per SM (0: none).
- ``gemm``: many rows (prefill). Tensor-core GEMM with cp.async stages
  (``kernels/linear_gemm.cuh``). Symbol ``linear_gemm_<wf>_<act>_<out>_m<BM>n<BN>w<WM>x<WN>s<ST>b<B>``:
  block tile ``BM x BN``, ``WM x WN`` warps, ``ST`` cp.async stages.
- ``wgmma`` (sm_90a, ``Feature.WGMMA``; tried before ``gemm``): prefill, ``M >= WGMMA_MIN_M``, f16
  and per-channel int4 weights (``kernels/linear_wgmma.cuh``): warpgroup MMA from 128-byte-swizzled
  shared memory, int4 converted to f16 there by the consumer warpgroups. Symbol ``linear_wgmma_<wf>_<act>_<out>_m<BM>n<BN>s<ST>``:
  ``BM / 64`` consumer warpgroups, ``BN`` weight rows, ``ST`` cp.async stages. Every act, out dtype, norm,
  zeros, residual, addend and bias; grouped int4, int8 and f32 inputs stay with ``gemm`` / ``ref``.
- ``ref``: anything else (odd K, odd group size). One thread per output, fp32
  (``kernels/linear_ref.cuh``). Symbol ``linear_ref_<wf>_<act>_<out>``.

``wf`` is ``f16``, ``q4`` (one scale per row: ``group_size == 0`` or ``>= K``) or ``q4g``
(groups along K), or ``q8`` (int8 codes, ``abi/int8.py``: gemv2 per row only, ref any group
size; the gemv and gemm families do not read int8, so a q8 call past gemv2 falls back to ref);
``act`` is ``none``, ``silu`` (``silu_mul``) or ``gelu`` (``gelu_tanh_mul``); ``out`` is ``f16`` or ``f32``.
A null ``bias`` is handled at run time too.
Null ``zeros``, ``norm`` and ``residual`` are handled at run time by every kernel.
f32 inputs (kernel_abi's ``x_dtype`` / ``residual_dtype``; the batch-1 decode graph's layer outputs,
``passes/fuse_decode_mlp.py``) are read by gemv2, rows and ref, whose symbols then end in ``_<io>``:
``x32``, ``r32`` or ``x32r32``; the gemv and gemm families take f16 inputs only.

Ahead of them all, ``rules_tvm.rule_tvm``: Apache TVM's dlight kernels, only where the build asks for
them (``--kernels tvm``) or ``rules_tvm.AUTO_TVM`` lists the arch (none yet).

Module protocol (shared with ``rules_attention`` and ``rules_misc``): ``RULES``, ``HEADERS``
(files under ``targets/kernels/`` the sources need) and ``kernel_source(symbol)``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from grokc.targets.base import Feature, KernelCall, KernelChoice, Target
from grokc.targets.linear_variants import (  # noqa: F401  (parse, kernel_source: the module protocol)
    ACT_SYMBOL, GEMV2_MAX_M, GEMV_X_BUDGET, REF_THREADS, WGMMA_FORMATS, Gemm, Gemv, Gemv2, Ref, Rows, Wgmma,
    gemv2_step_k, kernel_source, parse)
from grokc.targets.rules_tvm import rule_tvm

HEADERS: tuple[str, ...] = (
    "common.cuh", "pdl.cuh", "linear_common.cuh", "linear_gemv2.cuh", "linear_gemv.cuh", "linear_gemm.cuh",
    "linear_wgmma.cuh", "linear_ref.cuh", "linear_rows.cuh",
)

GEMV_MAX_M = 16
# rows of x from which sm_90a runs the wgmma family: on the H200 its prefill graphs took 6.50 / 35.2 ms
# against linear_gemm's 7.65 / 45.6 at 512 tokens (Llama-1B / 8B shapes), but 3.95 / 15.70 against
# 3.17 / 15.27 at 128 (bench/results/2026-12-02c-*; the kernel before its 2026-12-03 rework, which at
# M = 128 ran gate_up in 37 us against gemm's 61 but down in 85 against 56: not yet rerun on whole
# graphs); its tiles reach 64 rows
WGMMA_MIN_M = 512


# ---- rules ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Linear:
    """A linear call's attributes and dims, checked; None from ``_linear`` when they are invalid."""

    fmt: str     # "f16" | "q4" | "q8"
    act: str     # "none" | "silu" | "gelu"
    out: str     # "f16" | "f32"
    m: int
    n: int
    k: int
    gs: int
    io: str = ""  # f32 inputs, as the symbols name them

    @property
    def nw(self) -> int:
        return 2 * self.n if self.act != "none" else self.n

    @property
    def per_channel(self) -> bool:
        return self.gs == 0 or self.gs >= self.k

    @property
    def wf(self) -> str:
        """The fast kernels' format: q4 and q8 split into per-channel and grouped (``q8g``, no kernel's)."""
        if self.fmt == "f16":
            return "f16"
        return self.fmt if self.per_channel else self.fmt + "g"

    @property
    def fast_ok(self) -> bool:
        """Format and shape requirements of the gemv and gemm kernels (f16 and q4 only)."""
        if self.fmt == "f16":
            return self.k % 8 == 0
        if self.fmt == "q4":
            return self.k % 32 == 0 and (self.per_channel or self.gs % 32 == 0)
        return False

    @property
    def gemv2_ok(self) -> bool:
        """Format and shape requirements of the gemv2 kernels: the fast ones', plus per-channel q8
        with whole 16-byte chunks (``K % 16 == 0``)."""
        return self.fast_ok or (self.wf == "q8" and self.k % 16 == 0)


def _linear(call: KernelCall) -> _Linear | None:
    a, d = call.attrs, call.dims
    try:
        fmt, act, out = a["weight_format"], ACT_SYMBOL[a["act"]], a["out_dtype"]
        m, n, k, gs = int(d["M"]), int(d["N"]), int(d["K"]), int(d["group_size"])
    except KeyError:
        return None
    x32, r32 = a.get("x_dtype", "f16"), a.get("residual_dtype", "f16")
    if fmt not in ("f16", "q4", "q8") or out not in ("f16", "f32") or m < 1 or n < 1 or k < 8 or k % 8 or gs < 0 \
            or x32 not in ("f16", "f32") or r32 not in ("f16", "f32"):
        return None
    return _Linear(fmt, act, out, m, n, k, gs, ("x32" if x32 == "f32" else "") + ("r32" if r32 == "f32" else ""))


def gemv2_variant(lin: _Linear, target: Target) -> Gemv2:
    """The gemv2 tiling for a call (M <= 8), fitted to the H200 sweeps (docs/kernels-linear.md).

    A row group is 16 A rows (16 outputs, or 8 for silu_mul); a step is 128 k of int4, 64 k of
    int8 or 32 k of f16 (1 KB of weights per row group in every format).

    - R = 2 row groups per warp once there are more row groups than SMs, else 1;
    - K is split over KS warps until each warp has at most 2 steps (at most 16 warps), then KS
      is halved while the grid would exceed about 16 resident warps per SM (a second wave costs
      more than deeper split-K saves: gate_up at KS = 8 ran 10.9 us against 8.5 at KS = 4);
    - a ring of 2 steps for split-K tilings; whole rows (KS = 1, the LM head) take a ring of 3,
      4 warps a block (8 past M = 4, sharing one copy of x) and the 256-byte L2 prefetch
      (128.5 us against 129.4; without any prefetch hint 203);
    - past M = 4 the staged x costs more per block: a grid of at least 2 blocks per SM gets
      twice the warps along N (gate_up at M = 8: 10.7 us against 12.3), the others apply the
      norm per step in registers (qkv at M = 8: 5.0 against 6.3; at M = 1 the pass is cheaper,
      4.2 against 4.3, gate_up 8.4 against 9.2);
    - except per-channel int4 without an activation at R = 2 (qkv), which takes the norm per step at
      every M: it reads its codes raw (linear_gemv2.cuh), so the step's extra MMAs cost little
      and the pass's barrier goes; in the 1B decode chain at batch 1, 466.9 against 473.5 us a step
      (docs/performance.md, run 101). Capped at 128 registers (B 2: 256 threads), so that a block
      still fits beside an ``mlp_decode`` block;
    - on sm_90+, a tiling whose warps load all their weights before griddepcontrol.wait (every
      warp's steps fit its ring: qkv and o of the 1B shape) lets the next launch start only after
      that wait (TR 1): it has nothing left to stream, and the next kernel's early blocks would only
      compete with the kernel before it for memory and SMs. Llama-1B decode step, same device call:
      batch 1 0.987x, 2 0.973x, 4 0.950x, 8 0.943x; TR 1 on gate_up and down too was worse (0.960x
      at batch 8): they still stream after the wait, and the next kernel's early start overlaps that.
      Except a linear adding an f32 residual: the o projection in front of ``mlp_decode``
      (``passes/fuse_decode_mlp.py``), whose blocks do nothing but request their weights before their
      own wait, so they should start while o waits for attention (docs/performance.md, run 91: 496.9
      against 503.4 us a step with o after its wait).
    """
    groups = -(-lin.n // 8) if lin.act != "none" else -(-lin.nw // 16)
    nsteps = -(-lin.k // gemv2_step_k(lin.wf))
    r = 2 if groups >= target.num_sms else 1
    rows = -(-groups // r)  # warps along N
    ks = 1
    while ks < 16 and -(-nsteps // ks) > 2:
        ks *= 2
    while ks > 1 and rows * ks > 16 * target.num_sms:
        ks //= 2
    per = -(-nsteps // ks)
    big_m = lin.m > 4
    d = min(3 if ks == 1 else 2, per)
    tr = int(target.has(Feature.PDL) and per <= d and "r32" not in lin.io)  # a warp loads all its weights before the wait
    if ks == 1:
        return Gemv2(lin.wf, lin.act, lin.out, r, 1, 8 if big_m else 4, d, 2, int(big_m), 0, tr, lin.io)
    wn = 2 if big_m and rows >= 2 * target.num_sms else 1
    raw_norm_loop = not big_m and lin.wf == "q4" and lin.act == "none" and r == 2
    nl = int((big_m and wn == 1) or raw_norm_loop)
    return Gemv2(lin.wf, lin.act, lin.out, r, ks, wn, d, 1, nl, 2 if raw_norm_loop else 0, tr, lin.io)


def rule_gemv2(call: KernelCall, target: Target) -> KernelChoice | None:
    if call.op != "linear" or (lin := _linear(call)) is None:
        return None
    if lin.m > GEMV2_MAX_M or not lin.gemv2_ok:
        return None
    v = gemv2_variant(lin, target)
    smem = v.smem(lin.m, lin.k)
    if smem > target.smem_per_block:  # x does not fit (e.g. K = 8192 at M = 8 on a 99 KB part)
        return None
    return KernelChoice(v.symbol, (v.blocks(lin.n), 1, 1), (v.threads, 1, 1), smem, "linear.gemv2",
                        pdl=target.has(Feature.PDL))


def gemv_variant(lin: _Linear, target: Target) -> Gemv:
    """The GEMV tiling for a call: K split so each warp gets >= 2 steps, blocks filling the GPU."""
    step_k = 32 if lin.wf == "f16" else 128
    nsteps = -(-lin.k // step_k)
    ks = next(s for s in (8, 4, 2, 1) if s == 1 or s * 2 <= nsteps)
    u = min(4, -(-nsteps // ks))
    rg = max(1, 8 // ks)
    while rg > 1 and -(-lin.nw // (8 * rg)) < 2 * target.num_sms:
        rg //= 2
    v = Gemv(lin.wf, lin.act, lin.out, 8 if lin.m <= 8 else 16, ks, rg, u, 0)
    while v.smem(lin.m, lin.k) > target.smem_per_block and v.u > 1:  # big M * K: shorter rounds
        v = dataclasses.replace(v, u=v.u // 2)
    return v


def rule_gemv(call: KernelCall, target: Target) -> KernelChoice | None:
    """Not in deterministic builds: its sums of squares meet by shared-memory atomics."""
    if call.op != "linear" or target.deterministic or (lin := _linear(call)) is None:
        return None
    if lin.m > GEMV_MAX_M or not lin.fast_ok or lin.io:
        return None
    v = gemv_variant(lin, target)
    smem = v.smem(lin.m, lin.k)
    if smem > target.smem_per_block:
        return None
    return KernelChoice(v.symbol, (v.blocks(lin.n), 1, 1), (v.threads, 1, 1), smem, "linear.gemv")


_GEMM_TILES = ((128, 128, 2, 4), (64, 128, 2, 4), (64, 64, 2, 2))


def _filling_tile(variants, lin: _Linear, target: Target):
    """The first of ``variants`` (one per tile, largest first; None where the tile does not fit)
    whose grid gives every SM a block, else the last that fits; None when none fits."""
    best = None
    for v in variants:
        if v is None:
            continue
        best = v
        gx, gy, _ = v.grid(lin.m, lin.n)
        if gx * gy >= target.num_sms:
            break
    return best


def gemm_variant(lin: _Linear, target: Target) -> Gemm | None:
    """The largest tile that still gives every SM a block, with as many stages as fit (3, else 2)."""
    def fitting(bm: int, bn: int, wm: int, wn: int) -> Gemm | None:
        return next((v for st in (3, 2) if (v := Gemm(lin.wf, lin.act, lin.out, bm, bn, wm, wn, st, 0)).valid()
                     and v.smem() <= target.smem_per_block), None)
    return _filling_tile((fitting(*tile) for tile in _GEMM_TILES), lin, target)


def rule_gemm(call: KernelCall, target: Target) -> KernelChoice | None:
    if call.op != "linear" or (lin := _linear(call)) is None or not lin.fast_ok or lin.io:
        return None
    v = gemm_variant(lin, target)
    if v is None:
        return None
    return KernelChoice(v.symbol, v.grid(lin.m, lin.n), (v.threads, 1, 1), v.smem(), "linear.gemm")


_WGMMA_TILES = ((128, 256), (128, 128), (64, 128))  # (BM, BN), largest first


WGMMA_STAGES_64 = 4  # stages of a 64-row wgmma tile: two of its blocks share an SM (see wgmma_variant)


def wgmma_variant(lin: _Linear, target: Target) -> Wgmma | None:
    """The largest tile that still gives every SM a block (else the smallest), with as many stages as
    fit (<= 6; a 64-row tile at most ``WGMMA_STAGES_64``); None when not even 3 stages of the
    smallest fit.

    A 64-row tile (one consumer warpgroup, 256 threads, 127 registers) at 4 stages needs 100 KB of
    shared memory, so two of its blocks share an H200 SM; at 6 (125 KB) one. On the H200 sweep of
    2026-12-03 (bench/results/kernels/2026-12-03-nvidia-h200-linear.json, same run) 64 x 128 at 4
    stages ran 1.04-1.53x faster than at 6 on all six shapes (int4 up, gate_up, down and qkv,
    f16 up, gate_up at M = 128), while 128-row tiles, one block an SM either way, ran within 2.5 %
    at 4, 5 or 6."""
    def fitting(bm: int, bn: int) -> Wgmma | None:
        most = WGMMA_STAGES_64 if bm == 64 else 6
        return next((v for st in range(most, 2, -1) if (v := Wgmma(lin.wf, lin.act, lin.out, bm, bn, st)).smem()
                     <= target.smem_per_block), None)
    return _filling_tile((fitting(*tile) for tile in _WGMMA_TILES), lin, target)


def rule_wgmma(call: KernelCall, target: Target) -> KernelChoice | None:
    """Prefill on sm_90a: f16 or per-channel int4 weights, f16 inputs, ``M >= WGMMA_MIN_M``."""
    if call.op != "linear" or not target.has(Feature.WGMMA) or (lin := _linear(call)) is None:
        return None
    if lin.m < WGMMA_MIN_M or not lin.fast_ok or lin.wf not in WGMMA_FORMATS or lin.io:
        return None
    v = wgmma_variant(lin, target)
    if v is None:
        return None
    return KernelChoice(v.symbol, v.grid(lin.m, lin.n), (v.threads, 1, 1), v.smem(), "linear.wgmma")


def rule_ref(call: KernelCall, target: Target) -> KernelChoice | None:
    """Fallback: every valid linear call."""
    if call.op != "linear" or (lin := _linear(call)) is None:
        return None
    v = Ref(lin.fmt, lin.act, lin.out, lin.io)
    return KernelChoice(v.symbol, (math.ceil(lin.n / REF_THREADS), lin.m, 1), (REF_THREADS, 1, 1), 0, "linear.ref")


ROWS_MIN_N = 32768  # rows from which a batch-1 f16 GEMV (an LM head) runs linear_rows


def rule_rows(call: KernelCall, target: Target) -> KernelChoice | None:
    """A batch-1 f16 LM head: ``linear_rows``, one warp per row reading 512 contiguous bytes per
    instruction, 8 warps a block, 4 blocks per SM (64 registers: 8 loads of 16 bytes per lane in
    flight), the grid one wave of them. Its reads are as TVM dlight's GEMV makes them, which streams
    the 1B shape's head at 4.5 TB/s where gemv2 (MMA fragments: 64 bytes of 8 rows per instruction)
    reaches 4.1. Smaller or quantised matrices stay with gemv2, whose split-K and dequantisation
    this kernel does not have."""
    if call.op != "linear" or (lin := _linear(call)) is None:
        return None
    if lin.fmt != "f16" or lin.act != "none" or lin.m != 1 or lin.n < ROWS_MIN_N:
        return None
    v = Rows(lin.out, 8, min(8, -(-lin.k // 256)), 4, 0, lin.io)
    smem = v.smem(lin.k)
    if smem > target.smem_per_block:
        return None
    return KernelChoice(v.symbol, (v.blocks(lin.n, target.num_sms), 1, 1), (v.threads, 1, 1), smem, "linear.rows",
                        pdl=target.has(Feature.PDL))


# rule_tvm answers only where the build asks for TVM's kernels or AUTO_TVM says they won (rules_tvm)
RULES = {"linear": [rule_tvm, rule_rows, rule_gemv2, rule_gemv, rule_wgmma, rule_gemm, rule_ref]}
