"""A rope config that reproduces the frequencies a graph rotates by (``core/rope.py`` computes them back).

The graph gives one frequency per pair (``checks.rope_freqs``); grokc needs the ``RopeConfig`` whose
``inv_freq`` they are, because the RoPE-table pass and the kernels compute cos/sin from it.
``log inv_freq[i]`` is a line in ``i`` for plain rope (``theta ** (-2i / D)``) and for linear scaling
(the same divided by ``factor``), so a least-squares line gives ``theta`` and ``factor``; the config
is accepted only if its own frequencies match the graph's to 1e-4 relative, and of those the shortest theta and factor (10000.0, not 9999.99961)
that come within 1e-6.
"""

from __future__ import annotations

import numpy as np

from grokc.compiler.frontends.graph.emit import RopeFreqs
from grokc.core import rope as rope_math
from grokc.core.config import RopeConfig, RopeType
from grokc.core.errors import UnsupportedModel

_EXACT = 1e-6   # as close as f32 frequencies computed from a round theta come
_REL = 1e-4     # the most a fitted config may be off


def fit_rope(freqs: RopeFreqs, head_dim: int, where: str) -> RopeConfig:
    f = np.asarray(freqs.inv_freq, np.float64)
    if abs(freqs.mscale - 1) > 1e-4:
        raise UnsupportedModel(f"{where}: the rotary tables are scaled by {freqs.mscale:.6g} (yarn-style attention "
                               "scaling); grokc reads graphs with plain, or linearly scaled, rotary embeddings")
    slope, intercept = np.polyfit(np.arange(len(f)), np.log(f), 1)
    theta, factor = float(np.exp(-slope * head_dim / 2)), float(np.exp(-intercept))
    best, best_err = None, np.inf
    for digits in range(1, 13):   # the shortest theta and factor that reproduce the frequencies
        rope = _config(_round(theta, digits), _round(factor, digits))
        err = float(np.abs(rope_math.inv_freq(rope, head_dim)[0] / f - 1).max())
        if err < best_err:
            best, best_err = rope, err
        if err < _EXACT:
            return rope
    if best_err > _REL:
        raise UnsupportedModel(f"{where}: the rotary frequencies ({f[0]:.4g} .. {f[-1]:.4g}) follow no base "
                               "theta ** (-2i / head_dim), plain or linearly scaled; other rope scalings (llama3, "
                               "yarn) are not read from graphs")
    return best


def _config(theta: float, factor: float) -> RopeConfig:
    if abs(factor - 1) < 1e-9:
        return RopeConfig(theta=theta)
    return RopeConfig(theta=theta, type=RopeType.LINEAR, factor=factor)


def _round(x: float, digits: int) -> float:
    return float(f"{x:.{digits}g}")
