"""``mlp_decode`` and the ``linear`` kernels' f32 inputs against the numpy oracle (``runner/cpu.py``).

- ``linear`` with ``x_dtype`` / ``residual_dtype`` f32 (the batch-1 decode graph's layer sums,
  ``passes/fuse_decode_mlp.py``): the kernels the rules pick (gemv2 at M = 1 and 3, linear_rows for
  a wide f16 head) and the fp32 fallback, on f32 inputs that are not f16 values, within 2e-3 of the
  oracle (which rounds them to f16 as it reads them, as the ABI says).
- ``mlp_decode`` (sm_90+) at the Llama-3.2-1B sizes (H 2048, I 8192), with zero points, and at the
  smallest H it takes (256): ``acc`` starts at zero and must end at ``x + down(silu(gate) * up)``
  within 5e-3 relative (two int4 products, the activation rounded to f16 between, as the two
  ``linear`` launches it replaces: each of those is within 2e-3 / 5e-3 alone); ``clear``, filled
  with NaN, must be all zeros; two launches on the same ``acc`` add up (the kernel adds). The
  weights come in ``artifacts/mlp_tiles.py``'s layouts, packed by numpy;
- ``pack_mlp_tiles`` (the init graph's packing) gives numpy's layout, byte for byte, for both
  weights, at two sizes.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import run_kernel, seeded

from grokc.abi import int4, mlp_tiles
from grokc.abi.ops import KERNEL_ABI
from grokc.runner.cpu import OPS
from grokc.targets import (
    KernelCall,
    build_kernels,
    get_target,
    rules_linear,
    rules_mlp,
    select,
)

F16, F32 = np.float16, np.float32

# (M, N, K, weight format, act, x f32, residual f32, norm, kernel family to force or None for the rule's)
F32_CASES = [(1, 3072, 2048, "q4", "none", True, False, True, None),
             (1, 2048, 2048, "q4", "none", False, True, False, None),
             (3, 1024, 2048, "q4", "silu_mul", True, True, True, None),
             (1, 40000, 2048, "f16", "none", True, False, True, None),
             (2, 200, 576, "q4", "none", True, True, True, "ref"),
             (1, 96, 64, "f16", "silu_mul", True, True, False, "ref")]


def _f32_case(rng, m, n, k, fmt, act, x32, r32, norm):
    nw = 2 * n if act == "silu_mul" else n
    x = rng.standard_normal((m, k)).astype(F32)  # not f16 values: the kernel must round them
    args = {"x": x if x32 else x.astype(F16), "scales": None, "zeros": None, "norm": None, "residual": None,
            "addend": None, "bias": None, "M": m, "N": n, "K": k, "group_size": 0, "eps": 1e-5}
    if fmt == "f16":
        args["weight"] = (rng.standard_normal((nw, k)) / np.sqrt(k)).astype(F16)
    else:
        args["weight"] = int4.pack(rng.integers(0, 16, (nw, k), dtype=np.uint8))
        args["scales"] = (rng.uniform(0.5, 1.5, (nw, 1)) / (4 * np.sqrt(k))).astype(F16)
    if norm:
        args["norm"] = rng.uniform(0.5, 1.5, k).astype(F16)
    res = rng.standard_normal((m, n)).astype(F32)
    args["residual"] = res if r32 else None
    args["out"] = np.full((m, n), np.nan, F16)
    attrs = {"weight_format": fmt, "act": act, "out_dtype": "f16"}
    if x32:
        attrs["x_dtype"] = "f32"
    if r32:
        attrs["residual_dtype"] = "f32"
    return args, attrs


def _choice(args, attrs, family, sm):
    dims = {p.name: args[p.name] for p in KERNEL_ABI["linear"] if p.kind.value != "ptr"}
    call = KernelCall("linear", attrs, dims)
    if family == "ref":
        return rules_linear.rule_ref(call, get_target(f"sm{sm}"))
    return select(call, get_target(f"sm{sm}"))


@pytest.mark.parametrize("case", F32_CASES, ids=lambda c: "-".join(map(str, c)))
def test_linear_reads_f32_inputs_as_f16(case, sm):
    m, n, k, fmt, act, x32, r32, norm, family = case
    args, attrs = _f32_case(seeded(case), m, n, k, fmt, act, x32, r32, norm)
    choice = _choice(args, attrs, family, sm)
    suffix = ("_x32" if x32 else "") + ("r32" if r32 and x32 else "_r32" if r32 else "")
    assert choice.kernel.endswith(suffix), choice.kernel
    ref = {key: (v.copy() if isinstance(v, np.ndarray) else v) for key, v in args.items()}
    OPS["linear"](ref, attrs)
    want = ref["out"].astype(np.float64)
    got = run_kernel(build_kernels([choice.kernel], get_target(f"sm{sm}")), choice.kernel, choice.grid, choice.block,
                     choice.smem, "linear", args)["out"].astype(np.float64)
    assert not np.isnan(got).any(), f"{choice.kernel}: outputs unwritten"
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err <= 2e-3, f"{choice.kernel}: relative error {err:.2e}"


# (H, I, zero points)
MLP_CASES = [(2048, 8192, False), (2048, 512, True), (256, 128, True)]


def _weights(rng, h, i):
    return (int4.pack(rng.integers(0, 16, (2 * i, h), dtype=np.uint8)),
            int4.pack(rng.integers(0, 16, (h, i), dtype=np.uint8)))


def _mlp_case(rng, h, i, zeros):
    gate_up, down = _weights(rng, h, i)
    args = {"x": rng.standard_normal((1, h)).astype(F16), "norm": rng.uniform(0.5, 1.5, h).astype(F16),
            "gate_up_tiles": mlp_tiles.pack(gate_up, mlp_tiles.Part.GATE_UP, h, i),
            "gate_up_scales": (rng.uniform(0.5, 1.5, (2 * i, 1)) / (4 * np.sqrt(h))).astype(F16),
            "gate_up_zeros": rng.uniform(5.0, 11.0, (2 * i, 1)).astype(F16) if zeros else None,
            "down_tiles": mlp_tiles.pack(down, mlp_tiles.Part.DOWN, h, i),
            "down_scales": (rng.uniform(0.5, 1.5, (h, 1)) / (4 * np.sqrt(i))).astype(F16),
            "down_zeros": rng.uniform(5.0, 11.0, (h, 1)).astype(F16) if zeros else None,
            "acc": np.zeros((1, h), F32), "clear": np.full((1, h), np.nan, F32),
            "hidden": h, "inter": i, "eps": 1e-5}
    return args


@pytest.fixture(scope="module")
def mlp_cubin(sm):
    if not all(get_target(f"sm{sm}").has(f) for f in rules_mlp.NEEDS):
        pytest.skip("mlp_decode needs bulk copies and vector reductions (sm_90 and newer)")
    return build_kernels(sorted({rules_mlp.symbol(h) for h, _, _ in MLP_CASES} | {rules_mlp.PACK_SYMBOL}),
                       get_target(f"sm{sm}"))


@pytest.mark.parametrize("case", MLP_CASES, ids=lambda c: "-".join(map(str, c)))
def test_mlp_decode_against_the_oracle(case, mlp_cubin, sm):
    h, i, zeros = case
    args = _mlp_case(seeded(case), h, i, zeros)
    choice = select(KernelCall("mlp_decode", {"weight_format": "q4"}, {"hidden": h, "inter": i, "eps": 1e-5}),
                    get_target(f"sm{sm}"))
    assert choice.kernel == rules_mlp.symbol(h) and choice.grid == (i // 64, 1, 1)
    ref = {key: (v.copy() if isinstance(v, np.ndarray) else v) for key, v in args.items()}
    OPS["mlp_decode"](ref, {"weight_format": "q4"})
    want = ref["acc"].astype(np.float64)
    got = run_kernel(mlp_cubin, choice.kernel, choice.grid, choice.block, choice.smem, "mlp_decode", args)
    acc = got["acc"].astype(np.float64)
    err = np.linalg.norm(acc - want) / np.linalg.norm(want)
    assert err <= 5e-3, f"relative error {err:.2e}"
    assert np.abs(acc - want).max() <= 0.1 * np.sqrt(np.mean(want ** 2)), "an element is far off"
    # what the residual alone gives would pass a loose check: the MLP's part must be right too
    mlp_part, want_part = acc - args["x"].astype(np.float64), want - args["x"].astype(np.float64)
    assert np.linalg.norm(mlp_part - want_part) / np.linalg.norm(want_part) <= 1e-2
    np.testing.assert_array_equal(got["clear"], np.zeros((1, h), F32))
    twice = run_kernel(mlp_cubin, choice.kernel, choice.grid, choice.block, choice.smem, "mlp_decode",
                       {**args, "acc": got["acc"]})["acc"].astype(np.float64)
    np.testing.assert_allclose(twice, 2 * acc, rtol=1e-5, atol=1e-5 * np.abs(acc).max())


@pytest.mark.parametrize("case", [(2048, 512), (256, 128)], ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("part", list(mlp_tiles.Part), ids=lambda p: p.name.lower())
def test_pack_mlp_tiles_matches_numpy(case, part, mlp_cubin, sm):
    h, i = case
    weight = _weights(seeded((h, i, int(part))), h, i)[int(part)]
    call = KernelCall("pack_mlp_tiles", {}, {"part": int(part), "hidden": h, "inter": i})
    choice = select(call, get_target(f"sm{sm}"))
    args = {"out": np.full(weight.size, 0xAB, np.uint8), "weight": weight, "part": int(part), "hidden": h, "inter": i}
    got = run_kernel(mlp_cubin, choice.kernel, choice.grid, choice.block, choice.smem, "pack_mlp_tiles", args)["out"]
    np.testing.assert_array_equal(got, mlp_tiles.pack(weight, part, h, i))
