"""Rotary-embedding frequencies, computed once in float64 from the model's RoPE config.

Both the torch model (compiler/models/transformer.py) and the RoPE-table pass read these, so the
scaling rules (plain, linear, llama3, yarn, longrope) exist in one place. They follow Hugging
Face's ``modeling_rope_utils`` (``_compute_default_rope_parameters`` and its linear, llama3, yarn
and longrope siblings).

A model has one RoPE, or two when its local (sliding-window) layers have their own
(``ModelConfig.rope_local``, Gemma 3): ``ropes(cfg)`` names each by the parameter holding its
frequencies (``INV_FREQ``, ``INV_FREQ_LOCAL``); the RoPE-table pass stores each one's table under
``TABLES[param]``.

longrope switches per position: positions below ``original_max_position_embeddings`` rotate by the
short factors, the others by the long ones (``angles``). transformers switches per forward call
instead (all positions of a call whose longest position reaches the threshold take the long
factors), which is the same for every token decoded one at a time with a KV cache and for any
prompt prefilled at once below the threshold; a prompt longer than the threshold prefilled at once
differs (transformers rotates its early positions by the long factors too).
"""

from __future__ import annotations

import math

import numpy as np

from grokc.core.config import ModelConfig, RopeConfig, RopeType

INV_FREQ = "rope_inv_freq"              # the model's (global layers') frequencies
INV_FREQ_LOCAL = "rope_inv_freq_local"  # the local layers' own, when they have one
TABLES = {INV_FREQ: "rope_table", INV_FREQ_LOCAL: "rope_table_local"}


def ropes(cfg: ModelConfig) -> dict[str, RopeConfig]:
    """Each RoPE of the model by the name of its frequency parameter."""
    return {INV_FREQ: cfg.rope, **({INV_FREQ_LOCAL: cfg.rope_local} if cfg.rope_local is not None else {})}


def rope_of_layer(cfg: ModelConfig, layer: int) -> str:
    """The frequency parameter ``layer`` rotates by."""
    return INV_FREQ_LOCAL if cfg.rope_local is not None and layer in cfg.local_layers else INV_FREQ


def inv_freq(rope: RopeConfig, head_dim: int) -> tuple[np.ndarray, float]:
    """``(inv_freq f64 [head_dim/2], mscale)``: angle of pair ``i`` at position ``p`` is
    ``p * inv_freq[i]``; cos and sin are multiplied by ``mscale`` (1 except for yarn and longrope).
    For longrope these are the long factors' frequencies (``short_inv_freq`` has the others)."""
    base = 1.0 / rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if rope.type is RopeType.DEFAULT:
        return base, 1.0
    if rope.type is RopeType.LINEAR:
        return base / rope.factor, 1.0
    if rope.type is RopeType.LLAMA3:
        return _llama3(base, rope), 1.0
    if rope.type is RopeType.YARN:
        return _yarn(rope, head_dim)
    if rope.type is RopeType.LONGROPE:
        return base / np.asarray(rope.long_factor, np.float64), float(rope.attention_factor)
    raise AssertionError(rope.type)


def short_inv_freq(rope: RopeConfig, head_dim: int) -> tuple[np.ndarray, int] | None:
    """longrope: ``(inv_freq f64 [head_dim/2] of the short factors, the first position past them)``;
    None for every other type (one set of frequencies for all positions)."""
    if rope.type is not RopeType.LONGROPE:
        return None
    base = 1.0 / rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    return base / np.asarray(rope.short_factor, np.float64), rope.original_max_position_embeddings


def angles(rope: RopeConfig, head_dim: int, positions: np.ndarray) -> np.ndarray:
    """f64 ``[T, head_dim/2]``: the rotation angle of each pair at each of ``positions [T]``."""
    freqs = inv_freq(rope, head_dim)[0]
    pos = np.asarray(positions, np.float64)[:, None]
    short = short_inv_freq(rope, head_dim)
    if short is None:
        return pos * freqs[None, :]
    return np.where(pos < short[1], pos * short[0][None, :], pos * freqs[None, :])


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
    a = angles(rope, head_dim, np.arange(length))
    mscale = inv_freq(rope, head_dim)[1]
    return (np.stack([np.cos(a), np.sin(a)], axis=-1) * mscale).astype(np.float32)
