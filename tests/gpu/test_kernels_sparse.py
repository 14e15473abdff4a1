"""The ``sparse_residual`` kernels against the numpy oracle (``runner/cpu.py``), on the GPU, and the
chain the plan runs: ``sparse_residual`` writes a linear's ``addend``, the GEMV after it (joined by a
programmatic edge on sm_90) adds it before its activation.

Tolerance: ``||got - want|| / ||want|| <= 1e-5`` for the sparse product (fp32 sums of a few products
of f16 values; only the summation order and ``rsqrtf`` differ from the oracle), and the linear
kernels' own bound (``test_kernels_linear.TOL``) for the chain. Outputs are NaN-poisoned; rows with
no entries must come back 0.

Covered: every kernel (``sparse_residual_m1/2/4/8`` staged, ``sparse_residual_g`` unstaged), with
and without a norm, M = 1, 3, 8, 17 (a partial chunk of rows), K = 576, 2048, 8192 and 20000 (too
wide to stage: the fallback), empty rows and a dense row of more than 32 entries.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import Launch, Shared, run_chain, run_kernel, seeded
from test_kernels_linear import TOL, check, make_case, oracle

from grokc.abi.ops import KERNEL_ABI
from grokc.runner.cpu import OPS
from grokc.targets import KernelCall, build_kernels, get_target, rules_sparse, select

F16, F32, I32 = np.float16, np.float32, np.int32
SYMBOLS = ("sparse_residual_m1", "sparse_residual_m2", "sparse_residual_m4", "sparse_residual_m8", "sparse_residual_g")




@pytest.fixture(scope="module")
def cubin(sm) -> bytes:
    return build_kernels(SYMBOLS, get_target(f"sm{sm}"))


def make_csr(rng, nw: int, k: int, density: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random CSR ``[NW, K]``: row 0 empty, row 1 dense (K entries or 100), the rest ~ density."""
    rows = []
    for r in range(nw):
        if r == 0:
            cols = np.zeros(0, np.int64)
        elif r == 1:
            cols = np.sort(rng.choice(k, min(k, 100), replace=False))
        else:
            cols = np.flatnonzero(rng.random(k) < density)
        rows.append(cols)
    rowptr = np.concatenate([[0], np.cumsum([c.size for c in rows])]).astype(I32)
    cols = np.concatenate(rows).astype(I32)
    vals = (0.05 * rng.standard_normal(cols.size)).astype(F16)
    return rowptr, cols, vals


def sparse_args(rng, m: int, nw: int, k: int, norm: bool, density: float = 0.01) -> dict:
    rowptr, cols, vals = make_csr(rng, nw, k, density)
    return {"out": np.full((m, nw), np.nan, F32), "x": rng.standard_normal((m, k)).astype(F16),
            "norm": rng.uniform(0.5, 1.5, k).astype(F16) if norm else None,
            "rowptr": rowptr, "cols": cols, "vals": vals, "M": m, "NW": nw, "K": k, "eps": 1e-5}


def sparse_oracle(args: dict) -> np.ndarray:
    ref = {key: (v.copy() if isinstance(v, np.ndarray) else v) for key, v in args.items()}
    OPS["sparse_residual"](ref, {})
    return ref["out"].astype(np.float64)


def _launch(cubin: bytes, args: dict, kernel: str | None = None, sm: int = 90) -> np.ndarray:
    dims = {p.name: args[p.name] for p in KERNEL_ABI["sparse_residual"] if p.kind.value != "ptr"}
    choice = select(KernelCall("sparse_residual", {}, dims), get_target(f"sm{sm}"))
    if kernel is not None and kernel != choice.kernel:  # force a variant: same grid rule as its own
        mt = 1 if kernel == "sparse_residual_g" else int(kernel.removeprefix("sparse_residual_m"))
        grid = (-(-args["NW"] // rules_sparse.ROWS_PER_BLOCK), -(-args["M"] // mt), 1)
        smem = 0 if kernel == "sparse_residual_g" else mt * args["K"] * 4
        choice = type(choice)(kernel, grid, choice.block, smem, "forced")
    return run_kernel(cubin, choice.kernel, choice.grid, choice.block, choice.smem, "sparse_residual", args)["out"]


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("m,nw,k", [(1, 1728, 576), (3, 300, 2048), (8, 200, 8192), (17, 130, 576), (2, 70, 20000),
                                    (128, 576, 1536)])  # SmolLM2's down projection in a prefill bucket
def test_selected_kernel(cubin, sm, m, nw, k, norm):
    args = sparse_args(seeded(m, nw, k, norm), m, nw, k, norm)
    got = _launch(cubin, args, sm=sm)
    want = sparse_oracle(args)
    assert not np.isnan(got).any(), "unwritten outputs"
    assert np.all(got[:, 0] == 0), "a row with no entries must give 0"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("kernel", SYMBOLS)
def test_every_variant(cubin, sm, kernel):
    m, nw, k = 11, 150, 1024  # 11 rows: a partial last chunk for every MT
    args = sparse_args(seeded(kernel), m, nw, k, True, density=0.05)
    got = _launch(cubin, args, kernel, sm=sm)
    want = sparse_oracle(args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("act", ["none", "silu_mul"])
@pytest.mark.parametrize("m", [1, 4])
def test_chain_into_the_gemv(cubin, sm, act, m):
    """sparse_residual (plain edge) then the linear reading its addend (programmatic edge on sm_90),
    in one CUDA graph, as the plan lays them out: the linear must see the finished addend."""
    n, k = 1024, 2048
    nw = 2 * n if act == "silu_mul" else n
    rng = seeded("chain", act, m)
    lin, attrs = make_case(rng, m, n, k, "q4", act, "f16", True, act == "none")
    sp = sparse_args(rng, m, nw, k, False, density=0.01)
    sp.update(x=lin["x"], norm=lin["norm"])
    want = oracle({**lin, "addend": sparse_oracle(sp).astype(F32)}, attrs)
    dims = {p.name: lin[p.name] for p in KERNEL_ABI["linear"] if p.kind.value != "ptr"}
    lchoice = select(KernelCall("linear", attrs, dims), get_target(f"sm{sm}"))
    sdims = {p.name: sp[p.name] for p in KERNEL_ABI["sparse_residual"] if p.kind.value != "ptr"}
    schoice = select(KernelCall("sparse_residual", {}, sdims), get_target(f"sm{sm}"))
    lin_cubin = build_kernels([lchoice.kernel], get_target(f"sm{sm}"))

    launches = [
        Launch(cubin, schoice.kernel, schoice.grid, schoice.block, schoice.smem, "sparse_residual",
               {**sp, "x": Shared("x"), "out": Shared("addend")}),
        Launch(lin_cubin, lchoice.kernel, lchoice.grid, lchoice.block, lchoice.smem, "linear",
               {**lin, "x": Shared("x"), "out": Shared("out"), "addend": Shared("addend")},
               pdl=sm >= 90 and lchoice.pdl),
    ]
    got = run_chain(launches, {"x": lin["x"], "addend": np.full((m, nw), np.nan, F32), "out": lin["out"]})["out"]
    check(got, want, TOL["q4"], f"sparse_residual -> {lchoice.kernel} ({act}, M={m})")
