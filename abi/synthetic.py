"""Synthetic weights: a seeded spec in place of weight bytes, filled on the device at load.

For speed work on big shapes no trained weights are needed, only the real layout. A synthetic
artifact stores, for each weight, its dtype, shape and a ``Fill``; the plan's ``init`` graph
launches one ``fill_synthetic`` kernel per weight (``kernel_abi``), and the CPU executor runs the
same op with numpy, so both hold bit-identical weights. Element ``i`` of a tensor with seed ``s``
draws ``h = pcg(s ^ pcg(i))`` (``artifacts/rng.py``):

- ``BYTES`` (u8, packed int4 codes): ``h >> 24``;
- ``UNIFORM`` (f16): ``(2u - 1) * scale`` with ``u = (h >> 8) * 2**-24``;
- ``POSITIVE`` (f16, scales): ``(0.5 + u) * scale``;
- ``CONSTANT`` (f16, norm weights): ``scale``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class Fill(enum.IntEnum):
    BYTES = 0
    UNIFORM = 1
    POSITIVE = 2
    CONSTANT = 3


@dataclass(frozen=True)
class SyntheticTensor:
    dtype: str               # "uint8" or "float16"
    shape: tuple[int, ...]
    fill: Fill
    seed: int
    scale: float

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape), "fill": self.fill.name.lower(), "seed": self.seed,
                "scale": self.scale}

    @classmethod
    def from_json(cls, d: dict) -> "SyntheticTensor":
        return cls(d["dtype"], tuple(d["shape"]), Fill[d["fill"].upper()], d["seed"], d["scale"])


def _pcg(x: np.ndarray) -> np.ndarray:
    state = x * np.uint32(747796405) + np.uint32(2891336453)
    word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
    return (word >> np.uint32(22)) ^ word


def materialize(t: SyntheticTensor) -> np.ndarray:
    """The tensor's values, exactly as the ``fill_synthetic`` kernel writes them."""
    with np.errstate(over="ignore"):
        h = _pcg(np.uint32(t.seed & 0xFFFFFFFF) ^ _pcg(np.arange(t.size, dtype=np.uint32)))
    u = (h >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    scale = np.float32(t.scale)
    if t.fill is Fill.BYTES:
        values = (h >> np.uint32(24)).astype(np.uint8)
    elif t.fill is Fill.UNIFORM:
        values = ((np.float32(2) * u - np.float32(1)) * scale).astype(np.float16)
    elif t.fill is Fill.POSITIVE:
        values = ((np.float32(0.5) + u) * scale).astype(np.float16)
    else:
        values = np.full(t.size, scale, np.float16)
    return values.reshape(t.shape)
