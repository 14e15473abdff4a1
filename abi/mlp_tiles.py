"""The layouts ``mlp_decode`` streams its q4 weights in (``pack_mlp_tiles`` writes them at load).

Both cut a weight's codes into *units* of 16 rows and *chunks* of 64 columns; a (unit, chunk) is
128 little-endian u32 words, ``[lane 32][kb 4]``: word ``lane * 4 + kb`` (``lane = 4 g + t``)
holds in nibble ``j`` the code of unit row ``g + ROW[j]`` at chunk column ``16 kb + 2 t + COL[j]``,
the four ``mma.m16n8k16`` A fragments of one 16 x 16 block after ``linear_gemv2.cuh``'s ``q4_pairs``.

- ``GATE_UP`` (``[2 inter, hidden]``, gate rows then up rows): unit ``u`` is gate rows
  ``8u .. 8u + 7`` and up rows ``inter + 8u ..`` (the same eight outputs), unit-major: one tile of
  ``8 hidden`` bytes a unit, so block ``b`` of ``mlp_decode`` finds its 64 outputs in the 8
  consecutive tiles ``8b .. 8b + 7``.
- ``DOWN`` (``[hidden, inter]``): unit ``u`` is rows ``16u .. 16u + 15``, chunk-major: the
  ``32 hidden`` bytes of chunk ``b`` (all rows, columns ``64b .. 64b + 63``) lie together, the down
  columns block ``b`` multiplies its activations by.

Codes only: scales and zero points stay in the weights' own arrays.
"""

from __future__ import annotations

import enum

import numpy as np

from grokc.abi import int4

UNIT_ROWS = 16
CHUNK = 64
ROW = np.array([0, 8, 0, 8, 0, 8, 0, 8])  # unit row offset of nibble j (added to g)
COL = np.array([0, 0, 8, 8, 1, 1, 9, 9])  # column offset of nibble j (added to 16 kb + 2t)


class Part(enum.IntEnum):
    """Which weight of the MLP a layout holds (``pack_mlp_tiles``' ``part``)."""

    GATE_UP = 0
    DOWN = 1


def shape(part: Part, hidden: int, inter: int) -> tuple[int, int]:
    """``(rows, cols)`` of the row-major weight of ``part``."""
    return (2 * inter, hidden) if part is Part.GATE_UP else (hidden, inter)


def unit_rows(part: Part, hidden: int, inter: int) -> np.ndarray:
    """``[units, 16]``: the weight row of each unit row."""
    if part is Part.GATE_UP:
        base = 8 * np.arange(inter // 8)[:, None]
        return np.concatenate([base + np.arange(8), inter + base + np.arange(8)], axis=1)
    return UNIT_ROWS * np.arange(hidden // UNIT_ROWS)[:, None] + np.arange(UNIT_ROWS)


def _fragment(rows: np.ndarray, cols: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per nibble ``j``, the (row, column) each word ``[unit, kb, lane]`` reads: ``[units, cols / 16, 32]``."""
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    kb = np.arange(cols // 16)[:, None]
    shape = (rows.shape[0], cols // 16, 32)
    r = [np.broadcast_to(rows[:, g + ROW[j]][:, None, :], shape) for j in range(8)]
    c = [np.broadcast_to(16 * kb + 2 * t + COL[j], shape) for j in range(8)]
    return r, c


def _order(words: np.ndarray, part: Part) -> np.ndarray:
    """``[units, kb, 32]`` words -> the layout's flat order."""
    units, kbs, _ = words.shape
    w = words.reshape(units, kbs // 4, 4, 32).transpose(0, 1, 3, 2)   # [unit][chunk][lane][kb % 4]
    return w.transpose(1, 0, 2, 3) if part is Part.DOWN else w


def pack(packed: np.ndarray, part: Part, hidden: int, inter: int) -> np.ndarray:
    """u8 ``[rows * cols / 2]``: the q4 weight ``packed`` (u8 ``[rows, cols / 2]``, abi/int4.py)
    in ``part``'s layout."""
    rows = unit_rows(part, hidden, inter)
    n, k = shape(part, hidden, inter)
    if k % CHUNK or rows.size != n:
        raise ValueError(f"mlp tiles of {part.name.lower()} need rows in units of 16 and columns in chunks of "
                         f"{CHUNK}, got a [{n}, {k}] weight")
    codes = int4.unpack(packed.reshape(n, k // 2)).astype(np.uint32)
    r, c = _fragment(rows, k)
    words = np.zeros(r[0].shape, np.uint32)
    for j in range(8):
        words |= codes[r[j], c[j]] << np.uint32(4 * j)
    return np.ascontiguousarray(_order(words, part)).astype("<u4").view(np.uint8).reshape(-1)


def unpack(tiles: np.ndarray, part: Part, hidden: int, inter: int) -> np.ndarray:
    """Inverse of :func:`pack`: u8 ``[rows, cols / 2]`` in abi/int4.py's layout."""
    rows = unit_rows(part, hidden, inter)
    n, k = shape(part, hidden, inter)
    ordered = np.ascontiguousarray(tiles).reshape(-1).view("<u4")
    units, chunks = rows.shape[0], k // CHUNK
    if part is Part.DOWN:
        ordered = ordered.reshape(chunks, units, 32, 4).transpose(1, 0, 2, 3)
    words = ordered.reshape(units, chunks, 32, 4).transpose(0, 1, 3, 2).reshape(units, chunks * 4, 32)
    r, c = _fragment(rows, k)
    codes = np.empty((n, k), np.uint8)
    for j in range(8):
        codes[r[j], c[j]] = (words >> np.uint32(4 * j)) & np.uint32(0xF)
    return int4.pack(codes)
