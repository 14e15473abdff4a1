"""Round-to-nearest int4/int8 and quantized embedding tables (quant/rtn.py, quant/weights.py) against
independent per-row, per-group loop references written here."""

import numpy as np
import pytest
from quant_oracles import int8_reference, reference

from grokc.abi import int4, int8
from grokc.core.errors import BuildOptionError
from grokc.core.ir import WeightFormat
from grokc.quant.recipe import QuantRecipe, Rounding
from grokc.quant.rtn import int8_rtn, quantize_rtn
from grokc.quant.weights import dequantized_embedding, quantize_embedding


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


def embedding_recipe(fmt: WeightFormat, **kw) -> QuantRecipe:
    return QuantRecipe("fp16", WeightFormat.F16, embeddings=fmt, **kw)


def table(shift: float = 0.0) -> np.ndarray:
    w = np.random.default_rng(3).standard_normal((40, 64)).astype(np.float32) + np.float32(shift)
    w[1] = 0   # an all-zero row
    return w


def test_int8_embedding_matches_reference_and_stores_u8_codes_per_row():
    w = table()
    codes, scales, zeros, gs = quantize_embedding(w, embedding_recipe(WeightFormat.Q8))
    assert codes.dtype == np.uint8 and codes.shape == (40, 64) and scales.shape == (40, 1) and zeros is None
    assert gs == 0 and codes.min() >= 1                 # symmetric: codes in [1, 255], 128 is zero
    deq = (codes.astype(np.float32) - 128) * scales.astype(np.float32)
    np.testing.assert_allclose(deq, int8_reference(w), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(dequantized_embedding(w, embedding_recipe(WeightFormat.Q8)), deq)
    step = np.abs(w).max(1, keepdims=True) / 127
    assert np.all(np.abs(deq - w) <= step / 2 * (1 + 2 ** -10) + 1e-7)   # half a step (f16-rounded scale)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("gs,stored_gs", [(0, 0), (16, 16), (48, 0)])   # 48 does not divide 64: per row
def test_int4_embedding_is_rtn_per_row_or_group_in_the_packed_layout(symmetric, gs, stored_gs):
    w = table()
    recipe = embedding_recipe(WeightFormat.Q4, group_size=gs, symmetric=symmetric)
    packed, scales, zeros, got_gs = quantize_embedding(w, recipe)
    assert got_gs == stored_gs and packed.shape == (40, 32) and scales.shape == (40, 64 // (stored_gs or 64))
    assert (zeros is None) == symmetric
    deq = int4.dequantize(packed, scales, zeros, stored_gs)
    np.testing.assert_allclose(deq, reference(w, stored_gs, symmetric), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(dequantized_embedding(w, recipe), deq)
    assert np.all(deq[1] == 0)
    step = np.repeat(scales.astype(np.float32), stored_gs or 64, axis=1)
    codes = int4.unpack(packed)
    assert np.all((np.abs(deq - w) <= step / 2 + 1e-6) | (codes == 0) | (codes == 15))


def test_embedding_errors_int8_below_int4_and_asymmetric_below_symmetric_on_shifted_rows():
    w = table(shift=1.5)   # mostly positive rows: a zero-point uses the grid better
    err = {name: np.abs(dequantized_embedding(w, embedding_recipe(fmt, symmetric=sym)) - w).mean(1)
           for name, fmt, sym in (("q8", WeightFormat.Q8, True), ("q4s", WeightFormat.Q4, True),
                                  ("q4a", WeightFormat.Q4, False))}
    rows = np.arange(40) != 1
    assert np.all(err["q8"][rows] < err["q4a"][rows]) and np.all(err["q4a"][rows] < err["q4s"][rows])
    assert np.all(10 * err["q8"][rows] < err["q4s"][rows])   # steps of absmax/127 vs absmax/7
    np.testing.assert_array_equal(dequantized_embedding(w, embedding_recipe(WeightFormat.F16)),
                                  w.astype(np.float16).astype(np.float32))


def test_int4_embedding_needs_hidden_a_multiple_of_8_and_bad_formats_are_refused():
    with pytest.raises(BuildOptionError, match="--embeddings int8"):
        quantize_embedding(np.ones((4, 20), np.float32), embedding_recipe(WeightFormat.Q4))
    assert quantize_embedding(np.ones((4, 20), np.float32), embedding_recipe(WeightFormat.Q8))[0].shape == (4, 20)
    with pytest.raises(BuildOptionError, match="--embeddings f32"):
        embedding_recipe(WeightFormat.F32)


@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_rtn_matches_reference_within_half_a_step(symmetric):
    """int8_rtn per row against the loop reference above (same rounding, so equal to f32 precision:
    1e-6 relative), and every weight within half a step of its code (the f16-rounded scale moves the
    grid by at most 2**-11 of a step per code, hence the small slack)."""
    w = table(shift=1.5)   # rows mostly positive: the zero-point moves, the range shrinks by about 0.6
    w[2, :] = -np.abs(w[2, :])   # an all-negative row: zero-point 255
    codes, scales, zeros = int8_rtn(w, symmetric)
    assert codes.dtype == np.uint8 and codes.shape == w.shape and scales.shape == (40, 1)
    assert (zeros is None) == symmetric
    deq = int8.dequantize(codes, scales, zeros, 0)
    np.testing.assert_allclose(deq, int8_reference(w, symmetric), rtol=1e-6, atol=1e-7)
    assert np.all(deq[1] == 0)
    step = scales.astype(np.float32)
    assert np.all(np.abs(deq - w) <= step / 2 * (1 + 2 ** -9) + 1e-7)
    if not symmetric:
        z = zeros.astype(np.float32)
        assert np.all(z == np.rint(z)) and z.min() >= 0 and z.max() <= 255 and z[2, 0] == 255
        assert np.abs(deq - w).mean() < 0.8 * np.abs(int8_reference(w, True) - w).mean()   # the zero-point pays


def test_int8_head_options():
    assert QuantRecipe("x", WeightFormat.Q4, lm_head=WeightFormat.Q8).to_json()["lm_head"] == "q8"
    with pytest.raises(BuildOptionError, match="no int4 weights"):   # GPTQ is for int4 only
        QuantRecipe("x", WeightFormat.F16, rounding=Rounding.GPTQ, lm_head=WeightFormat.Q8)
    with pytest.raises(BuildOptionError, match="--fp16-residual"):
        QuantRecipe("x", WeightFormat.F16, lm_head=WeightFormat.Q8, fp16_residual=0.005)
    with pytest.raises(BuildOptionError, match="fp16, int8 or int4"):
        QuantRecipe("x", WeightFormat.Q4, lm_head=WeightFormat.F32)
