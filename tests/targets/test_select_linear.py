"""Kernel selection for ``linear``: rule order, symbols, launch shapes, and that what is chosen compiles."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import pytest

from grokc.core.errors import UnsupportedOp
from grokc.targets import (
    TARGETS,
    KernelCall,
    build_kernels,
    get_target,
    rules_linear,
    select,
)
from grokc.targets.base import Feature

# (K, N, act, weight_format, out_dtype) of Llama-3.2-1B and SmolLM2-135M.
LLAMA_1B = [(2048, 3072, "none", "q4", "f16"), (2048, 2048, "none", "q4", "f16"),
            (2048, 8192, "silu_mul", "q4", "f16"), (8192, 2048, "none", "q4", "f16"),
            (2048, 128256, "none", "f16", "f32")]
SMOLLM2 = [(576, 960, "none", "q4", "f16"), (576, 576, "none", "q4", "f16"),
           (576, 1536, "silu_mul", "q4", "f16"), (1536, 576, "none", "q4", "f16"),
           (576, 49152, "none", "f16", "f32")]


def call(m: int, n: int, k: int, act: str = "none", wf: str = "q4", out: str = "f16", gs: int = 0) -> KernelCall:
    return KernelCall("linear", {"weight_format": wf, "act": act, "out_dtype": out},
                      {"M": m, "N": n, "K": k, "group_size": gs, "eps": 1e-5})


# Dynamic shared memory of each family, written here from the pointer layout at the top of each
# kernel (targets/kernels/linear_*.cuh), not from rules_linear's own formulas: bytes of f16 = 2,
# of f32 = 4; a variant's tile parameters come from its symbol.
def smem_gemv2(v, m: int, k: int, threads: int) -> int:
    kp = -(-k // 128) * 128                                   # KP: K rounded up to 128 halves
    xs, ns = m * kp * 2, kp * 2                               # xs [M][KP], ns [KP]
    wsum = (threads // 32) * 8 * 4                            # [NWARP][MAXM = 8] f32
    red = v.ks * m * (16 * v.r * v.wn) * 4 if v.ks > 1 else 0  # [KS][M][BR], BR = 16 R WN
    return xs + ns + wsum + red


def smem_gemv(v, m: int, k: int) -> int:
    step_k = 4 * (8 if v.wf == "f16" else 32)                 # 4 lanes x one 16-byte chunk (8 halves / 32 codes)
    round_k = step_k * v.ks * v.u
    nrounds = -(-(-(-k // step_k)) // (v.ks * v.u))
    slab_k = min(max(1, 64 * 1024 // (m * round_k * 2)), nrounds) * round_k   # X_BUDGET = 64 KiB
    return m * slab_k * 2 + slab_k * 2 + v.ks * m * (8 * v.rg) * 4 + m * 4


def smem_gemm(v) -> int:
    bk = 64                                                   # gemm::BK, halves of k per stage
    b_tile = v.bn * bk * 2 if v.wf == "f16" else v.bn * bk // 2
    return v.stages * (v.bm * bk * 2 + b_tile + bk * 2) + v.bm * 4


def smem_wgmma(v) -> int:
    x_tile = v.bm * 64 * 2                                    # BK = 64 halves: one 128-byte row per x row
    w_tile = v.bn * 64 * 2 if v.wf == "f16" else v.bn * 64 // 2
    conv = 3 * v.bn * 64 * 2 if v.wf == "q4" else 0           # three f16 weight tiles (int4 converted)
    bars = 2 * 8                                              # mbarriers full, empty per stage
    return 1024 + v.stages * (x_tile + w_tile + 64 * 2 + bars) + conv + v.bm * 4  # 1024: alignment; rstd [BM]


def smem_rows(v, k: int) -> int:
    return (k // 8) * 16 + v.w * 4                            # xs: K/8 chunks of 16 bytes, wsum [W]


def check_launch(c, m: int, n: int, k: int, act: str, target) -> None:
    """Grid covers the output, block and shared memory are within the target's limits."""
    v = rules_linear.parse(c.kernel)
    assert v is not None
    threads = c.block[0] * c.block[1] * c.block[2]
    assert c.block == (threads, 1, 1) and 32 <= threads <= 1024
    assert 0 <= c.smem <= target.smem_per_block
    if isinstance(v, rules_linear.Rows):
        assert c.grid[1:] == (1, 1) and c.grid[0] == min(-(-n // v.w), target.num_sms * v.minb)
        assert c.smem == smem_rows(v, k) and threads == v.threads and m == 1
        assert c.pdl == target.has(Feature.PDL)
    elif isinstance(v, rules_linear.Gemv2):
        assert c.grid[1:] == (1, 1) and v.blocks(n) == c.grid[0]
        assert (c.grid[0] - 1) * v.cols < n <= c.grid[0] * v.cols
        assert c.smem == smem_gemv2(v, m, k, threads) and threads == v.threads
        assert m <= rules_linear.GEMV2_MAX_M
        assert c.pdl == target.has(Feature.PDL)  # griddepcontrol after the first weight loads
    elif isinstance(v, rules_linear.Gemv):
        assert c.grid[1:] == (1, 1) and v.blocks(n) == c.grid[0]
        cols = 8 * v.rg // (2 if act == "silu_mul" else 1)
        assert (c.grid[0] - 1) * cols < n <= c.grid[0] * cols
        assert c.smem == smem_gemv(v, m, k) and threads == v.threads
        assert m <= v.mt
    elif isinstance(v, rules_linear.Wgmma):
        cols = v.bn // (2 if act == "silu_mul" else 1)
        assert c.grid[0] * cols >= n > (c.grid[0] - 1) * cols and c.grid[1] * v.bm >= m > (c.grid[1] - 1) * v.bm
        assert c.grid[2] == 1 and c.smem == smem_wgmma(v) and threads == v.threads == 2 * v.bm + 128
        assert target.has(Feature.WGMMA) and m >= rules_linear.WGMMA_MIN_M
    elif isinstance(v, rules_linear.Gemm):
        cols = v.bn // (2 if act == "silu_mul" else 1)
        assert c.grid[0] * cols >= n and c.grid[1] * v.bm >= m and c.grid[2] == 1
        assert c.smem == smem_gemm(v) and threads == v.threads
    else:
        assert c.grid == (-(-n // 128), m, 1) and c.smem == 0


@pytest.mark.parametrize("arch", list(TARGETS))
@pytest.mark.parametrize("m", [1, 3, 8, 16, 17, 100, 512, 4096])
def test_model_shapes(arch: str, m: int):
    target = get_target(arch)
    for k, n, act, wf, out in LLAMA_1B + SMOLLM2:
        c = select(call(m, n, k, act, wf, out), target)
        want = "linear.gemv2" if m <= 8 else "linear.gemv" if m <= 16 else "linear.gemm"
        if want == "linear.gemm" and target.has(Feature.WGMMA) and m >= rules_linear.WGMMA_MIN_M:
            want = "linear.wgmma"  # sm_90a prefill
        if m == 1 and wf == "f16" and n >= rules_linear.ROWS_MIN_N:
            want = "linear.rows"  # the batch-1 LM heads
        if want == "linear.gemv2" and (m + 1) * k * 2 > target.smem_per_block:
            want = "linear.gemv"  # x does not fit a block's shared memory (K = 8192 at M = 8 on 99 KB parts)
        assert c.rule == want, (m, n, k, c)
        assert c.kernel.startswith(f"linear_{want.split('.')[1]}_")
        check_launch(c, m, n, k, act, target)


def test_rule_order():
    t = get_target("sm90")
    assert select(call(1, 3072, 2048), t).rule == "linear.gemv2"
    assert select(call(8, 3072, 2048), t).rule == "linear.gemv2"
    assert rules_linear.parse(select(call(9, 3072, 2048), t).kernel).mt == 16
    assert select(call(16, 3072, 2048), t).rule == "linear.gemv"
    assert select(call(17, 3072, 2048), t).rule == "linear.gemm"
    # int4 needs K % 32 and group sizes of 32s for the fast kernels; anything else falls back
    assert select(call(1, 64, 40), t).rule == "linear.ref"
    assert select(call(64, 64, 40), t).rule == "linear.ref"
    assert select(call(1, 64, 64, gs=16), t).rule == "linear.ref"
    assert select(call(1, 64, 40, wf="f16"), t).rule == "linear.gemv2"  # f16 only needs K % 8
    assert select(call(12, 64, 40, wf="f16"), t).rule == "linear.gemv"
    assert select(call(1, 64, 576, gs=64), t).kernel.startswith("linear_gemv2_q4g_")
    assert select(call(1, 64, 576, gs=576), t).kernel.startswith("linear_gemv2_q4_")  # one group = per channel
    assert select(call(12, 64, 576, gs=64), t).kernel.startswith("linear_gemv_q4g_")
    # gemv2 keeps x of the whole block in shared memory: past the budget the gemv family takes over
    assert select(call(8, 2048, 8192), get_target("sm86")).rule == "linear.gemv"
    assert select(call(8, 2048, 8192), t).rule == "linear.gemv2"
    assert select(call(1, 3072, 2048), t).pdl and not select(call(1, 3072, 2048), get_target("sm89")).pdl
    assert not select(call(12, 3072, 2048), t).pdl  # the gemv family has no griddepcontrol
    assert select(call(100, 64, 576, gs=128), t).kernel.startswith("linear_gemm_q4g_")
    # sm_90a prefill: wgmma from WGMMA_MIN_M rows, for f16 and per-channel int4 with f16 inputs
    assert select(call(511, 3072, 2048), t).rule == "linear.gemm"
    assert select(call(512, 3072, 2048), t).rule == "linear.wgmma"
    assert select(call(512, 3072, 2048, wf="f16"), t).rule == "linear.wgmma"
    assert select(call(512, 64, 576, gs=576), t).rule == "linear.wgmma"  # one group = per channel


def test_wgmma_takes_sm90_prefill_only():
    """What the wgmma rule covers on sm90, what stays with gemm (and ref), and that no other arch has it."""
    t = get_target("sm90")
    assert t.has(Feature.WGMMA) and t.nvcc_arch == "sm_90a"
    assert all(not x.has(Feature.WGMMA) and not x.nvcc_arch.endswith("a") for x in TARGETS.values() if x.name != "sm90")
    for act in ("none", "silu_mul", "gelu_tanh_mul"):
        for wf, out in (("q4", "f16"), ("f16", "f32"), ("q4", "f32")):
            assert select(call(512, 2048, 2048, act, wf, out), t).rule == "linear.wgmma", (act, wf, out)
    assert select(call(512, 2048, 2048, gs=128), t).rule == "linear.gemm"          # grouped int4
    assert select(call(512, 2048, 2048, wf="q8"), t).rule == "linear.ref"          # int8
    assert select(call(512, 2048, 2000), t).rule == "linear.ref"                    # K % 32 != 0 (int4)
    assert select(call(512, 2048, 2000, wf="f16"), t).rule == "linear.wgmma"        # f16: K % 8 == 0
    x32 = KernelCall("linear", {"weight_format": "q4", "act": "none", "out_dtype": "f16", "x_dtype": "f32"},
                     {"M": 512, "N": 2048, "K": 2048, "group_size": 0, "eps": 1e-5})
    assert select(x32, t).rule != "linear.wgmma"                                    # f32 inputs
    for arch in ("sm80", "sm89", "sm100", "sm120"):
        assert select(call(512, 2048, 2048), get_target(arch)).rule == "linear.gemm"


def test_wgmma_tiles():
    """The largest tile that fills the SMs (else the smallest), as many stages (<= 6) as fit 227 KB;
    a 64-row tile 4 stages, so that two of its blocks fit the H200 SM's 228 KB (1 KB reserved each)."""
    t = get_target("sm90")
    want = {  # (M, N, K, act) -> (BM, BN)
        (4096, 14336, 4096, "silu_mul"): (128, 256), (4096, 4096, 14336, "none"): (128, 256),
        (512, 6144, 4096, "none"): (128, 128), (512, 2048, 8192, "none"): (64, 128), (512, 64, 576, "none"): (64, 128)}
    for (m, n, k, act), (bm, bn) in want.items():
        for wf in ("q4", "f16"):
            c = select(call(m, n, k, act, wf), t)
            v = rules_linear.parse(c.kernel)
            assert (v.bm, v.bn) == (bm, bn), (m, n, k, act, wf, c.kernel)
            assert c.smem == smem_wgmma(v) <= t.smem_per_block
            if bm == 64:
                assert v.stages == 4 and 2 * (smem_wgmma(v) + 1024) <= 228 * 1024
                assert smem_wgmma(rules_linear.Wgmma(v.wf, v.act, v.out, 64, bn, 6)) + 1024 > 114 * 1024  # 6: one block
            else:
                bigger = rules_linear.Wgmma(v.wf, v.act, v.out, v.bm, v.bn, v.stages + 1)
                assert v.stages == 6 or smem_wgmma(bigger) > t.smem_per_block
            check_launch(c, m, n, k, act, t)
    for bm, bn in rules_linear._WGMMA_TILES:  # every tile fits with at least 3 stages
        for wf in ("q4", "f16"):
            assert smem_wgmma(rules_linear.Wgmma(wf, "silu", "f32", bm, bn, 3)) <= t.smem_per_block


def test_rows_takes_only_batch1_f16_heads():
    t = get_target("sm90")
    head = select(call(1, 128256, 2048, wf="f16", out="f32"), t)
    assert head.kernel == "linear_rows_f16_none_f32_w8u8b4" and head.rule == "linear.rows"
    assert head.grid == (t.num_sms * 4, 1, 1) and head.block == (256, 1, 1) and head.smem == 2 * 2048 + 32
    assert select(call(1, 49152, 576, wf="f16", out="f32"), t).kernel == "linear_rows_f16_none_f32_w8u3b4"
    assert select(call(1, 40000, 8, wf="f16", out="f16"), t).kernel == "linear_rows_f16_none_f16_w8u1b4"
    assert select(call(2, 128256, 2048, wf="f16"), t).rule == "linear.gemv2"       # M > 1
    assert select(call(1, 128256, 2048, wf="q8"), t).rule == "linear.gemv2"        # quantised
    assert select(call(1, 32768, 2048, "silu_mul", wf="f16"), t).rule == "linear.gemv2"
    assert select(call(1, rules_linear.ROWS_MIN_N - 1, 2048, wf="f16"), t).rule == "linear.gemv2"
    assert not select(call(1, 128256, 2048, wf="f16"), get_target("sm80")).pdl


def test_symbols_encode_the_variant():
    t = get_target("sm90")
    c = select(call(1, 8192, 2048, "silu_mul", "q4", "f32"), t)
    assert c.kernel.startswith("linear_gemv2_q4_silu_f32_")
    c = select(call(12, 8192, 2048, "silu_mul", "q4", "f32"), t)
    assert c.kernel.startswith("linear_gemv_q4_silu_f32_")
    c = select(call(512, 2048, 2048, "none", "f16", "f16"), t)
    assert c.kernel.startswith("linear_wgmma_f16_none_f16_")
    c = select(call(512, 2048, 2048, "none", "f16", "f16"), get_target("sm80"))
    assert c.kernel.startswith("linear_gemm_f16_none_f16_")


def test_parse_round_trip_and_rejects():
    for sym in ["linear_gemv_q4_none_f16_m8k8r1u2b0", "linear_gemm_q4g_silu_f32_m64n128w2x4s3b2",
                "linear_ref_f16_silu_f16", "linear_gemv2_q4g_silu_f32_r2k4w2d3p2n1b0",
                "linear_rows_f16_none_f32_w8u8b4", "linear_rows_f16_none_f16_w4u2b2t1",
                "linear_wgmma_q4_silu_f16_m128n256s6", "linear_wgmma_f16_gelu_f32_m64n128s3"]:
        v = rules_linear.parse(sym)
        assert v is not None and v.symbol == sym
        assert rules_linear.kernel_source(sym).startswith('extern "C" __global__')
    for bad in ["linear_gemv_q4_none_f16_m12k8r1u2b0",   # MT is 8 or 16
                "linear_gemv_q4_none_f16_m8k3r1u2b0",    # KS a power of two
                "linear_gemm_q4_silu_f16_m64n64w2x4s3b0",  # silu needs an even n-tile count per warp
                "linear_ref_q4g_none_f16", "linear_gemv_q4_none_f16_m08k8r1u2b0", "attn_decode_ref",
                "linear_gemv2_q4_none_f16_r1k3w1d2p1n0b0",   # KS a power of two
                "linear_gemv2_q4_none_f16_r1k16w2d2p1n0b0",  # 1024 threads
                "linear_gemv2_q4_none_f16_r1k1w1d0p1n0b0",   # a ring of no steps
                "linear_gemv2_q4_none_f16_r4k1w1d3p1n0b0",   # 96 ring registers
                "linear_gemv2_q4_none_f16_r1k1w1d2p3n0b0",   # no 512-byte prefetch
                "linear_gemv2_q4_none_f16_r1k1w1d2p1n2b0",
                "linear_gemv2_q4_none_f16_r1k2w1d4b0",       # the knobs are not optional
                "linear_rows_q4_none_f16_w8u8b4",            # f16 weights only
                "linear_rows_f16_silu_f16_w8u8b4",           # no activation
                "linear_rows_f16_none_f32_w8u8b0",           # a grid of no blocks per SM
                "linear_rows_f16_none_f32_w64u8b1",          # 2048 threads
                "linear_wgmma_q4g_none_f16_m128n128s4",      # per-channel int4 and f16 only
                "linear_wgmma_q4_none_f16_m256n128s4",       # one or two warpgroups
                "linear_wgmma_q4_none_f16_m128n64s4",        # 128 or 256 weight rows
                "linear_wgmma_q4_none_f16_m128n128s2"]:      # at least 3 stages
        assert rules_linear.parse(bad) is None, bad
        assert rules_linear.kernel_source(bad) is None


def test_gemv2_smem_and_tiling():
    v = rules_linear.Gemv2("q4", "silu", "f16", 2, 4, 2, 3, 1, 0, 0)
    assert v.threads == 256 and v.cols == 32 and v.blocks(8192) == 256
    # (M + 1) rows of roundup(K, 128) halves, per-warp sums of squares, split-K partials
    assert v.smem(8, 2048) == 9 * 2048 * 2 + 8 * 8 * 4 + 4 * 8 * 64 * 4
    assert rules_linear.Gemv2("f16", "none", "f32", 2, 1, 4, 3, 2, 1, 0).smem(1, 40) == 2 * 128 * 2 + 4 * 8 * 4
    # every Llama-3.2-1B decode shape fills the H200's 132 SMs at least once
    t = get_target("sm90")
    # measured choices: LM head whole rows with the 256-byte prefetch; past M = 4 gate_up doubles
    # the warps along N and the others take the norm in registers; qkv (int4, R = 2) takes it in
    # registers at every M, at most 128 registers below M = 5
    assert select(call(2, 128256, 2048, wf="f16", out="f32"), t).kernel == "linear_gemv2_f16_none_f32_r2k1w4d3p2n0b0"
    assert select(call(8, 128256, 2048, wf="f16", out="f32"), t).kernel == "linear_gemv2_f16_none_f32_r2k1w8d3p2n1b0"
    assert select(call(1, 8192, 2048, "silu_mul"), t).kernel == "linear_gemv2_q4_silu_f16_r2k4w1d2p1n0b0"
    assert select(call(8, 8192, 2048, "silu_mul"), t).kernel == "linear_gemv2_q4_silu_f16_r2k4w2d2p1n0b0"
    assert select(call(1, 3072, 2048), t).kernel == "linear_gemv2_q4_none_f16_r2k8w1d2p1n1b2t1"
    assert select(call(4, 3072, 2048), t).kernel == "linear_gemv2_q4_none_f16_r2k8w1d2p1n1b2t1"
    assert select(call(8, 3072, 2048), t).kernel == "linear_gemv2_q4_none_f16_r2k8w1d2p1n1b0t1"
    assert select(call(1, 2048, 8192), t).kernel == "linear_gemv2_q4_none_f16_r1k16w1d2p1n0b0"
    for k, n, act, wf, out in LLAMA_1B:
        c = select(call(1, n, k, act, wf, out), t)
        assert c.grid[0] * c.block[0] // 32 >= t.num_sms, c


# The int8 LM heads (--lm-head int8) of the two models: N = vocab, K = hidden, f32 logits.
Q8_HEADS = [(2048, 128256, "none", "q8", "f32"), (576, 49152, "none", "q8", "f32")]


@pytest.mark.parametrize("arch", list(TARGETS))
def test_q8_takes_gemv2_up_to_m8_and_the_fallback_past_it(arch: str):
    """Only gemv2 and ref read int8: a q8 call never lands on the gemv or gemm family."""
    t = get_target(arch)
    for (k, n, act, wf, out), m in itertools.product(Q8_HEADS, (1, 2, 4, 5, 8, 9, 16, 512)):
        c = select(call(m, n, k, act, wf, out), t)
        want = "linear.gemv2" if m <= 8 and (m + 1) * k * 2 <= t.smem_per_block else "linear.ref"
        assert c.rule == want and c.kernel.startswith(f"linear_{want.split('.')[1]}_q8_none_f32"), (m, c)
        check_launch(c, m, n, k, act, t)
    assert select(call(1, 64, 64, wf="q8", gs=32), t).rule == "linear.ref"      # groups: the fallback
    assert select(call(1, 64, 64, wf="q8", gs=64), t).rule == "linear.gemv2"    # one group is per channel
    assert select(call(1, 64, 40, wf="q8"), t).rule == "linear.ref"             # K % 16: whole 16-byte chunks
    assert select(call(1, 64, 48, wf="q8", act="silu_mul"), t).kernel.startswith("linear_gemv2_q8_silu_")


def test_q8_gemv2_tiling_steps_64_k():
    v = rules_linear.parse("linear_gemv2_q8_none_f32_r2k1w4d3p2n0b0")
    assert v.step_k == 64 and v.smem(1, 2048) == 2 * 2048 * 2 + 4 * 8 * 4
    t = get_target("sm90")
    # whole rows like the f16 head (the K split stops at 16 resident warps per SM)
    assert select(call(1, 128256, 2048, wf="q8", out="f32"), t).kernel == "linear_gemv2_q8_none_f32_r2k1w4d3p2n0b0"
    # a short matrix splits K over 64-k steps: 2048 / 64 = 32 steps, at most 2 per warp -> KS = 16
    assert rules_linear.parse(select(call(1, 64, 2048, wf="q8"), t).kernel).ks == 16
    for bad in ["linear_gemv_q8_none_f16_m8k8r1u2b0", "linear_gemm_q8_none_f16_m64n64w2x2s3b0",
                "linear_gemv2_q8g_none_f16_r1k1w4d1p2n0b0", "linear_ref_q8g_none_f16"]:
        assert rules_linear.parse(bad) is None and rules_linear.kernel_source(bad) is None, bad


def test_gemv_smem_slabs_stay_in_budget():
    # M = 16 with K = 8192 does not fit one slab: x is staged in slabs of whole rounds
    v = rules_linear.Gemv("q4", "none", "f16", 16, 8, 1, 4, 0)
    assert v.smem(16, 8192) <= rules_linear.GEMV_X_BUDGET + 17 * v.round_k() * 2
    assert v.smem(1, 8192) == 2 * 8192 * 2 + 8 * 1 * 8 * 4 + 4


def test_invalid_calls():
    t = get_target("sm90")
    with pytest.raises(UnsupportedOp, match="no kernel rules for op 'conv2d'"):
        select(KernelCall("conv2d", {}, {}), t)
    with pytest.raises(UnsupportedOp, match="no kernel for op 'linear'"):
        select(call(1, 64, 64, act="gelu"), t)
    with pytest.raises(UnsupportedOp):
        select(call(1, 64, 60), t)  # K % 8 != 0: not even the int4 layout allows it


@pytest.mark.usefixtures("nvcc")
def test_every_choice_compiles():
    """Every symbol the rules pick for the two models' shapes (decode and prefill) compiles for sm90."""
    t = get_target("sm90")
    symbols = set()
    for (k, n, act, wf, out), m in itertools.product(LLAMA_1B + SMOLLM2 + Q8_HEADS, (1, 4, 8, 16, 128, 512)):
        symbols.add(select(call(m, n, k, act, wf, out), t).kernel)
    halves = [sorted(symbols)[i::2] for i in range(2)]   # two nvcc runs at once: the compile is most of the test
    with ThreadPoolExecutor(2) as pool:
        cubins = list(pool.map(lambda half: build_kernels(half, t), halves))
    for half, cubin in zip(halves, cubins):
        for sym in half:
            assert sym.encode() + b"\0" in cubin



@pytest.mark.parametrize("arch", ["sm90", "sm80"])
@pytest.mark.parametrize("m", [1, 4, 8])
def test_next_launch_waits_when_the_ring_holds_every_step(arch: str, m: int):
    """TR 1 (the next kernel may launch only after this one's griddepcontrol.wait) exactly when each
    warp loads all its weights before that wait, and only where programmatic launch exists (sm_90)."""
    t = get_target(arch)
    for k, n, act, wf, out in LLAMA_1B + SMOLLM2:
        v = rules_linear.parse(select(call(m, n, k, act, wf, out), t).kernel)
        if isinstance(v, rules_linear.Rows):  # a batch-1 head streams after the wait: trigger at entry
            assert v.tr == 0
            continue
        steps = -(-k // rules_linear.gemv2_step_k(v.wf))
        assert v.tr == int(t.has(Feature.PDL) and -(-steps // v.ks) <= v.d), (arch, m, k, n, act, v.symbol)
    if t.has(Feature.PDL):  # the 1B shape: qkv and o wait, gate_up, down and the LM head still stream after it
        assert [rules_linear.parse(select(call(m, n, k, act, wf, out), t).kernel).tr
                for k, n, act, wf, out in LLAMA_1B] == [1, 1, 0, 0, 0]
