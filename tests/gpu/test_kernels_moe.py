"""The mixture-of-experts kernels (``targets/kernels/moe.cuh``) against the numpy oracle
(``runner/cpu.py``), on the kernels the rules pick for this GPU.

- ``moe_route``: every routing buffer identical to the oracle's (slot rows, token of each row,
  offsets, the active list), weights within 1e-6: Mixtral-like (8 experts, top 2, renormalised),
  Qwen2-MoE-like (60 experts, top 4, 4 shared chunks behind a sigmoid gate, padding rows),
  Qwen3-MoE-like (128 experts, top 8), and a bucket of 600 tokens (several shared-memory tiles);
- ``moe_gather``: the normed rows within one f16 rounding;
- ``moe_linear``: each family the rules pick (the expert GEMV at T = 1, 3, 8; the grouped GEMM;
  the fp32 fallback), int4 per channel and in groups, f16, silu_mul and none, f16 and f32 out,
  within 2e-3 relative of the oracle; the rows past the routed ones stay unwritten;
- ``moe_combine`` within one f16 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import run_kernel, seeded

from grokc.abi import int4
from grokc.abi.ops import KERNEL_ABI
from grokc.runner.cpu import OPS
from grokc.targets import KernelCall, build_kernels, get_target, select

F16, F32, I32 = np.float16, np.float32, np.int32


def _dims(op: str, args: dict) -> dict:
    return {p.name: args[p.name] for p in KERNEL_ABI[op] if p.kind.value != "ptr"}


def _run(op: str, args: dict, attrs: dict, sm: int) -> tuple[dict, dict]:
    """(the GPU's outputs, the oracle's) of one launch of ``op`` on ``args``."""
    target = get_target(f"sm{sm}")
    choice = select(KernelCall(op, attrs, _dims(op, args)), target)
    want = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    OPS[op](want, attrs)
    got = run_kernel(build_kernels([choice.kernel], target), choice.kernel, choice.grid, choice.block, choice.smem,
                     op, args)
    return got, want


def _route_args(rng, t, e, k, c, norm, gate, n_real=None):
    s = k + c
    return {"weights": np.full((t, s), np.nan, F32), "slot_rows": np.full((t, s), -7, I32),
            "row_token": np.full(t * s, -7, I32), "offsets": np.full(e + c + 1, -7, I32),
            "active": np.full(e + c + 1, -7, I32), "logits": rng.standard_normal((t, e + gate)).astype(F32),
            "n_real": None if n_real is None else np.array([n_real], I32), "T": t, "n_experts": e, "top_k": k,
            "n_shared": c, "norm_top_k": int(norm), "shared_gate": int(gate)}


ROUTES = [(1, 8, 2, 0, True, False, None), (8, 8, 2, 0, True, False, None), (16, 60, 4, 4, False, True, 11),
          (8, 128, 8, 0, True, False, None), (600, 64, 6, 2, True, True, 590)]


@pytest.mark.parametrize("case", ROUTES, ids=lambda c: "-".join(map(str, c)))
def test_route_matches_the_oracle(case, sm):
    got, want = _run("moe_route", _route_args(seeded(case), *case), {}, sm)
    for key in ("slot_rows", "row_token", "offsets", "active"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    np.testing.assert_allclose(got["weights"], want["weights"], rtol=0, atol=1e-6)


def _routed(rng, t, e, k):
    """Grouping buffers (from the oracle) of ``t`` tokens over ``e`` experts, top ``k``."""
    args = _route_args(rng, t, e, k, 0, True, False)
    OPS["moe_route"](args, {})
    return args


def test_gather_matches_the_oracle(sm):
    rng = seeded("gather")
    route = _routed(rng, 12, 8, 2)
    args = {"out": np.full((24, 256), np.nan, F16), "x": rng.standard_normal((12, 256)).astype(F16),
            "norm": rng.uniform(0.5, 1.5, 256).astype(F16), "row_token": route["row_token"],
            "offsets": route["offsets"], "T": 12, "R": 24, "hidden": 256, "n_experts": 8, "eps": 1e-5}
    got, want = _run("moe_gather", args, {}, sm)
    np.testing.assert_allclose(got["out"].astype(F32), want["out"].astype(F32), rtol=2e-3, atol=1e-3)


# (T, top k, experts, N, K, format, group size, act, out)
LINEARS = [(1, 2, 8, 1024, 512, "q4", 0, "silu_mul", "f16"), (3, 2, 8, 512, 1024, "q4", 0, "none", "f32"),
           (8, 4, 16, 768, 512, "q4", 128, "silu_mul", "f16"), (8, 2, 8, 512, 256, "f16", 0, "none", "f32"),
           (200, 4, 16, 512, 768, "q4", 0, "silu_mul", "f16"), (200, 2, 8, 768, 512, "q4", 64, "none", "f32"),
           (300, 2, 8, 256, 512, "f16", 0, "silu_mul", "f16"), (4, 2, 8, 96, 40, "q4", 0, "none", "f32")]


@pytest.mark.parametrize("case", LINEARS, ids=lambda c: "-".join(map(str, c)))
def test_linear_matches_the_oracle(case, sm):
    t, k, e, n, kk, fmt, gs, act, out = case
    rng = seeded(case)
    route = _routed(rng, t, e, k)
    nw = 2 * n if act == "silu_mul" else n
    r = t * k
    args = {"out": np.full((r, n), np.nan, F32 if out == "f32" else F16),
            "x": rng.standard_normal((r, kk)).astype(F16), "offsets": route["offsets"], "active": route["active"],
            "T": t, "R": r, "N": n, "K": kk, "group_size": gs, "n_experts": e, "zeros": None}
    if fmt == "q4":
        groups = -(-kk // (gs or kk))
        args["weight"] = np.stack([int4.pack(rng.integers(0, 16, (nw, kk), dtype=np.uint8)) for _ in range(e)])
        args["scales"] = (rng.uniform(0.5, 1.5, (e, nw, groups)) / (4 * np.sqrt(kk))).astype(F16)
        args["zeros"] = rng.uniform(6, 10, (e, nw, groups)).astype(F16) if gs else None
    else:
        args["weight"] = (rng.standard_normal((e, nw, kk)) / np.sqrt(kk)).astype(F16)
        args["scales"] = None
    got, want = _run("moe_linear", args, {"weight_format": fmt, "act": act, "out_dtype": out}, sm)
    g, w = got["out"].astype(np.float64), want["out"].astype(np.float64)
    assert not np.isnan(g).any(), "rows left unwritten (every row is routed here)"
    err = np.linalg.norm(g - w) / np.linalg.norm(w)
    assert err <= 2e-3, f"relative error {err:.2e}"


def test_linear_leaves_unrouted_rows_alone(sm):
    rng = seeded("padding")
    route = _route_args(rng, 8, 8, 2, 0, True, False, n_real=5)
    OPS["moe_route"](route, {})
    args = {"out": np.full((16, 256), np.nan, F16), "x": rng.standard_normal((16, 256)).astype(F16),
            "weight": np.stack([int4.pack(rng.integers(0, 16, (512, 256), dtype=np.uint8)) for _ in range(8)]),
            "scales": np.full((8, 512, 1), 0.01, F16), "zeros": None, "offsets": route["offsets"],
            "active": route["active"], "T": 8, "R": 16, "N": 256, "K": 256, "group_size": 0, "n_experts": 8}
    got, want = _run("moe_linear", args, {"weight_format": "q4", "act": "silu_mul", "out_dtype": "f16"}, sm)
    assert np.isnan(got["out"][10:]).all() and not np.isnan(got["out"][:10]).any()


def test_combine_matches_the_oracle(sm):
    rng = seeded("combine")
    route = _route_args(rng, 6, 8, 2, 1, True, True, n_real=5)
    OPS["moe_route"](route, {})
    args = {"out": np.full((6, 512), np.nan, F16), "y": rng.standard_normal((18, 512)).astype(F32),
            "weights": route["weights"], "slot_rows": route["slot_rows"],
            "residual": rng.standard_normal((6, 512)).astype(F16), "T": 6, "hidden": 512, "S": 3}
    got, want = _run("moe_combine", args, {}, sm)
    np.testing.assert_allclose(got["out"].astype(F32), want["out"].astype(F32), rtol=2e-3, atol=2e-3)
