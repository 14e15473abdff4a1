"""Independent numpy oracles of grokc's quantization numerics: plain loops over rows and groups,
written apart from ``quant/`` so that a test comparing the two can fail."""

import numpy as np


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


def int8_reference(w: np.ndarray, symmetric: bool = True) -> np.ndarray:
    """Dequantized int8, one row at a time. Symmetric: scale = f16(absmax / 127), codes rint(w / scale).
    Asymmetric: the row's range [min(w, 0), max(w, 0)] in 255 steps of f16(range / 255), zero-point
    rint(-min / scale) in [0, 255], codes rint(w / scale) + zero in [0, 255]."""
    out = np.empty_like(w)
    for r in range(w.shape[0]):
        row = w[r].astype(np.float64)
        if symmetric:
            s = np.float32(np.float16(np.abs(row).max() / 127)) or np.float32(1)
            out[r] = np.clip(np.rint(row / s), -127, 127) * s
        else:
            lo, hi = min(row.min(), 0.0), max(row.max(), 0.0)
            s = np.float32(np.float16((hi - lo) / 255)) or np.float32(1)
            z = np.clip(np.rint(-lo / s), 0, 255)
            out[r] = (np.clip(np.rint(row / s) + z, 0, 255) - z) * s
    return out
