"""Round-to-nearest: the grid (scale and zero-point per row or group) and the code rule, for int4 and int8.

Shared by ``quantize.py`` (plain round-to-nearest) and ``gptq.py`` (calibrated rounding, int4), so
both produce the same kind of ``(codes, scales, zeros)`` for the packed layout of
``abi/int4.py``: ``W[n, k] ~ (code - zero) * scale`` with f16 scales, ``zero = 8`` when
symmetric. ``int8_rtn`` is the same rule on 8 bits (codes ``[0, 256)``, ``zero = 128`` when
symmetric, ``abi/int8.py``), one scale per row: embedding tables and the int8 LM head.
"""

from __future__ import annotations

import numpy as np

from grokc.core.rowwise import rowwise


@rowwise
def quantize_rtn(w: np.ndarray, group_size: int, symmetric: bool,
                 bits: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Round-to-nearest ``bits``-bit (4 or 8) codes of ``w`` f32 ``[N, K]``: ``(codes u8 [N, K],
    scales f16 [N, G], zeros f16 [N, G] | None)``.

    The grid is ``rtn_grid``'s, the codes ``rtn_codes``' (on ``bits`` bits). A last group shorter
    than ``group_size`` is allowed.
    """
    n, k = w.shape
    gs = group_size or k
    scales, zeros = rtn_grid(w, group_size, symmetric, bits=bits)
    expand = np.arange(k) // gs                             # [K] group of each column
    codes = rtn_codes(w.astype(np.float32), scales[:, expand], None if zeros is None else zeros[:, expand], bits)
    return codes, scales.astype(np.float16), None if zeros is None else zeros.astype(np.float16)


def rtn_grid(w: np.ndarray, group_size: int, symmetric: bool,
             clip: float | np.ndarray = 1.0, bits: int = 4) -> tuple[np.ndarray, np.ndarray | None]:
    """The ``bits``-bit grid (int4 unless told) of ``w`` f32 ``[N, K]``: ``(scales [N, G], zeros [N, G] | None)``, f32 holding f16 values.

    Symmetric: ``scale = clip * absmax / 7`` (code 8 is zero). Asymmetric: the range
    ``[clip * min(w, 0), clip * max(w, 0)]`` in 15 steps, ``zero = round(-min / scale)``. Scales are
    rounded to f16 before the zero-points, so codes computed from them are optimal for the scales
    the kernel will see. ``clip`` (a scalar, or ``[N, 1]`` / ``[N, G]``) shrinks the range.
    ``bits = 8``: the same with 127 (code 128 is zero) and 255 steps (every zero-point in
    ``[0, 255]`` is exact in f16).
    """
    return grid_of_range(rtn_range(w, group_size, symmetric), symmetric, clip, bits)


def rtn_range(w: np.ndarray, group_size: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """What ``rtn_grid`` reads of ``w`` f32 ``[N, K]``, per row and group (f32 ``[N, G]``): symmetric,
    ``(absmax, None)``; asymmetric, ``(min(w, 0), max(w, 0))``."""
    n, k = w.shape
    gs = group_size or k
    g = -(-k // gs)
    padded = np.pad(w.astype(np.float32), ((0, 0), (0, g * gs - k)))
    blocks = padded.reshape(n, g, gs)                       # [N, G, gs]
    valid = (np.arange(g * gs) < k).reshape(g, gs)          # [G, gs]
    big = np.float32(np.finfo(np.float32).max)
    if symmetric:
        return np.where(valid, np.abs(blocks), 0).max(-1), None           # [N, G]
    return (np.minimum(np.where(valid, blocks, big).min(-1), 0), np.maximum(np.where(valid, blocks, -big).max(-1), 0))


def grid_of_range(span: tuple[np.ndarray, np.ndarray | None], symmetric: bool, clip: float | np.ndarray = 1.0,
                  bits: int = 4) -> tuple[np.ndarray, np.ndarray | None]:
    """``rtn_grid``'s ``(scales, zeros)`` from ``rtn_range``'s ``span`` (a clip search computes the span once)."""
    half, steps = _levels(bits)
    clip = np.float32(clip) if np.isscalar(clip) else np.asarray(clip, np.float32)
    if symmetric:
        return _f16_scale(clip * span[0] / (half - 1)), None
    lo, hi = clip * span[0], clip * span[1]
    scales = _f16_scale((hi - lo) / steps)
    return scales, np.clip(np.rint(-lo / scales), 0, steps).astype(np.float32)


def rtn_codes(w: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, bits: int = 4) -> np.ndarray:
    """u8 codes of ``w`` on a grid (``scales``/``zeros`` broadcast against ``w``): the nearest of
    ``(code - zero) * scale``, with ``zero = 8`` (128 for ``bits = 8``) when ``zeros`` is None (symmetric)."""
    half, steps = _levels(bits)
    if zeros is None:
        return (np.clip(np.rint(w / scales), -half, half - 1) + half).astype(np.uint8)
    return np.clip(np.rint(w / scales) + zeros, 0, steps).astype(np.uint8)


def int8_rtn(w: np.ndarray, symmetric: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Round-to-nearest int8 of ``w`` f32 ``[N, K]``, one scale per row: ``(codes u8 [N, K], scales f16
    [N, 1], zeros f16 [N, 1] | None)`` with ``W ~ (code - zero) * scale`` (``abi/int8.py``).
    Symmetric: ``scale = absmax / 127``, zero 128, codes in ``[1, 255]``; asymmetric: ``[min(w, 0),
    max(w, 0)]`` in 255 steps, the zero-point an integer in ``[0, 255]``."""
    return quantize_rtn(w, 0, symmetric, bits=8)


def _levels(bits: int) -> tuple[int, int]:
    """``(symmetric zero code, largest code)`` of a ``bits``-bit grid: (8, 15) for int4, (128, 255) for int8."""
    if bits not in (4, 8):
        raise ValueError(f"{bits}-bit codes: only 4 and 8 are stored")
    return 1 << (bits - 1), (1 << bits) - 1


def _f16_scale(s: np.ndarray) -> np.ndarray:
    """Scales as the kernel sees them (f16), never zero (an all-zero row keeps scale 1)."""
    s16 = s.astype(np.float16).astype(np.float32)
    return np.where(s16 > 0, s16, np.float32(1.0))


def int4_nearest(w: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, out: np.ndarray) -> np.ndarray:
    """The grid value ``(code - zero) * scale`` nearest each ``w`` (``rtn_codes``' rule), f32, written
    into ``out`` (same shape as ``w``) without temporaries: the inner loop of a scale search."""
    np.divide(w, scales, out=out)
    np.rint(out, out=out)
    if zeros is None:
        np.clip(out, -8, 7, out=out)
    else:
        out += zeros
        np.clip(out, 0, 15, out=out)
        out -= zeros
    out *= scales
    return out
