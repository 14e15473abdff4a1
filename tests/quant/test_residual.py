"""The fp16 sparse residual's selection (quant/residual.py) and its recipe checks.

The selection reference here ranks entries with a plain Python sort on ``(-saliency, flat index)``
in float64, independent of the partition-based selection."""

from dataclasses import replace

import numpy as np
import pytest

from grokc.abi import int4
from grokc.core.errors import BuildOptionError
from grokc.core.ir import WeightFormat
from grokc.quant import residual
from grokc.quant.recipe import QUANT, QuantRecipe
from grokc.quant.rtn import quantize_rtn


def rtn(w: np.ndarray, gs: int = 0) -> np.ndarray:
    codes, scales, zeros = quantize_rtn(w, gs, True)
    return int4.dequantize(int4.pack(codes), scales, zeros, gs)


def reference_keep(w, wq, budget, hdiag=None) -> list[tuple[int, int]]:
    """(row, col) of the kept entries: the top ``round(budget * size)`` by saliency, ties by flat index."""
    n, k = w.shape
    scored = []
    for i in range(n):
        for j in range(k):
            s = abs(float(np.float32(w[i, j]) - np.float32(wq[i, j])))
            if hdiag is not None:
                s *= float(np.sqrt(np.float32(hdiag[j])))
            if s > 0:
                scored.append((-s, i * k + j))
    keep = int(np.floor(budget * n * k + 0.5))
    return sorted(divmod(idx, k) for _, idx in sorted(scored)[:keep])


def csr_entries(rowptr, cols) -> list[tuple[int, int]]:
    return [(r, int(c)) for r in range(len(rowptr) - 1) for c in cols[rowptr[r]:rowptr[r + 1]]]


@pytest.mark.parametrize("shape,budget,gs", [((16, 64), 0.02, 0), ((7, 96), 0.05, 32), ((33, 40), 0.004, 0)])
@pytest.mark.parametrize("with_h", [False, True])
def test_select_keeps_the_most_salient_entries_and_restores_w_there(shape, budget, gs, with_h):
    rng = np.random.default_rng(sum(shape))
    w = rng.standard_normal(shape).astype(np.float32)
    wq = rtn(w, gs)
    hdiag = rng.uniform(0.1, 10.0, shape[1]).astype(np.float32) if with_h else None
    rowptr, cols, vals = residual.select(w, wq, budget, hdiag)

    assert rowptr.dtype == np.int32 and cols.dtype == np.int32 and vals.dtype == np.float16
    assert rowptr.shape == (shape[0] + 1,) and rowptr[0] == 0 and rowptr[-1] == cols.size == vals.size
    kept = csr_entries(rowptr, cols)
    assert kept == reference_keep(w, wq, budget, hdiag)
    assert len(kept) == int(np.floor(budget * w.size + 0.5)) > 0
    rows, cc = np.array(kept).T
    np.testing.assert_array_equal(vals, (w[rows, cc] - wq[rows, cc]).astype(np.float16))

    fixed = residual.scatter(wq, rowptr, cols, vals)
    r = np.abs(w - wq)
    # kept entries: W up to the f16 rounding of the residual; the rest untouched
    assert np.all(np.abs(fixed[rows, cc] - w[rows, cc]) <= r[rows, cc] * 2.0 ** -11 + 1e-7)
    untouched = np.ones(shape, bool)
    untouched[rows, cc] = False
    np.testing.assert_array_equal(fixed[untouched], wq[untouched])
    assert np.abs(fixed - w).sum() < np.abs(wq - w).sum()


def test_ties_go_to_the_lowest_index_and_zeros_are_never_kept():
    w = np.zeros((4, 8), np.float32)
    w[:, 2] = 1.0                                               # four equal residuals, rows 0..3
    wq = np.zeros_like(w)
    rowptr, cols, vals = residual.select(w, wq, 2 / 32)
    assert csr_entries(rowptr, cols) == [(0, 2), (1, 2)]
    rowptr, cols, _ = residual.select(w, wq, 0.5)        # budget past the nonzero residuals
    assert csr_entries(rowptr, cols) == [(i, 2) for i in range(4)]
    rowptr, cols, vals = residual.select(w, wq, 0.0)
    assert cols.size == 0 and vals.size == 0 and np.all(rowptr == 0)


def test_dead_inputs_are_never_kept():
    """An input with H_jj == 0 never fires: correcting its weights cannot help."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 32)).astype(np.float32)
    hdiag = np.ones(32, np.float32)
    hdiag[:16] = 0
    rowptr, cols, _ = residual.select(w, rtn(w), 0.2, hdiag)
    assert cols.size and cols.min() >= 16


@pytest.mark.parametrize("budget", [-0.01, 0.2, float("nan")])
def test_budget_out_of_range_is_refused(budget):
    with pytest.raises(BuildOptionError, match="--fp16-residual"):
        QuantRecipe("int4-rtn", WeightFormat.Q4, fp16_residual=budget)


def test_residual_without_int4_weights_is_refused():
    with pytest.raises(BuildOptionError, match="--fp16-residual corrects int4"):
        replace(QUANT["fp16"], fp16_residual=0.01)
