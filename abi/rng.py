"""The sampler's random numbers: a counter-based hash both executors compute bit-identically.

``uniform(seed, counter)`` is a pure function of two 32-bit integers (the slot's seed and how many
tokens it has produced), so a CUDA graph replay and the numpy executor draw the same number for
the same step without sharing any state. The hash is PCG-RXS-M-XS (O'Neill), as used for GPU
hashing by Jarzynski & Olano, "Hash Functions for GPU Rendering" (2020).
"""

from __future__ import annotations

import numpy as np

_M32 = 0xFFFFFFFF


def pcg_hash(x: int) -> int:
    state = (x * 747796405 + 2891336453) & _M32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _M32
    return ((word >> 22) ^ word) & _M32


def uniform(seed: int, counter: int) -> np.float32:
    """A float32 in [0, 1) with 24 random bits: ``(pcg(seed ^ pcg(counter)) >> 8) * 2**-24``."""
    h = pcg_hash((seed & _M32) ^ pcg_hash(counter & _M32))
    return np.float32(h >> 8) * np.float32(1.0 / 16777216.0)
