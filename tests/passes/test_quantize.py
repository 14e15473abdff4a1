"""Round-to-nearest int4 against an independent per-row, per-group reference written here."""

import numpy as np
import pytest

from grokc.artifacts import int4
from grokc.artifacts.errors import BuildOptionError
from grokc.passes.quantize import QuantRecipe, quantize_rtn
from grokc.compiler.ir import WeightFormat


def reference(w: np.ndarray, gs: int, symmetric: bool) -> np.ndarray:
    """Dequantized weights, one group at a time with plain Python loops over rows and groups."""
    n, k = w.shape
    gs = gs or k
    out = np.empty_like(w)
    for r in range(n):
        for g0 in range(0, k, gs):
            blk = w[r, g0:g0 + gs].astype(np.float64)
            if symmetric:
                s = np.float32(np.float16(np.abs(blk).max() / 7)) or np.float32(1)
                q = np.clip(np.rint(blk / s), -8, 7)
                out[r, g0:g0 + gs] = q * s
            else:
                lo, hi = min(blk.min(), 0.0), max(blk.max(), 0.0)
                s = np.float32(np.float16((hi - lo) / 15)) or np.float32(1)
                z = np.float32(np.float16(np.clip(np.rint(-lo / s), 0, 15)))
                q = np.clip(np.rint(blk / s) + z, 0, 15)
                out[r, g0:g0 + gs] = (q - z) * s
    return out


@pytest.mark.parametrize("shape,gs", [((7, 64), 0), ((5, 96), 32), ((3, 80), 32), ((4, 40), 16), ((2, 24), 0)])
@pytest.mark.parametrize("symmetric", [True, False])
def test_rtn_matches_reference_and_error_is_half_a_step(shape, gs, symmetric):
    rng = np.random.default_rng(sum(shape) + gs)
    w = rng.standard_normal(shape).astype(np.float32)
    w[0, :8] = 0  # a partly zero row
    codes, scales, zeros = quantize_rtn(w, gs, symmetric)
    deq = int4.dequantize(int4.pack(codes), scales, zeros, gs)
    np.testing.assert_allclose(deq, reference(w, gs, symmetric), rtol=1e-6, atol=1e-7)
    step = np.repeat(scales.astype(np.float32), gs or shape[1], axis=1)[:, : shape[1]]
    clipped = (codes == 0) | (codes == 15)   # asymmetric extremes may clip by rounding the zero-point
    assert np.all((np.abs(deq - w) <= step / 2 + 1e-6) | clipped)


def test_all_zero_rows_quantize_to_zero():
    codes, scales, zeros = quantize_rtn(np.zeros((3, 16), np.float32), 0, True)
    assert np.all(int4.dequantize(int4.pack(codes), scales, zeros, 0) == 0)


def test_pack_layout_by_hand():
    """Nibble j of each little-endian word holds code [0, 2, 4, 6, 1, 3, 5, 7][j] (int4.py)."""
    codes = np.arange(16, dtype=np.uint8).reshape(1, 16)
    words = int4.pack(codes).view("<u4")[0]
    for w, base in zip(words, (0, 8)):
        nibbles = [(int(w) >> (4 * j)) & 0xF for j in range(8)]
        assert nibbles == [base + c for c in (0, 2, 4, 6, 1, 3, 5, 7)]


def test_bad_group_size_is_refused():
    with pytest.raises(BuildOptionError, match="--group-size 12"):
        QuantRecipe("int4", WeightFormat.Q4, group_size=12)
