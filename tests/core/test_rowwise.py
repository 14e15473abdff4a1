"""passes/_rowwise.py: row-constant placeholders (synthetic builds) stay one row through quantize,
cast, pack and the fusion concatenations, with exactly the values the full computation gives."""

from __future__ import annotations

import numpy as np

from grokc.abi import int4
from grokc.core.rowwise import as_f16, concat_rows, row_constant
from grokc.quant.rtn import int8_rtn, quantize_rtn
from grokc.quant.weights import pack_int4


def constant_rows(row: np.ndarray, n: int) -> np.ndarray:
    return np.broadcast_to(row, (n, *row.shape))


def test_row_constant_is_stride_zero_rows_only():
    rng = np.random.default_rng(0)
    assert row_constant(constant_rows(rng.standard_normal(8), 5))
    assert not row_constant(rng.standard_normal((5, 8)))
    assert not row_constant(constant_rows(rng.standard_normal(8), 1))  # one row: nothing to save
    assert not row_constant(np.float32(1.0)) and not row_constant(None)


def test_quantize_cast_and_pack_of_a_constant_row_equal_the_full_computation():
    rng = np.random.default_rng(1)
    w = constant_rows(rng.standard_normal(256).astype(np.float32), 300)
    full = np.ascontiguousarray(w)
    for got, want in [(quantize_rtn(w, 64, False), quantize_rtn(full, 64, False)),
                      (quantize_rtn(w, 0, True), quantize_rtn(full, 0, True)),
                      (int8_rtn(w, False), int8_rtn(full, False))]:
        for g, x in zip(got, want):
            assert (g is None) == (x is None)
            if g is not None:
                assert g.shape == x.shape and g.dtype == x.dtype and np.array_equal(g, x)
                assert g.strides[0] == 0   # stayed one row
    codes = quantize_rtn(w, 0, True)[0]
    assert np.array_equal(pack_int4(codes), int4.pack(np.ascontiguousarray(codes))) and pack_int4(codes).strides[0] == 0
    assert np.array_equal(as_f16(w), full.astype(np.float16)) and as_f16(w).strides[0] == 0


def test_concat_rows_keeps_equal_constant_rows_constant_and_concatenates_the_rest():
    rng = np.random.default_rng(2)
    row = rng.standard_normal(16).astype(np.float32)
    a, b = constant_rows(row, 3), constant_rows(row, 5)
    got = concat_rows([a, b])
    assert got.shape == (8, 16) and got.strides[0] == 0 and np.array_equal(got, np.concatenate([a, b]))
    other = constant_rows(row + 1, 2)
    mixed = concat_rows([a, other])   # different rows: a real concatenation
    assert mixed.strides[0] != 0 and np.array_equal(mixed, np.concatenate([a, other]))
    real = rng.standard_normal((4, 16)).astype(np.float32)
    assert np.array_equal(concat_rows([a, real]), np.concatenate([a, real]))
