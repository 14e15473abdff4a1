"""Apache TVM's kernels in the ``linear`` rule list (``targets/rules_tvm.py``): which calls they cover,
that ``--kernels auto`` never asks TVM, that ``--kernels tvm`` picks them and falls back to the
hand-written rules elsewhere, that their source compiles with nvcc for sm80 and sm90 beside our own
kernels, and that generation is the same across processes. Tests that generate need TVM (the
``tvm`` extra) and skip without it; the numbers are checked on the GPU (tests/gpu/test_kernels_tvm.py)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

import grokc.targets
from grokc.core.errors import TargetError
from grokc.targets import KernelCall, build_kernels, get_target, rules_tvm, select

OPTIONAL = frozenset({"zeros", "norm", "residual", "addend", "bias"})
SM90_TVM = dataclasses.replace(get_target("sm90"), kernels="tvm")


def call(m: int, n: int, k: int, *, wf: str = "q4", act: str = "none", out: str = "f16", gs: int = 0,
         given: tuple[str, ...] = (), **attrs: str) -> KernelCall:
    """A linear call passing the optional pointers in ``given`` and null for the others."""
    return KernelCall("linear", {"weight_format": wf, "act": act, "out_dtype": out, **attrs},
                      {"M": m, "N": n, "K": k, "group_size": gs, "eps": 1e-5}, OPTIONAL - set(given))


def needs_tvm():
    pytest.importorskip("tvm", reason="Apache TVM is not installed (pip install 'grokc[tvm]')")


@pytest.mark.parametrize("c", [
    call(1, 2048, 2048, act="silu_mul"), call(1, 2048, 2048, given=("norm",)), call(1, 2048, 2048, given=("bias",)),
    call(1, 2048, 2048, given=("addend",)), call(1, 2048, 2048, gs=128), call(4, 2048, 2048), call(15, 2048, 2048),
    call(1, 2048, 2048, wf="q8"), call(1, 2048, 2048, x_dtype="f32"), call(1, 2048, 2048, given=("residual",),
                                                                            residual_dtype="f32"),
    KernelCall("linear", {"weight_format": "q4", "act": "none", "out_dtype": "f16"},
               {"M": 1, "N": 64, "K": 64, "group_size": 0, "eps": 0.0}),  # nulls unknown: a norm may be given
], ids=["silu", "norm", "bias", "addend", "groups", "m4", "m15", "q8", "x32", "r32", "nulls-unknown"])
def test_calls_outside_what_tvm_covers_are_refused(c):
    assert rules_tvm.covers(c) is None
    assert not select(c, SM90_TVM).rule.startswith("linear.tvm")   # the hand-written rules take them


@pytest.mark.parametrize("c, symbol", [
    (call(1, 3072, 2048), "linear_tvm_q4_none_f16_m1n3072k2048"),
    (call(1, 2048, 8192, given=("residual", "zeros")), "linear_tvm_q4_none_f16_z_res_m1n2048k8192"),
    (call(512, 16384, 2048, gs=2048), "linear_tvm_q4_none_f16_m512n16384k2048"),   # one group = per channel
    (call(1, 128256, 2048, wf="f16", out="f32", given=("zeros",)), "linear_tvm_f16_none_f32_m1n128256k2048"),
])
def test_covered_calls_name_their_kernel(c, symbol):
    spec = rules_tvm.covers(c)
    assert spec is not None and spec.symbol == symbol and rules_tvm.parse(symbol) == spec


def test_auto_never_asks_tvm(monkeypatch):
    def no_tvm(symbol):
        raise AssertionError(f"an auto build generated {symbol}")

    monkeypatch.setattr(rules_tvm, "load", no_tvm)
    for arch in ("sm80", "sm90", "sm120"):
        for c in (call(1, 2048, 2048), call(512, 2048, 2048, given=("residual",))):
            assert not select(c, get_target(arch)).rule.startswith("linear.tvm")


def test_without_tvm_a_tvm_build_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "grokc.targets.tvm_codegen", None)   # `import` raises ImportError
    monkeypatch.delattr(grokc.targets, "tvm_codegen", raising=False)      # ... once an earlier test imported it
    monkeypatch.setattr(rules_tvm, "_LOADED", {})
    monkeypatch.setenv(rules_tvm.KERNELS_ENV, str(tmp_path))              # a folder without the kernel
    with pytest.raises(TargetError, match=r"pip install 'grokc\[tvm\]'.*GROKC_TVM_KERNELS"):
        select(call(1, 2048, 2048), SM90_TVM)


# Llama-3.2-1B's linears as TVM covers them (no norm, no activation): decode at M = 1, prefill GEMMs
LLAMA_1B = [call(1, 3072, 2048), call(1, 2048, 2048, given=("residual",)), call(1, 16384, 2048),
            call(1, 2048, 8192, given=("residual",)), call(512, 16384, 2048), call(2048, 2048, 8192, given=("residual",)),
            call(1, 128256, 2048, wf="f16", out="f32")]


def test_tvm_picks_its_kernels_and_they_compile_beside_ours(nvcc):
    needs_tvm()
    choices = [select(c, SM90_TVM) for c in LLAMA_1B]
    assert [c.rule for c in choices] == ["linear.tvm_gemv"] * 4 + ["linear.tvm_gemm"] * 2 + ["linear.tvm_gemv"]
    for c, choice in zip(LLAMA_1B, choices):
        assert choice.kernel == rules_tvm.covers(c).symbol and not choice.pdl
        threads = choice.block[0] * choice.block[1] * choice.block[2]
        assert 32 <= threads <= 1024 and min(choice.grid) >= 1 and choice.smem <= SM90_TVM.smem_per_block
    fallback = select(call(1, 8192, 2048, act="silu_mul", given=("norm",)), SM90_TVM)
    assert fallback.rule == "linear.gemv2"
    symbols = [c.kernel for c in choices] + [fallback.kernel]
    for arch in ("sm80", "sm90"):
        cubin = build_kernels(symbols, get_target(arch))
        for s in symbols:
            assert s.encode() in cubin, (arch, s)


def test_the_entry_point_passes_each_buffer_to_its_tvm_parameter():
    needs_tvm()
    symbol = select(call(1, 2048, 2048, given=("residual", "zeros")), SM90_TVM).kernel
    source = rules_tvm.load(symbol).source
    device = re.search(rf"void {symbol}_tvm\(([^)]*)\)", source)[1]
    tvm_params = re.findall(r"(\w+)\* __restrict__ (\w+)_ptr", device)
    entry = re.search(rf'extern "C" __global__ void __launch_bounds__\(\d+\) {symbol}\(([^)]*)\) \{{ {symbol}_tvm\((.*)\); \}}',
                      source)
    assert entry[1].startswith("void* out, const void* x, const void* weight, const void* scales, const void* zeros")
    passed = [a.strip() for a in entry[2].split(",")]
    expected = {"x": "x", "w": "weight", "s": "scales", "z": "zeros", "res": "residual", "y": "out"}
    assert sorted(name for _, name in tvm_params) == sorted(expected)
    assert passed == [f"({ctype}*){expected[name]}" for ctype, name in tvm_params]


def test_stored_kernels_load_without_tvm(monkeypatch, tmp_path):
    needs_tvm()
    symbol = "linear_tvm_q4_none_f16_res_m16n64k64"
    made = rules_tvm.generate(symbol)
    rules_tvm.save(made, tmp_path)
    monkeypatch.setitem(sys.modules, "grokc.targets.tvm_codegen", None)
    monkeypatch.setattr(rules_tvm, "_LOADED", {})
    monkeypatch.setenv(rules_tvm.KERNELS_ENV, str(tmp_path))
    assert rules_tvm.load(symbol) == made
    (tmp_path / f"{symbol}.json").write_text('{"symbol": "linear_tvm_q4_none_f16_m1n64k64"}')
    monkeypatch.setattr(rules_tvm, "_LOADED", {})
    with pytest.raises(TargetError, match="not a stored TVM kernel"):
        rules_tvm.load(symbol)


def test_generation_is_the_same_in_another_process():
    needs_tvm()
    symbol = "linear_tvm_q4_none_f16_res_m128n96k64"
    code = ("import sys; from grokc.targets import rules_tvm; k = rules_tvm.generate(sys.argv[1]); "
            "sys.stdout.write(repr((k.source, k.grid, k.block, k.smem)))")
    other = subprocess.run([sys.executable, "-c", code, symbol], capture_output=True, text=True, check=True).stdout
    k = rules_tvm.generate(symbol)
    assert other == repr((k.source, k.grid, k.block, k.smem))
