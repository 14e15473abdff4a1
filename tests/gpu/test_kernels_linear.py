"""The ``linear`` kernels against the numpy oracle (``runner/cpu.py``), on the GPU.

Every case draws fresh random inputs (seeded by the case, so a failure replays), poisons ``out``
with NaN and checks that every element was written and that

    ||got - want|| / ||want|| <= 2e-3   for f16 weights, per-channel symmetric int4 and int8,
                              <= 5e-3   for int4 with zeros or groups,

where ``want`` is ``OPS["linear"]`` in fp32. Where the error comes from: x (times ``norm``) is
rounded to f16 once (2**-11 relative), the f16 output is rounded once, int4 codes minus 8 are
exact in f16 and accumulate in fp32 on the tensor cores; zeros and group scales are folded into
the f16 weights (one more 2**-11 rounding per weight). int8 (the LM head's format) has integer
zero-points here, as the quantize pass stores them, so (code - 128) - (zero - 128) is exact in f16
and its zeros cost nothing: 2e-3 with and without. Also ``max |got - want| <= 20 * tol *
rms(want)``, so a few badly wrong elements cannot hide in the norm.

Covered: every family (linear_rows for batch-1 f16 heads, gemv2 M <= 8, gemv M <= 16, gemm, wgmma on
sm_90a from M = 64, the fp32 fallback), f16 / int4 per-channel / with
zeros / groups of 32 and 128, int8 per channel with and without zeros (gemv2 at M <= 8, the fallback
past it and for groups of 64), none / silu_mul / gelu_tanh_mul, f16 / f32 out, with and without
norm, residual, ``addend`` (the sparse residual's f32 product, added before the activation) and
``bias`` (Qwen2's q/k/v biases, added at the same point),
``out`` aliasing ``residual``, odd shapes (K = 576, N not a multiple of any tile, M = 1, 3, 8, 16,
17, 100, 130, multi-slab staging at M = 16, K = 8192), and each GEMV / GEMM tiling the bench
sweeps; gemv2 tilings at every M = 1..8, with K tails (K = 576, 40) and partial row groups; the
rule's kernel for every decode call of Llama-3.2-1B and SmolLM2-135M at M = 1, 2, 4, 8; each wgmma
tiling on odd shapes, and the rule's (wgmma) kernel for the prefill projections of Llama-3.2-1B and
Llama-3-8B.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from kernel_harness import Launch, Shared, run_chain, run_kernel, seeded

from grokc.abi import int4
from grokc.abi.ops import KERNEL_ABI
from grokc.runner.cpu import OPS
from grokc.targets import KernelCall, build_kernels, get_target, rules_linear, select
from grokc.targets.base import Feature

F16, F32 = np.float16, np.float32

# weight formats: (weight_format attr, group_size, zeros?)
FORMATS = {"f16": ("f16", 0, False), "q4": ("q4", 0, False), "q4z": ("q4", 0, True),
           "q4g128z": ("q4", 128, True), "q4g32": ("q4", 32, False),
           "q8": ("q8", 0, False), "q8z": ("q8", 0, True), "q8g64z": ("q8", 64, True)}
TOL = {"f16": 2e-3, "q4": 2e-3, "q4z": 5e-3, "q4g128z": 5e-3, "q4g32": 5e-3, "q8": 2e-3, "q8z": 2e-3, "q8g64z": 2e-3}

# (M, N, K): gemv, multi-slab gemv, gemm with partial tiles, and the fallback (K % 32 != 0)
SHAPES = [(1, 3072, 2048), (1, 960, 576), (3, 100, 576), (8, 1000, 1536), (16, 200, 2048),
          (16, 72, 8192), (17, 200, 576), (100, 1000, 2048), (130, 300, 1536), (2, 40, 40)]

# Tilings the bench sweeps, checked on odd shapes (not what the rules would pick there).
GEMV_TILINGS = [(8, 1, 2, 0), (8, 1, 4, 0), (8, 1, 1, 0), (4, 2, 4, 0), (4, 1, 3, 0), (2, 4, 8, 0),
                (1, 8, 4, 0), (2, 2, 2, 2), (8, 2, 4, 0), (4, 4, 2, 0), (8, 1, 8, 3)]
# gemv2 tilings (R, KS, WN, D, PF, NL, minblocks): every value of each knob, split-K and whole-row
# paths, the norm pass (NL 0) and the norm in registers (NL 1: run with a norm in every case).
GEMV2_TILINGS = [(1, 1, 1, 1, 1, 0, 0), (1, 2, 1, 4, 1, 0, 0), (1, 4, 1, 2, 1, 0, 0), (1, 8, 1, 2, 1, 0, 0),
                 (1, 16, 1, 1, 1, 0, 0), (2, 1, 4, 3, 1, 0, 0), (2, 2, 2, 4, 1, 0, 0), (4, 1, 2, 2, 1, 0, 0),
                 (3, 1, 2, 2, 1, 0, 0), (1, 4, 2, 3, 1, 0, 0), (2, 1, 1, 4, 1, 0, 0), (4, 2, 1, 2, 1, 0, 2),
                 (2, 8, 1, 2, 2, 0, 0), (2, 1, 8, 3, 0, 0, 0), (2, 4, 1, 2, 1, 1, 0), (1, 16, 1, 2, 2, 1, 0),
                 (2, 1, 4, 3, 2, 1, 0), (1, 1, 1, 2, 1, 1, 0), (2, 2, 2, 2, 0, 1, 0)]
# ... and with the next launch triggered after griddepcontrol.wait (TR 1, the last field).
GEMV2_TR_TILINGS = [(1, 16, 1, 2, 1, 0, 0, 1), (2, 8, 1, 2, 1, 0, 0, 1), (1, 4, 2, 3, 0, 1, 0, 1),
                    (2, 1, 4, 3, 1, 0, 0, 1)]
GEMM_TILINGS = [(128, 128, 2, 4, 3, 0), (64, 128, 2, 4, 3, 0), (64, 64, 2, 2, 3, 0), (128, 128, 2, 4, 4, 1),
                (128, 64, 4, 2, 3, 0), (64, 128, 2, 4, 2, 2)]



def make_case(rng, m: int, n: int, k: int, fmt: str, act: str, out: str, norm: bool, residual: bool,
              addend: bool = False, bias: bool = False) -> tuple:
    """(args, attrs) for one launch: kernel_abi parameter name -> numpy array / scalar / None."""
    wf, gs, zeros = FORMATS[fmt]
    nw = n if act == "none" else 2 * n
    args = {"x": rng.standard_normal((m, k)).astype(F16), "scales": None, "zeros": None, "norm": None,
            "residual": None, "addend": None, "bias": None, "M": m, "N": n, "K": k, "group_size": gs, "eps": 1e-5}
    if wf == "f16":
        args["weight"] = (rng.standard_normal((nw, k)) / np.sqrt(k)).astype(F16)
    else:  # codes uniform over the format's range, scales giving weights of std ~1/sqrt(K)
        g = -(-k // (gs or k))
        q8 = wf == "q8"
        codes = rng.integers(0, 256 if q8 else 16, (nw, k), dtype=np.uint8)
        args["weight"] = codes if q8 else int4.pack(codes)
        code_std = 74.0 if q8 else 4.0   # about the std of (code - midpoint): 73.9 and 4.6
        args["scales"] = (rng.uniform(0.5, 1.5, (nw, g)) / (code_std * np.sqrt(k))).astype(F16)
        if zeros:   # int8: integer zero-points near the midpoint, as int8_rtn stores them
            args["zeros"] = (rng.integers(100, 157, (nw, g)) if q8 else rng.uniform(5.0, 11.0, (nw, g))).astype(F16)
    if norm:
        args["norm"] = rng.uniform(0.5, 1.5, k).astype(F16)
    if residual:
        args["residual"] = rng.standard_normal((m, n)).astype(F16)
    if addend:  # about a third of the products' size, gate and up rows alike
        args["addend"] = (0.3 * rng.standard_normal((m, nw))).astype(F32)
    if bias:
        args["bias"] = (0.5 * rng.standard_normal(nw)).astype(F16)
    args["out"] = np.full((m, n), np.nan, F16 if out == "f16" else F32)
    return args, {"weight_format": wf, "act": act, "out_dtype": out}


def oracle(args: dict, attrs: dict) -> np.ndarray:
    ref = {key: (v.copy() if isinstance(v, np.ndarray) else v) for key, v in args.items()}
    OPS["linear"](ref, attrs)
    return ref["out"].astype(np.float64)


def check(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    got = got.astype(np.float64)
    assert not np.isnan(got).any(), f"{what}: {np.isnan(got).sum()} of {got.size} outputs unwritten or NaN"
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    worst = np.abs(got - want).max()
    rms = np.sqrt(np.mean(want**2))
    assert err <= tol, f"{what}: relative error {err:.2e} > {tol:.0e}"
    assert worst <= 20 * tol * rms, f"{what}: max error {worst:.3e} > {20 * tol:.0e} * rms {rms:.3e}"


def choose(args: dict, attrs: dict, sm: int):
    dims = {p.name: args[p.name] for p in KERNEL_ABI["linear"] if p.kind.value != "ptr"}
    return select(KernelCall("linear", attrs, dims), get_target(f"sm{sm}"))


# -- the cases ---------------------------------------------------------------------------------

def _cases() -> list[tuple]:
    """Each shape x format x act, with out dtype, norm, residual and addend rotating so all combine."""
    cases = []
    for i, ((m, n, k), fmt, act) in enumerate(
            (s, f, a) for s in SHAPES for f in FORMATS if not f.startswith("q8") for a in ("none", "silu_mul")):
        if fmt != "f16" and k % 8:
            continue
        out = ("f16", "f32")[i % 2]
        norm = (i // 2) % 2 == 0
        residual = (i // 4) % 2 == 0
        addend = (i // 8) % 2 == 1
        cases.append((m, n, k, fmt, act, out, norm, residual, addend))
    return cases


# The int8 LM head (act none, f32 out, no residual) at the models' shapes and odd ones, every M the
# rules give gemv2 and the fallback past it; plus silu_mul, f16 out, norm, residual and addend on
# odd shapes, so the q8 path is checked beyond what the head uses.
Q8_CASES = [(m, n, k, fmt, "none", "f32", norm, False, False)
            for (n, k) in ((49152, 576), (128256, 2048), (1000, 1008), (40, 64))
            for m, fmt, norm in ((1, "q8", False), (2, "q8z", True), (4, "q8", True), (5, "q8z", False),
                                 (8, "q8", False), (8, "q8z", True), (9, "q8z", False))
            if n < 100000 or m in (1, 8)] + \
    [(3, 100, 576, "q8z", "silu_mul", "f16", True, True, True), (7, 200, 1536, "q8", "none", "f16", False, True, True),
     (1, 24, 48, "q8", "silu_mul", "f32", True, False, False), (3, 100, 40, "q8z", "none", "f16", True, True, False),
     (2, 300, 576, "q8g64z", "none", "f32", True, False, True), (16, 200, 2048, "q8g64z", "silu_mul", "f16", False, True, False)]
# The f16 LM heads at batch 1 (linear_rows) with the final norm, as the models run them.
HEAD_CASES = [(1, 128256, 2048, "f16", "none", "f32", True, False, False),
              (1, 49152, 576, "f16", "none", "f32", True, False, False)]
# The decode calls of Llama-3.2-1B and SmolLM2-135M as the models make them (the norm before qkv,
# gate_up and the head, the residual after o and down) at every batch gemv2 serves: what
# bench/kernels_linear.py times, each with the rule's kernel for that exact shape.
MODEL_CALLS = [(n, k, "q4", act, "f16", norm, not norm)
               for n, k, act, norm in ((3072, 2048, "none", True), (2048, 2048, "none", False),     # Llama: qkv, o,
                                       (8192, 2048, "silu_mul", True), (2048, 8192, "none", False),  # gate_up, down
                                       (960, 576, "none", True), (576, 576, "none", False),          # SmolLM2
                                       (1536, 576, "silu_mul", True), (576, 1536, "none", False))] + \
              [(128256, 2048, "f16", "none", "f32", True, False), (49152, 576, "f16", "none", "f32", True, False)]
MODEL_CASES = [(m, *call, False) for m in (1, 2, 4, 8) for call in MODEL_CALLS]
CASES = list(dict.fromkeys(_cases() + Q8_CASES + HEAD_CASES + MODEL_CASES))


def _bias_gelu_cases() -> list[tuple]:
    """GeGLU (Gemma 3) and biases (Qwen2's qkv) on every family the rules pick, the other epilogue
    inputs rotating: (M, N, K, format, act, out, norm, residual, addend, bias)."""
    cases = []
    shapes = [(1, 960, 576), (3, 100, 576), (16, 200, 2048), (100, 1000, 2048), (2, 40, 40)]
    for i, ((m, n, k), fmt, act) in enumerate((s, f, a) for s in shapes for f in ("f16", "q4", "q4g128z", "q8")
                                              for a in ("none", "gelu_tanh_mul", "silu_mul")):
        if fmt != "f16" and k % 8:
            continue
        cases.append((m, n, k, fmt, act, ("f16", "f32")[i % 2], i % 3 != 0, (i // 2) % 2 == 0, i % 4 == 3,
                      act != "gelu_tanh_mul" or i % 2 == 0))
    return cases


BIAS_GELU_CASES = _bias_gelu_cases()


def kernel_wf(fmt: str) -> str:
    """The symbol's weight format of a FORMATS entry: int4 with groups is q4g."""
    wf, gs, _ = FORMATS[fmt]
    return "q4g" if wf == "q4" and gs else wf


def _gemv_variant_cases() -> list[tuple]:
    cases = []
    for ks, rg, u, b in GEMV_TILINGS:
        for fmt, act, out, m, mt in (("q4", "silu_mul", "f16", 3, 8), ("f16", "none", "f32", 1, 8),
                                     ("q4g128z", "none", "f16", 12, 16), ("q4", "gelu_tanh_mul", "f32", 5, 8)):
            v = rules_linear.Gemv(kernel_wf(fmt), rules_linear.ACT_SYMBOL[act], out, mt, ks, rg, u, b)
            cases.append((v, m, 200, 1536, fmt, act, out))
    return cases


def _gemm_variant_cases() -> list[tuple]:
    cases = []
    for bm, bn, wm, wn, st, b in GEMM_TILINGS:
        for fmt, act, out in (("q4", "silu_mul", "f16"), ("f16", "none", "f32"), ("q4g32", "none", "f16"),
                              ("f16", "gelu_tanh_mul", "f16")):
            v = rules_linear.Gemm(kernel_wf(fmt), rules_linear.ACT_SYMBOL[act], out, bm, bn, wm, wn, st, b)
            if v.valid():
                cases.append((v, 100, 300, 576, fmt, act, out))
    return cases


def _gemv2_variant_cases() -> list[tuple]:
    """Each tiling on three formats at M = 1..8 (rotating), K with a partial step, N with partial groups."""
    cases = []
    combos = (("q4", "silu_mul", "f16", 200, 1536), ("f16", "none", "f32", 200, 1000), ("q4g128z", "none", "f16", 200, 576),
              ("q4z", "none", "f16", 72, 8192), ("q4g32", "silu_mul", "f32", 40, 576), ("f16", "silu_mul", "f16", 24, 40),
              ("q8z", "none", "f32", 200, 1008), ("q8", "silu_mul", "f16", 40, 592),   # int8: K tails of 48 and 16
              ("q4", "gelu_tanh_mul", "f16", 200, 576))
    for i, tiling in enumerate(GEMV2_TILINGS + GEMV2_TR_TILINGS):
        nl = tiling[5]
        for j, (fmt, act, out, n, k) in enumerate(combos):
            v = rules_linear.Gemv2(kernel_wf(fmt), rules_linear.ACT_SYMBOL[act], out, *tiling)
            m = 1 + (i + 3 * j) % 8
            cases.append((v, m, n, k, fmt, act, out, nl == 1 or (i + j) % 2 == 0, (i + j) % 3 != 0,
                          (i + 2 * j) % 3 == 0))
    return cases


def _rows_variant_cases() -> list[tuple]:
    """linear_rows tilings (M = 1, f16, act none): K of one round, of several (K > 256 U), with a
    partial round and of one chunk; grids of 3 blocks (every warp strides over many rows) and full."""
    cases = []
    tilings = [(8, 8, 4, 0), (4, 2, 2, 1), (1, 1, 1, 0), (8, 3, 4, 0), (16, 4, 1, 0)]
    shapes = [(1000, 2048), (333, 576), (77, 40), (50, 8200), (10, 8)]
    for i, (w, u, b, tr) in enumerate(tilings):
        for j, (n, k) in enumerate(shapes):
            v = rules_linear.Rows(("f16", "f32")[(i + j) % 2], w, u, b, tr)
            grid = 3 if (i + j) % 2 else v.blocks(n, 132)
            cases.append((v, n, k, grid, (i + j) % 3 != 0, (i + 2 * j) % 3 == 0, (2 * i + j) % 4 == 0))
    return cases


ROWS_CASES = _rows_variant_cases()
GEMV_CASES = _gemv_variant_cases()
GEMV2_CASES = _gemv2_variant_cases()
GEMM_CASES = _gemm_variant_cases()

# The wgmma family (sm_90a). Its tilings (BM, BN, stages) on odd shapes: M and N not multiples of
# any tile, K with a partial 64-k tile (1504, 1000, 576 = 9 whole ones), every epilogue input, each
# format and activation; (M, N, K, format, act, out, norm, residual, addend, bias).
WGMMA_TILINGS = [(128, 256, 5), (128, 128, 6), (64, 128, 6), (128, 256, 4), (64, 256, 4), (64, 128, 3), (64, 128, 4)]
WGMMA_ODD = [(100, 1000, 2048, "q4z", "none", "f32", True, True, True, False),
             (130, 300, 1504, "q4", "gelu_tanh_mul", "f16", False, True, True, True),
             (777, 600, 1000, "f16", "silu_mul", "f16", True, True, False, False),
             (64, 72, 576, "f16", "none", "f32", False, False, True, True),
             (300, 520, 1504, "q4z", "silu_mul", "f16", True, False, False, True)]
# The prefill projections of Llama-3.2-1B and Llama-3-8B as the plans run them (bench/linear_cases.py's
# PREFILL_SHAPES at M = 512, down at 1024), each with the rule's kernel: (M, N, K, format, act, out,
# norm, residual, addend).
WGMMA_PREFILL = [(512, 3072, 2048, "q4", "none", "f16", True, False, False),
                 (512, 2048, 2048, "q4", "none", "f16", False, True, False),
                 (512, 8192, 2048, "q4", "silu_mul", "f16", True, False, False),
                 (1024, 2048, 8192, "q4", "none", "f16", False, True, False),
                 (512, 6144, 4096, "q4", "none", "f16", True, False, False),
                 (512, 14336, 4096, "q4", "silu_mul", "f16", True, False, False),
                 (512, 4096, 14336, "q4", "none", "f16", False, True, False)]


def _wgmma_variant_cases() -> list[tuple]:
    cases = []
    for i, (bm, bn, st) in enumerate(WGMMA_TILINGS):
        for j in (i, i + 1):  # two odd cases per tiling, each case on two tilings
            m, n, k, fmt, act, out, *rest = WGMMA_ODD[j % len(WGMMA_ODD)]
            v = rules_linear.Wgmma(kernel_wf(fmt), rules_linear.ACT_SYMBOL[act], out, bm, bn, st)
            cases.append((v, m, n, k, fmt, act, out, *rest))
    return cases


WGMMA_CASES = _wgmma_variant_cases()



def _symbols(test: str, param, sm: int) -> set[str]:
    """The kernels one test of this module launches."""
    if test in ("test_selected_kernel", "test_bias_and_gelu"):
        return {choose(*make_case(seeded(param), *param), sm).kernel}
    if test == "test_wgmma_prefill":
        return {choose(*make_case(seeded(param), *param), sm).kernel}
    if test in ("test_gemv_tilings", "test_gemm_tilings", "test_gemv2_tilings", "test_rows_tilings",
                "test_wgmma_tilings"):
        return {param[0].symbol}
    if test == "test_out_aliases_residual":
        return {choose(*make_case(seeded(0), param, 64, 2048, "q4", "none", "f16", True, True), sm).kernel}
    if test == "test_pdl_chain":
        return {choose(*make_case(seeded(0), 4, 2048, 1024, "q4", "silu_mul", "f16", True, False), sm).kernel,
                choose(*make_case(seeded(0), 4, 1024, 2048, "q4", "none", "f16", False, True), sm).kernel}
    return set()


@pytest.fixture(scope="module")
def cubins(request, sm) -> dict[str, bytes]:
    """Every symbol the selected tests of this module launch, compiled in parallel chunks."""
    target = get_target(f"sm{sm}")
    symbols: set[str] = set()
    for item in request.session.items:
        if item.module is request.module:
            params = getattr(getattr(item, "callspec", None), "params", {})
            symbols |= _symbols(item.originalname, params.get("case", params.get("m")), sm)
    ordered = sorted(symbols)
    n = max(1, min(16, os.cpu_count() or 8))
    chunks = [ordered[i::n] for i in range(n) if ordered[i::n]]
    if not chunks:
        return {}
    with ThreadPoolExecutor(len(chunks)) as pool:
        built = list(pool.map(lambda c: build_kernels(c, target), chunks))
    return {s: cubin for chunk, cubin in zip(chunks, built) for s in chunk}


def _run(cubins, kernel, grid, block, smem, args) -> np.ndarray:
    return run_kernel(cubins[kernel], kernel, grid, block, smem, "linear", args)["out"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_selected_kernel(case, cubins, sm):
    m, n, k, fmt, act, out, norm, residual, addend = case
    args, attrs = make_case(seeded(case), *case)
    choice = choose(args, attrs, sm)
    want = oracle(args, attrs)
    got = _run(cubins, choice.kernel, choice.grid, choice.block, choice.smem, args)
    check(got, want, TOL[fmt], f"{choice.kernel} on {case}")


@pytest.mark.parametrize("case", BIAS_GELU_CASES, ids=lambda c: "-".join(map(str, c)))
def test_bias_and_gelu(case, cubins, sm):
    args, attrs = make_case(seeded(case), *case)
    choice = choose(args, attrs, sm)
    got = _run(cubins, choice.kernel, choice.grid, choice.block, choice.smem, args)
    check(got, oracle(args, attrs), TOL[case[3]], f"{choice.kernel} on {case}")


@pytest.mark.parametrize("case", GEMV_CASES, ids=lambda c: f"{c[0].symbol}-M{c[1]}")
def test_gemv_tilings(case, cubins, sm):
    v, m, n, k, fmt, act, out = case
    args, attrs = make_case(seeded(v.symbol, m), m, n, k, fmt, act, out, True, True, True, bias=True)
    if v.smem(m, k) > get_target(f"sm{sm}").smem_per_block:
        pytest.skip("does not fit this GPU's shared memory")
    got = _run(cubins, v.symbol, (v.blocks(n), 1, 1), (v.threads, 1, 1), v.smem(m, k), args)
    check(got, oracle(args, attrs), TOL[fmt], v.symbol)


@pytest.mark.parametrize("case", GEMV2_CASES, ids=lambda c: f"{c[0].symbol}-M{c[1]}-N{c[2]}-K{c[3]}-{c[4]}")
def test_gemv2_tilings(case, cubins, sm):
    v, m, n, k, fmt, act, out, norm, residual, addend = case
    args, attrs = make_case(seeded(v.symbol, m, n, k, fmt), m, n, k, fmt, act, out, norm, residual, addend,
                            bias=act != "none")
    if v.smem(m, k) > get_target(f"sm{sm}").smem_per_block:
        pytest.skip("does not fit this GPU's shared memory")
    got = _run(cubins, v.symbol, (v.blocks(n), 1, 1), (v.threads, 1, 1), v.smem(m, k), args)
    check(got, oracle(args, attrs), TOL[fmt],
          f"{v.symbol} M={m} N={n} K={k} {fmt} norm={norm} residual={residual} addend={addend}")


@pytest.mark.parametrize("case", ROWS_CASES, ids=lambda c: f"{c[0].symbol}-N{c[1]}-K{c[2]}-g{c[3]}")
def test_rows_tilings(case, cubins, sm):
    v, n, k, grid, norm, residual, addend = case
    args, attrs = make_case(seeded(v.symbol, n, k, grid), 1, n, k, "f16", "none", v.out, norm, residual, addend)
    got = _run(cubins, v.symbol, (grid, 1, 1), (v.threads, 1, 1), v.smem(k), args)
    check(got, oracle(args, attrs), TOL["f16"],
          f"{v.symbol} N={n} K={k} grid={grid} norm={norm} residual={residual} addend={addend}")


@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: c[0].symbol)
def test_gemm_tilings(case, cubins, sm):
    v, m, n, k, fmt, act, out = case
    args, attrs = make_case(seeded(v.symbol, m), m, n, k, fmt, act, out, True, True, True, bias=True)
    if v.smem() > get_target(f"sm{sm}").smem_per_block:
        pytest.skip("does not fit this GPU's shared memory")
    got = _run(cubins, v.symbol, v.grid(m, n), (v.threads, 1, 1), v.smem(), args)
    check(got, oracle(args, attrs), TOL[fmt], v.symbol)


def _needs_wgmma(sm: int) -> None:
    if not get_target(f"sm{sm}").has(Feature.WGMMA):
        pytest.skip("wgmma needs sm_90a")


@pytest.mark.parametrize("case", WGMMA_CASES, ids=lambda c: f"{c[0].symbol}-{c[1]}x{c[2]}x{c[3]}")
def test_wgmma_tilings(case, cubins, sm):
    _needs_wgmma(sm)
    v, m, n, k, fmt, act, out, norm, residual, addend, bias = case
    args, attrs = make_case(seeded(v.symbol, m), m, n, k, fmt, act, out, norm, residual, addend, bias=bias)
    got = _run(cubins, v.symbol, v.grid(m, n), (v.threads, 1, 1), v.smem(), args)
    check(got, oracle(args, attrs), TOL[fmt], f"{v.symbol} on {case[1:]}")


@pytest.mark.parametrize("case", WGMMA_PREFILL, ids=lambda c: "-".join(map(str, c)))
def test_wgmma_prefill(case, cubins, sm):
    """The rule's kernel for the two models' prefill projections is the wgmma family's, and right."""
    _needs_wgmma(sm)
    args, attrs = make_case(seeded(case), *case)
    choice = choose(args, attrs, sm)
    assert choice.rule == "linear.wgmma", choice
    got = _run(cubins, choice.kernel, choice.grid, choice.block, choice.smem, args)
    check(got, oracle(args, attrs), TOL[case[3]], f"{choice.kernel} on {case}")


@pytest.mark.parametrize("m", [1, 3, 8, 100])
def test_out_aliases_residual(m, cubins, sm):
    """out and residual are one buffer: each element is read, then overwritten."""
    case = (m, 64, 2048, "q4", "none", "f16", True, True)
    args, attrs = make_case(seeded("alias", m), *case)
    choice = choose(args, attrs, sm)
    want = oracle(args, attrs)
    launch = Launch(cubins[choice.kernel], choice.kernel, choice.grid, choice.block, choice.smem, "linear",
                    {**args, "out": Shared("h"), "residual": Shared("h")})
    got = run_chain([launch], {"h": args["residual"]})["h"]
    check(got, want, TOL["q4"], f"{choice.kernel} with out == residual")


def test_pdl_chain(cubins, sm):
    """A decoder-like chain of gemv2 launches joined by programmatic edges (sm_90: the next kernel
    starts early and streams its weights before griddepcontrol.wait): every launch must still see
    the previous one's output. h += down(silu(gate_up(norm(h)))) twice, out aliasing residual."""
    m, hid, inter = 4, 1024, 2048
    rng = seeded("pdl", m)
    steps = []
    for _ in range(2):
        up_case = make_case(rng, m, inter, hid, "q4", "silu_mul", "f16", True, False)
        down_case = make_case(rng, m, hid, inter, "q4", "none", "f16", False, True)
        steps += [up_case, down_case]
    h = rng.standard_normal((m, hid)).astype(F16)
    want = h.copy()
    for (a_up, at_up), (a_dn, at_dn) in zip(steps[0::2], steps[1::2]):
        a_up = {**a_up, "x": want}
        mid = oracle(a_up, at_up).astype(F16)
        a_dn = {**a_dn, "x": mid, "residual": want}
        want = oracle(a_dn, at_dn).astype(F16)
    launches = []
    for i, (args, attrs) in enumerate(steps):
        choice = choose(args, attrs, sm)
        assert choice.rule == "linear.gemv2"
        wires = ({"x": Shared("h"), "out": Shared("mid"), "residual": None} if attrs["act"] == "silu_mul"
                 else {"x": Shared("mid"), "out": Shared("h"), "residual": Shared("h")})
        launches.append(Launch(cubins[choice.kernel], choice.kernel, choice.grid, choice.block, choice.smem, "linear",
                               {**args, **wires}, pdl=i > 0 and sm >= 90))
    got = run_chain(launches, {"h": h, "mid": np.full((m, inter), np.nan, F16)})["h"]
    check(got, want.astype(np.float64), 5e-3, "gemv2 chain with programmatic edges")
