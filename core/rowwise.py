"""Row-wise weight work on row-constant arrays: one row computed, the rest a broadcast view.

A ``--synthetic-weights`` build hands the passes zero-stride placeholders (every row the same memory;
``frontends/synthetic.py``): only their shapes and dtypes reach the artifact. Quantizing, casting
and concatenating them row by row would materialize gigabytes for a 1B shape (most of a 70 s
build). A function whose outputs are row-wise in its first argument gives, on a row-constant input,
the same values from its first row; ``rowwise`` computes that row and broadcasts it, and
``concat_rows`` keeps a concatenation of equal constant rows constant. Any other input takes the
ordinary path, so real weights are untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def row_constant(a: Any) -> bool:
    """``a`` has several rows that are the same memory (stride 0 along axis 0)."""
    return isinstance(a, np.ndarray) and a.ndim >= 1 and a.shape[0] > 1 and a.strides[0] == 0


def _broadcast(out: Any, rows: int) -> Any:
    if isinstance(out, tuple):
        return tuple(_broadcast(o, rows) for o in out)
    if isinstance(out, np.ndarray) and out.ndim >= 1 and out.shape[0] == 1:
        return np.broadcast_to(out, (rows, *out.shape[1:]))
    return out


def rowwise(fn: Callable) -> Callable:
    """``fn(a, ...)``, for a ``fn`` whose array outputs are ``[rows of a, ...]`` and computed row by row:
    on a row-constant ``a``, from its first row and broadcast (read-only views); else as is."""
    @functools.wraps(fn)
    def wrapped(a: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        if not row_constant(a):
            return fn(a, *args, **kwargs)
        return _broadcast(fn(a[:1], *args, **kwargs), a.shape[0])
    return wrapped


@rowwise
def as_f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16)


def concat_rows(parts: Sequence[np.ndarray]) -> np.ndarray:
    """``np.concatenate(parts)`` (axis 0), kept a broadcast when every part is the same constant row."""
    first = parts[0]
    if all(row_constant(p) and p.shape[1:] == first.shape[1:] and p.dtype == first.dtype
           and np.array_equal(p[0], first[0]) for p in parts):
        return np.broadcast_to(first[:1], (sum(p.shape[0] for p in parts), *first.shape[1:]))
    return np.concatenate(parts)


def zero_placeholder(a: Any) -> bool:
    """``a`` is one zero broadcast to its shape (every stride 0): a synthetic build's placeholder."""
    return isinstance(a, np.ndarray) and a.size > 0 and not any(a.strides) and a.reshape(-1)[0] == 0


def zeros_like_placeholders(parts: Sequence[np.ndarray], shape: tuple[int, ...], make: Callable[[], np.ndarray]
                            ) -> np.ndarray:
    """``make()``, or a zero placeholder of ``shape`` when every part is one (so restacking synthetic
    placeholders, zero padding included, costs no memory)."""
    if all(zero_placeholder(p) for p in parts):
        return np.broadcast_to(np.zeros((), parts[0].dtype), shape)
    return make()
