"""The statistics a calibrated recipe needs: the second moment of every linear's inputs, and the
stored forms sequential calibration already computed from them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from grokc.core.errors import BuildOptionError


@dataclass(frozen=True)
class Calibration:
    """What GPTQ needs from calibration text, measured by the driver (``compiler/calibrate.py``).

    ``hessians`` maps ``names.input_key(weight)`` (``names.LM_HEAD`` for the LM head) to the f32
    ``[K, K]`` mean of ``x^T x`` over the calibration tokens of that linear's input ``x``;
    ``info`` says how it was measured (text, samples, tokens, seed) and goes into the manifest.
    ``quantized`` maps ``weight_key(w, recipe, h)`` to ``quant.weights.quantize_weight``'s result
    for the weights sequential calibration already quantized (q/k/v and gate/up row-concatenated,
    as the fusion passes store them), so the quantize pass need not run GPTQ on them again; a
    weight whose bytes, recipe or statistics differ misses and is quantized afresh.
    """

    hessians: Mapping[str, np.ndarray]
    info: Mapping[str, Any] = field(default_factory=dict)
    quantized: Mapping[str, tuple] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, h in self.hessians.items():
            if h.ndim != 2 or h.shape[0] != h.shape[1]:
                raise BuildOptionError(f"calibration statistics for {key} have shape {h.shape}; they must be square")
        object.__setattr__(self, "hessians", MappingProxyType(dict(self.hessians)))
        object.__setattr__(self, "info", MappingProxyType(dict(self.info)))
        object.__setattr__(self, "quantized", MappingProxyType(dict(self.quantized)))

    def hessian(self, key: str, k: int) -> np.ndarray:
        if key not in self.hessians:
            raise BuildOptionError(f"the calibration statistics lack {key}; recalibrate with this model")
        h = self.hessians[key]
        if h.shape != (k, k):
            raise BuildOptionError(f"the calibration statistics for {key} are {h.shape[0]}-wide but the "
                                   f"weight has {k} inputs; recalibrate with this model")
        return h


def weight_key(w: np.ndarray, recipe_json: Mapping[str, Any], hessian: np.ndarray) -> str:
    """A digest of one weight's bytes, shape and dtype, the recipe that quantizes it and its statistics."""
    d = hashlib.sha256(repr((w.shape, str(w.dtype), hessian.shape, sorted(recipe_json.items()))).encode())
    d.update(np.ascontiguousarray(w).data)
    d.update(np.ascontiguousarray(hessian).data)
    return d.hexdigest()
