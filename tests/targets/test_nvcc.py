"""The nvcc step: every linear kernel family compiles for every arch, the cubin names its arch, the
bytes are deterministic, and a missing nvcc or a compile error is a one-line TargetError.

Runs on a machine with no GPU; skipped where nvcc is missing (except the missing-nvcc test).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grokc.artifacts import kernels_file
from grokc.core.errors import TargetError
from grokc.targets import TARGETS, build_kernels, get_target, nvcc, rules_linear

needs_nvcc = pytest.mark.usefixtures("nvcc")   # tests/targets/conftest.py: skipped without nvcc

# Every family, weight format, activation and output type at least once (sm90, the main target).
REPRESENTATIVE = [
    "linear_gemv2_q4_silu_f16_r2k4w1d2p1n0b0",
    "linear_gemv2_q4g_none_f32_r2k4w2d3p2n1b0",
    "linear_gemv2_f16_none_f32_r2k1w4d3p0n1b0",
    "linear_gemv_q4_none_f16_m8k8r1u2b0",
    "linear_gemv_q4_silu_f16_m16k4r2u4b0",
    "linear_gemv_q4g_none_f32_m8k8r1u4b0",
    "linear_gemv_f16_none_f32_m8k8r1u4b0",
    "linear_gemm_q4_silu_f16_m128n128w2x4s3b0",
    "linear_gemm_q4g_none_f16_m64n128w2x4s3b0",
    "linear_gemm_f16_none_f32_m64n64w2x2s3b0",
    "linear_wgmma_q4_silu_f16_m128n256s6",       # sm_90a only
    "linear_ref_q4_silu_f16",
    "linear_ref_f16_none_f32",
    "linear_gemv2_q8_none_f32_r2k1w8d3p2n1b0",   # the int8 LM head at M > 4
    "linear_gemv2_q8_silu_f16_r2k4w1d2p1n0b0",
    "linear_ref_q8_silu_f16",
]
# A smaller set for the other archs: one kernel of each family.
PER_ARCH = ["linear_gemv2_q4_silu_f16_r2k4w1d2p1n1b0", "linear_gemv_q4_silu_f16_m8k8r1u2b0",
            "linear_gemm_q4_none_f16_m64n64w2x2s3b0", "linear_ref_q4_none_f16",
            "linear_gemv2_q8_none_f32_r2k1w4d3p2n0b0", "linear_ref_q8_none_f32"]   # the int8 LM head


def test_representative_symbols_are_linear_kernels():
    for sym in REPRESENTATIVE + PER_ARCH:
        assert rules_linear.parse(sym) is not None, sym
        assert f" {sym}(" in rules_linear.kernel_source(sym)


@needs_nvcc
def test_sm90_compiles_every_linear_family():
    got = kernels_file.read(build_kernels(REPRESENTATIVE, get_target("sm90")))
    assert got.sass_archs == (90,) and got.ptx_archs == ()
    assert got.symbols == set(REPRESENTATIVE)


@needs_nvcc
@pytest.mark.parametrize("arch", [a for a in TARGETS if a != "sm90"])
def test_every_arch_compiles(arch: str):
    target = get_target(arch)
    data = build_kernels(PER_ARCH, target)
    got = kernels_file.read(data)
    assert got.sass_archs == (target.sm,) and got.symbols == set(PER_ARCH)
    # the newest archs carry PTX of their own compute capability, which later GPUs JIT-compile
    assert got.ptx_archs == ((target.sm,) if arch in ("sm100", "sm120") else ())
    if got.ptx_archs:
        assert f".target sm_{target.sm}".encode() in data


@needs_nvcc
def test_same_kernels_same_bytes(monkeypatch):
    monkeypatch.setenv("GROKC_KERNEL_CACHE", "off")   # two real nvcc runs
    target = get_target("sm90")
    a = build_kernels(["linear_ref_q4_none_f16", "linear_ref_f16_none_f32"], target)
    b = build_kernels(["linear_ref_f16_none_f32", "linear_ref_q4_none_f16", "linear_ref_f16_none_f32"], target)
    assert a == b


def test_translation_unit_is_sorted_and_deduplicated():
    src = nvcc.translation_unit(["linear_ref_q4_none_f16", "linear_ref_f16_none_f32", "linear_ref_q4_none_f16"])
    assert src.count("linear_ref_q4_none_f16(") == 1
    assert src.index("linear_ref_f16_none_f32(") < src.index("linear_ref_q4_none_f16(")
    assert '#include "linear_gemv.cuh"' in src
    assert "attention" not in src  # only the owners' headers


def test_unknown_symbol_is_a_target_error():
    with pytest.raises(TargetError, match="unknown kernel symbol 'linear_gemv_bogus'"):
        nvcc.translation_unit(["linear_gemv_bogus"])


def test_missing_nvcc_is_a_target_error(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("GROKC_NVCC", str(tmp_path / "no-nvcc"))
    with pytest.raises(TargetError, match="GROKC_NVCC=.* is not a file"):
        build_kernels(PER_ARCH, get_target("sm90"))
    monkeypatch.delenv("GROKC_NVCC")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(nvcc, "DEFAULT_NVCC", str(tmp_path / "cuda" / "bin" / "nvcc"))
    with pytest.raises(TargetError, match="nvcc not found") as err:
        build_kernels(PER_ARCH, get_target("sm90"))
    assert "\n" not in str(err.value)


@needs_nvcc
def test_compile_error_names_arch_and_first_error(monkeypatch):
    real = rules_linear.kernel_source

    def broken(symbol: str) -> str | None:
        src = real(symbol)
        return None if src is None else src.replace("GROKC_LINEAR_ARGS); }", "GROKC_LINEAR_ARGS); undefined_thing; }")

    monkeypatch.setattr(rules_linear, "kernel_source", broken)
    monkeypatch.delenv("GROKC_DEBUG", raising=False)
    with pytest.raises(TargetError, match=r"nvcc failed for sm_80 .*undefined_thing") as err:
        build_kernels(["linear_ref_q4_none_f16"], get_target("sm80"))
    assert "\n" not in str(err.value)


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm80", "sm90"])
def test_sparse_residual_kernels_compile(arch: str):
    symbols = ["sparse_residual_m1", "sparse_residual_m2", "sparse_residual_m4", "sparse_residual_m8",
               "sparse_residual_g"]
    target = get_target(arch)
    got = kernels_file.read(build_kernels(symbols, target))
    assert got.sass_archs == (target.sm,) and got.symbols == set(symbols)


TRACED = ["linear_ref_q4_none_f16", "attn_decode_ref", "sample_rows_c8"]


def test_traced_translation_unit_opens_a_scope_per_entry_point():
    """trace=True numbers every entry point by its place in the sorted symbols (bench/trace_plan.py
    maps the records back by that number); the plain unit has no trace code at all."""
    src = nvcc.translation_unit(TRACED, trace=True)
    assert src.count("grokc_trace::Scope") == len(TRACED) and "#define GROKC_TRACE" in src
    for i, sym in enumerate(sorted(TRACED)):
        entry = src.index(f" {sym}(")
        assert src.index(f"grokc_trace::Scope grokc_trace_scope({i});", entry) < src.index("}", entry)
    plain = nvcc.translation_unit(TRACED)
    assert "grokc_trace" not in plain and "GROKC_TRACE" not in plain


@needs_nvcc
def test_traced_cubin_holds_the_records_and_the_plain_one_does_not():
    target = get_target("sm90")
    traced, plain = build_kernels(TRACED, target, trace=True), build_kernels(TRACED, target)
    assert b"_ZN11grokc_trace7recordsE" in traced and b"_ZN11grokc_trace5countE" in traced
    assert b"grokc_trace" not in plain
    for sym in TRACED:
        assert sym.encode() + b"\0" in traced


# The kernels the model families added (GeGLU epilogues, the norms, windowed and head_dim 256
# attention, the scaled embedding), on every arch: they must compile wherever a plan may run them.
FAMILY_KERNELS = ["linear_gemv2_q4_gelu_f16_r2k4w1d2p1n0b0", "linear_gemv_q4_gelu_f16_m16k4r2u4b0",
                  "linear_gemm_f16_gelu_f16_m64n64w2x2s3b0", "linear_ref_q8_gelu_f32", "rms_norm_rows",
                  "qk_norm_heads", "embedding_v8", "embedding_q4_w1", "attn_prefill_ref", "attn_decode_ref",
                  "attn_prefill_mma_d128_n32", "attn_decode_mma_d128_w4_s4_c1"]


@needs_nvcc
@pytest.mark.parametrize("arch", list(TARGETS))
def test_family_kernels_compile(arch: str):
    target = get_target(arch)
    got = kernels_file.read(build_kernels(FAMILY_KERNELS, target))
    assert got.symbols == set(FAMILY_KERNELS) and got.sass_archs == (target.sm,)
