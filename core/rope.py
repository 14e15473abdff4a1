"""Rotary-embedding frequencies, computed once in float64 from the model's RoPE config.

Both the torch model (compiler/models/llama.py) and the RoPE-table pass read these, so the
scaling rules (plain, linear, llama3, yarn) exist in one place. They follow Hugging Face's
``modeling_rope_utils`` (``_compute_default_rope_parameters`` and its linear, llama3 and yarn
siblings).
"""

from __future__ import annotations

import math

import numpy as np

from grokc.core.config import RopeConfig, RopeType


def inv_freq(rope: RopeConfig, head_dim: int) -> tuple[np.ndarray, float]:
    """``(inv_freq f64 [head_dim/2], mscale)``: angle of pair ``i`` at position ``p`` is
    ``p * inv_freq[i]``; cos and sin are multiplied by ``mscale`` (1 except for yarn)."""
    base = 1.0 / rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if rope.type is RopeType.DEFAULT:
        return base, 1.0
    if rope.type is RopeType.LINEAR:
        return base / rope.factor, 1.0
    if rope.type is RopeType.LLAMA3:
        return _llama3(base, rope), 1.0
    if rope.type is RopeType.YARN:
        return _yarn(rope, head_dim)
    raise AssertionError(rope.type)


def _llama3(base: np.ndarray, rope: RopeConfig) -> np.ndarray:
    old_ctx = rope.original_max_position_embeddings
    low_wavelen = old_ctx / rope.low_freq_factor
    high_wavelen = old_ctx / rope.high_freq_factor
    wavelen = 2 * math.pi / base
    scaled = np.where(wavelen > low_wavelen, base / rope.factor, base)
    smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def _yarn(rope: RopeConfig, head_dim: int) -> tuple[np.ndarray, float]:
    mscale = rope.attention_factor if rope.attention_factor is not None else (
        0.1 * math.log(rope.factor) + 1.0 if rope.factor > 1 else 1.0
    )
    old_ctx = rope.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low = max(math.floor(correction_dim(rope.beta_fast)), 0)
    high = min(math.ceil(correction_dim(rope.beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1.0 / rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    interpolation = extrapolation / rope.factor
    extrapolation_weight = 1 - ramp
    return interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight, mscale


def table(rope: RopeConfig, head_dim: int, length: int) -> np.ndarray:
    """f32 ``[length, head_dim/2, 2]`` of ``(cos, sin) * mscale``, computed in float64."""
    freqs, mscale = inv_freq(rope, head_dim)
    angles = np.arange(length, dtype=np.float64)[:, None] * freqs[None, :]
    return (np.stack([np.cos(angles), np.sin(angles)], axis=-1) * mscale).astype(np.float32)
