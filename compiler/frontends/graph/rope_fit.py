"""A rope config that reproduces the frequencies a graph rotates by (``core/rope.py`` computes them back).

The graph gives one frequency per pair (``checks.rope_freqs``); grokc needs the ``RopeConfig`` whose
``inv_freq`` they are, because the RoPE-table pass and the kernels compute cos/sin from it. Two
fits are tried, each accepted only if ``core/rope.py``'s frequencies of the config it gives match
the graph's to 1e-4 relative, preferring the shortest numbers (10000.0, not 9999.99961) that come
within 1e-6:

- plain and linear: ``log inv_freq[i]`` is a line in ``i`` (``theta ** (-2i / D)``, divided by
  ``factor`` for linear scaling), so a least-squares line gives ``theta`` and ``factor``;
- llama3: the high-frequency pairs are plain, the low-frequency ones divided by ``factor``, and in
  between the ratio to plain moves from ``1 / factor`` to 1 along a ramp linear in the inverse
  wavelength (``core/rope.py``'s ``_llama3``). ``theta`` comes from the first (or last) two pairs,
  ``factor`` from the last pair, the ramp's two ends (``low_freq_factor`` and ``high_freq_factor``
  over ``original_max_position_embeddings``) from a line through the pairs on it. Only those two
  ratios are in the frequencies, so the config is written with ``low_freq_factor`` 1 (Llama 3.x's);
  with fewer than two pairs on the ramp, ``high_freq_factor`` is tried at 4 (Llama 3.x's and the
  default), 2, 8 and 3 where the other pairs stay off the ramp, the context being the one the ramp
  pair then gives (an integer), or a power of two between the plain and the scaled pairs.

Frequencies that fit neither (yarn's, longrope's, or made up) are refused naming the rotary node.
"""

from __future__ import annotations

import math

import numpy as np

from grokc.compiler.frontends.graph.emit import RopeFreqs
from grokc.core import rope as rope_math
from grokc.core.config import RopeConfig, RopeType
from grokc.core.errors import UnsupportedModel

_EXACT = 1e-6   # as close as f32 frequencies computed from round numbers come
_REL = 1e-4     # the most a fitted config may be off
_RAMP = 1e-3    # a pair whose ramp value is within this of 0 or 1 is plain or fully scaled
_HIGH = 4.0     # high_freq_factor when the frequencies cannot tell (Llama 3.x's, RopeConfig's default)


def fit_rope(freqs: RopeFreqs, head_dim: int, where: str) -> RopeConfig:
    """The rope config of ``freqs``; ``where`` names the rotary node for the refusal."""
    f = np.asarray(freqs.inv_freq, np.float64)
    if abs(freqs.mscale - 1) > 1e-4:
        raise UnsupportedModel(f"{where} scales its rotary tables by {freqs.mscale:.6g} (yarn-style attention "
                               "scaling); grokc reads graphs with plain, linearly scaled or llama3 rotary embeddings")
    best, best_err = None, np.inf
    for fit in [lambda d: _line(f, head_dim, d), *_llama3_fits(f, head_dim)]:   # the first exact fit wins
        rope, err = _shortest(f, head_dim, fit)
        if err < best_err:
            best, best_err = rope, err
        if err < _EXACT:
            return rope
    if best_err > _REL:
        raise UnsupportedModel(f"{where} rotates by frequencies ({f[0]:.4g} .. {f[-1]:.4g}) that follow no base "
                               "theta ** (-2i / head_dim), plain, linearly scaled or llama3-scaled; other rope "
                               "scalings (yarn, longrope) are not read from graphs")
    return best


def _shortest(f: np.ndarray, head_dim: int, config_of) -> tuple[RopeConfig | None, float]:
    """``(config, relative error)`` of the first of ``config_of(digits)``, digits 1 .. 12, within
    ``_EXACT`` of ``f``, else of the closest one."""
    best, best_err = None, np.inf
    for digits in range(1, 13):
        try:
            rope = config_of(digits)
        except ValueError:   # rounded into an invalid config (low >= high, a context of 0)
            continue
        err = float(np.abs(rope_math.inv_freq(rope, head_dim)[0] / f - 1).max())
        if err < best_err:
            best, best_err = rope, err
        if err < _EXACT:
            break
    return best, best_err


def _line(f: np.ndarray, head_dim: int, digits: int) -> RopeConfig:
    slope, intercept = np.polyfit(np.arange(len(f)), np.log(f), 1)
    theta, factor = _round(float(np.exp(-slope * head_dim / 2)), digits), _round(float(np.exp(-intercept)), digits)
    if abs(factor - 1) < 1e-9:
        return RopeConfig(theta=theta)
    return RopeConfig(theta=theta, type=RopeType.LINEAR, factor=factor)


def _llama3_fits(f: np.ndarray, head_dim: int) -> list:
    """A config maker (digits -> RopeConfig) per way of reading theta (from the first two pairs, plain;
    from the last two, scaled) and per ramp that fits; none when the frequencies are not scaled down."""
    if len(f) < 3:
        return []
    fits = []
    for a, b in ((0, 1), (len(f) - 2, len(f) - 1)):
        theta = float((f[a] / f[b]) ** (head_dim / 2))
        if not theta > 1:
            continue
        base = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        ratio = f / base
        factor = float(1 / ratio[-1])
        if factor > 1 + _RAMP:
            fits += [lambda d, t=theta, k=factor, c=ctx, h=high: RopeConfig(
                theta=_round(t, d), type=RopeType.LLAMA3, factor=_round(k, d), low_freq_factor=1.0,
                high_freq_factor=_round(h, d), original_max_position_embeddings=c)
                for ctx, high in _ramps(ratio, factor, base / (2 * math.pi))]
    return fits


def _ramps(ratio: np.ndarray, factor: float, x: np.ndarray) -> list[tuple[int, float]]:
    """``(original_max_position_embeddings, high_freq_factor)`` pairs, ``low_freq_factor`` 1, of the ramp
    ``s = (ratio - 1/factor) / (1 - 1/factor) = (ctx * x - 1) / (high - 1)`` (``x``: inverse wavelengths)."""
    s = (ratio - 1 / factor) / (1 - 1 / factor)
    on = (s > _RAMP) & (s < 1 - _RAMP)
    plain, scaled = x[s >= 1 - _RAMP], x[s <= _RAMP]
    if on.sum() >= 2:
        slope, intercept = np.polyfit(x[on], s[on], 1)
        ctx = round(-slope / intercept) if intercept < 0 < slope else 0
        return [(ctx, 1 + ctx / slope)] if ctx >= 1 else []
    if not len(scaled):
        return []
    if on.sum() == 1:   # ctx = (s (high - 1) + 1) / x of the ramp pair, the others off the ramp
        s1, x1 = float(s[on][0]), float(x[on][0])
        bounds = [1 + (x1 / scaled.max() - 1) / s1]            # the scaled pairs stay below the ramp
        r = plain.min() / x1 if len(plain) else np.inf
        if r * s1 < 1:                                          # and the plain ones above it
            bounds.append(r * (1 - s1) / (1 - r * s1))
        ctxs = [(round((s1 * (high - 1) + 1) / x1), high) for high in _highs(min(bounds))]
        return ctxs + [(c, 1 + (c * x1 - 1) / s1) for c, _ in ctxs]   # round numbers first, then the ramp's exact end
    if not len(plain):
        return []
    out = []
    for high in _highs(plain.min() / scaled.max()):   # ctx between high / (plain x) and 1 / (scaled x)
        lo, hi = high / plain.min(), 1 / scaled.max()
        power = 2 ** math.floor(math.log2(hi))
        out.append((int(power) if power > lo else max(1, round((lo + hi) / 2)), high))
    return out


def _highs(bound: float) -> list[float]:
    """high_freq_factor values below ``bound`` to try: Llama 3.x's 4, then 2, 8, 3, else halfway to 1."""
    return [h for h in (_HIGH, 2.0, 8.0, 3.0) if h < bound] or ([(1 + bound) / 2] if bound > 1 else [])


def _round(x: float, digits: int) -> float:
    return float(f"{x:.{digits}g}")
