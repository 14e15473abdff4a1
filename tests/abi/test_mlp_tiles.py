"""``artifacts/mlp_tiles.py``: the layouts ``mlp_decode`` reads, checked word by word against the
module doc's formula written out independently here (loops over units, chunks, lanes and nibbles,
reading the codes from ``int4.unpack``), for both weights at a small size; ``unpack`` inverts
``pack``; a weight whose columns are not whole chunks of 64 is refused."""

from __future__ import annotations

import numpy as np
import pytest

from grokc.abi import int4, mlp_tiles
from grokc.abi.mlp_tiles import Part

H, I = 128, 192  # two 64-column chunks of gate/up rows, three of down rows
ROW = [0, 8, 0, 8, 0, 8, 0, 8]
COL = [0, 0, 8, 8, 1, 1, 9, 9]


def _row(part: Part, unit: int, r: int) -> int:
    if part is Part.GATE_UP:  # 8 gate rows, then the up rows of the same 8 outputs
        return 8 * unit + r if r < 8 else I + 8 * unit + r - 8
    return 16 * unit + r


@pytest.mark.parametrize("part", list(Part), ids=lambda p: p.name.lower())
def test_every_word_holds_the_codes_the_doc_names(part):
    n, k = (2 * I, H) if part is Part.GATE_UP else (H, I)
    codes = np.random.default_rng(int(part)).integers(0, 16, (n, k), dtype=np.uint8)
    words = mlp_tiles.pack(int4.pack(codes), part, H, I).view("<u4")
    units, chunks = n // 16, k // 64
    assert words.size == units * chunks * 128
    for unit in range(units):
        for chunk in range(chunks):
            block = chunk * units + unit if part is Part.DOWN else unit * chunks + chunk
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for kb in range(4):
                    word = int(words[block * 128 + lane * 4 + kb])
                    for j in range(8):
                        want = codes[_row(part, unit, g + ROW[j]), 64 * chunk + 16 * kb + 2 * t + COL[j]]
                        assert (word >> (4 * j)) & 0xF == want, (unit, chunk, lane, kb, j)


@pytest.mark.parametrize("part", list(Part), ids=lambda p: p.name.lower())
def test_unpack_inverts_pack(part):
    n, k = mlp_tiles.shape(part, H, I)
    packed = int4.pack(np.random.default_rng(5).integers(0, 16, (n, k), dtype=np.uint8))
    np.testing.assert_array_equal(mlp_tiles.unpack(mlp_tiles.pack(packed, part, H, I), part, H, I), packed)


def test_columns_off_the_chunk_are_refused():
    with pytest.raises(ValueError, match="chunks of 64"):
        mlp_tiles.pack(int4.pack(np.zeros((2 * 64, 96), np.uint8)), Part.GATE_UP, 96, 64)
    with pytest.raises(ValueError, match="chunks of 64"):
        mlp_tiles.pack(int4.pack(np.zeros((128, 96), np.uint8)), Part.DOWN, 128, 96)
