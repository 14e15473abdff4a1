"""The u8 code layout of a q8 embedding table (``kernel_abi``'s ``embedding`` op), beside ``int4.py``.

A table ``T [V, H]`` is stored as one code ``c in [0, 256)`` per byte, row-major ``u8 [V, H]``, with
``T ~ (c - zero) * scale``; ``zero`` is 128 (symmetric) unless a zero-point is given. Unsigned codes
with a midpoint, like int4's code 8, so the synthetic-weights byte fill and the ``u8`` dtype serve
both.
"""

from __future__ import annotations

import numpy as np

SYMMETRIC_ZERO = 128


def dequantize(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, group_size: int) -> np.ndarray:
    """f32 ``[N, K]`` from u8 codes ``[N, K]`` and f16 ``scales``/``zeros`` ``[N, G]``, as every kernel must see them."""
    k = codes.shape[1]
    expand = np.arange(k) // (group_size or k)
    zero = np.float32(SYMMETRIC_ZERO) if zeros is None else zeros.astype(np.float32)[:, expand]
    return (codes.astype(np.float32) - zero) * scales.astype(np.float32)[:, expand]
