"""The packed int4 weight layout that kernels read and the CPU executor unpacks.

A weight ``W [N, K]`` becomes 4-bit codes ``c in [0, 16)`` (``W ~ (c - zero) * scale``), stored
row-major as ``u8 [N, K/2]``. Within every run of 8 consecutive codes ``e0..e7`` of a row (one
little-endian 32-bit word), nibble ``j`` of the word (bits ``4j..4j+3``) holds::

    nibble:  0   1   2   3   4   5   6   7
    code:    e0  e2  e4  e6  e1  e3  e5  e7

so that ``(word >> 4*i) & 0x000F000F`` yields the pair ``(e_{2i}, e_{2i+1})`` in the two 16-bit
halves: OR-ing ``0x64006400`` turns it into the half2 ``(1024 + e_{2i}, 1024 + e_{2i+1})`` with no
integer-to-float conversion (the trick of FasterTransformer's and Marlin's int4 kernels).
``K`` must be a multiple of 8.
"""

from __future__ import annotations

import numpy as np

# Position, within a word's 8 codes, of the code stored in nibble j.
_NIBBLE_TO_CODE = np.array([0, 2, 4, 6, 1, 3, 5, 7])


def pack(codes: np.ndarray) -> np.ndarray:
    """``u8 [N, K]`` codes in ``[0, 16)`` -> ``u8 [N, K/2]`` packed words (see module doc)."""
    n, k = codes.shape
    if k % 8:
        raise ValueError(f"int4 packing needs K to be a multiple of 8, got K={k}")
    if codes.size and (codes.min() < 0 or codes.max() > 15):
        raise ValueError("int4 codes must lie in [0, 16)")
    groups = codes.astype(np.uint32).reshape(n, k // 8, 8)[:, :, _NIBBLE_TO_CODE]
    words = np.zeros((n, k // 8), dtype=np.uint32)
    for j in range(8):
        words |= groups[:, :, j] << np.uint32(4 * j)
    return words.astype("<u4").view(np.uint8).reshape(n, k // 2)


def unpack(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack`: ``u8 [N, K/2]`` -> ``u8 [N, K]`` codes."""
    n, half_k = packed.shape
    words = np.ascontiguousarray(packed).view("<u4").reshape(n, half_k // 4)
    codes = np.empty((n, half_k // 4, 8), dtype=np.uint8)
    for j in range(8):
        codes[:, :, _NIBBLE_TO_CODE[j]] = (words >> np.uint32(4 * j)) & np.uint32(0xF)
    return codes.reshape(n, half_k * 2)


def dequantize(packed: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, group_size: int) -> np.ndarray:
    """f32 ``[N, K]`` weights from the packed codes, as every kernel must see them."""
    codes = unpack(packed).astype(np.float32)
    k = codes.shape[1]
    gs = group_size or k
    expand = np.arange(k) // gs
    zero = np.float32(8.0) if zeros is None else zeros.astype(np.float32)[:, expand]
    return (codes - zero) * scales.astype(np.float32)[:, expand]
