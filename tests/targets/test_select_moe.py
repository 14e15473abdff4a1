"""Kernel choice for the mixture-of-experts ops (``targets/rules_moe.py``) and their compilation for
every arch.

- decode (``T <= 8``): the expert GEMV (gemv2's body) with one grid row per expert that can have
  rows, ``min(E', R)``: only those blocks read weights; prefill: the grouped GEMM with enough tiles
  for every expert's rows, ``ceil(R / BM) + min(E', R)``; odd K: the fp32 fallback;
- shapes a rule cannot take are refused (too many experts for the router, odd hidden for the gather);
- every arch compiles the kernels its rules pick for a Qwen-MoE-like layer (route, gather, combine,
  the GEMV, the grouped GEMM, the fallback), and a symbol names its family.
"""

from __future__ import annotations

import pytest

from grokc.artifacts import kernels_file
from grokc.core.errors import TargetError, UnsupportedOp
from grokc.targets import TARGETS, KernelCall, build_kernels, get_target, nvcc, rules_moe, select


def _linear(t: int, s: int = 8, n: int = 1408, k: int = 2048, fmt: str = "q4", act: str = "silu_mul",
            out: str = "f16", gs: int = 0, experts: int = 64) -> KernelCall:
    return KernelCall("moe_linear", {"weight_format": fmt, "act": act, "out_dtype": out},
                      {"T": t, "R": t * s, "N": n, "K": k, "group_size": gs, "n_experts": experts})


CALLS = [
    KernelCall("moe_route", {}, {"T": 64, "n_experts": 60, "top_k": 4, "n_shared": 4, "norm_top_k": 0,
                                 "shared_gate": 1}),
    KernelCall("moe_gather", {}, {"T": 64, "R": 512, "hidden": 2048, "n_experts": 64, "eps": 1e-6}),
    KernelCall("moe_combine", {}, {"T": 64, "hidden": 2048, "S": 8}),
    _linear(1),                                              # decode: gate_up
    _linear(8, n=2048, k=1408, act="none", out="f32"),       # decode at batch 8: down
    _linear(64, gs=128),                                     # prefill, groups of 128
    _linear(4, k=40, act="none"),                            # odd K: the fallback
]


@pytest.mark.parametrize("arch", list(TARGETS))
def test_rules_pick_each_family(arch):
    target = get_target(arch)
    route, gather, combine, gemv, gemv8, gemm, ref = (select(c, target) for c in CALLS)
    assert (route.rule, route.grid) == ("moe.route", (1, 1, 1))
    assert (gather.rule, gather.grid[0]) == ("moe.gather", 512 // rules_moe.GATHER_WARPS)
    assert (combine.rule, combine.grid[0]) == ("moe.combine", 64)
    assert gemv.rule == gemv8.rule == "moe.gemv2"
    assert gemv.grid[1] == 8 and gemv8.grid[1] == 64          # min(E', R): experts that can have rows
    assert gemm.rule == "moe.gemm" and gemm.kernel.startswith("moe_linear_gemm_q4g_silu")
    bm = int(gemm.kernel.split("_m")[1].split("n")[0])
    assert gemm.grid[1] == -(-512 // bm) + 64
    assert ref.rule == "moe.ref" and ref.grid == (-(-1408 // 128), 32, 1)


def test_unsupported_shapes_are_refused():
    target = get_target("sm90")
    too_many = KernelCall("moe_route", {}, {"T": 8, "n_experts": 300, "top_k": 8, "n_shared": 0, "norm_top_k": 1,
                                            "shared_gate": 0})
    with pytest.raises(UnsupportedOp, match="moe_route"):
        select(too_many, target)
    with pytest.raises(UnsupportedOp, match="moe_gather"):
        select(KernelCall("moe_gather", {}, {"T": 8, "R": 16, "hidden": 60, "n_experts": 8, "eps": 0.0}), target)


def test_symbols_name_their_family():
    assert rules_moe.kernel_source("moe_linear_gemv2_q4_silu_f16_r2k8w1d2p1n0b0") is not None
    assert rules_moe.kernel_source("moe_linear_rows_f16_none_f16_w8u8b4") is None   # no moe form of linear_rows
    with pytest.raises(TargetError, match="unknown kernel symbol"):
        nvcc.translation_unit(["moe_linear_gemv_q4_none_f16_m8k8r1u2b0"])


@pytest.mark.parametrize("arch", list(TARGETS))
@pytest.mark.usefixtures("nvcc")
def test_every_arch_compiles_its_moe_kernels(arch):
    target = get_target(arch)
    symbols = sorted({select(c, target).kernel for c in CALLS})
    got = kernels_file.read(build_kernels(symbols, target))
    assert got.sass_archs == (target.sm,) and got.symbols == set(symbols)
