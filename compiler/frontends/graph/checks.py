"""The numeric half of the checks: side values computed on probe inputs.

A rule's pattern says which values feed an attention's mask or a rotary embedding's cos/sin; what
they hold is checked by running the part of the graph that computes them (``OpGraph.evaluate``)
on concrete inputs, one sequence of ``S`` new tokens after ``P`` cached ones, so any way of
building them is accepted as long as it computes the right thing:

- ``check_causal``: the mask lets token ``i`` (at position ``P + i``) see exactly the keys
  ``0 .. P + i`` (boolean, or additive with 0 and a large negative value);
- ``rope_freqs``: cos/sin at positions 0 .. 4096 are ``mscale * cos(p * f)`` and ``mscale *
  sin(p * f)`` for one frequency ``f`` per pair, recovered from the values themselves (rotate-half
  tables repeat the frequencies in both halves);
- ``check_lengths``: GroupQueryAttention's ``seqlens_k`` and ``total_sequence_length`` are
  ``P + S - 1`` and ``P + S``.
"""

from __future__ import annotations

import numpy as np

from grokc.compiler.frontends.graph.emit import RopeFreqs
from grokc.compiler.frontends.graph.opgraph import OpNode

ROPE_POSITIONS = 4097         # positions 0 .. 4096 probed for the rotary tables
_REFINE = (8, 64, 512, 4096)  # positions that sharpen the frequency estimate
_ANGLE_TOL = 2e-3             # the source computes angles in f32: 4096 * 2^-24 of error, and some slack
_MASKED = -1e4                # an additive mask entry at or below this counts as masked
_PROBES = ((5, 3), (1, 4), (4, 0))   # (S, P) for the mask and length checks


def check_causal(cv, node: OpNode, mask: str, cached: bool) -> None:
    """Raise unless ``mask`` (broadcastable to ``[B, heads, S, T]``) is the causal mask."""
    for seq, past in _PROBES:
        if not cached and past:
            continue
        m = np.asarray(cv.probe([mask], seq, past)[0])
        t = seq + past
        if m.ndim < 2 or m.shape[-2:] not in ((seq, t), (1, t)) or m.size != m.shape[-2] * m.shape[-1] * _lead(m):
            raise cv.refuse(node, f"has an attention mask of shape {list(m.shape)} for {seq} tokens after {past}; "
                                  "grokc expects a causal mask [batch, 1, seq, past + seq]")
        rows = m.reshape(-1, m.shape[-2], t)
        allowed = rows if m.dtype == bool else rows > _MASKED
        if m.dtype != bool and not np.all((rows == 0) | (rows <= _MASKED)):
            raise cv.refuse(node, "adds an attention mask holding values other than 0 and large negatives; grokc "
                                  "compiles causal attention only")
        want = np.arange(t)[None, :] <= past + np.arange(seq)[:, None]
        if not np.all(allowed == np.broadcast_to(want, allowed.shape)):
            raise cv.refuse(node, f"masks attention differently from causal attention ({seq} tokens after {past} "
                                  "cached, all-ones attention_mask); grokc compiles causal attention only")


def _lead(m: np.ndarray) -> int:
    return int(np.prod(m.shape[:-2])) if m.ndim > 2 else 1


def rope_freqs(cv, node: OpNode, cos: np.ndarray, sin: np.ndarray, head_dim: int, duplicated: bool) -> RopeFreqs:
    """The frequencies of cos/sin tables ``[positions 0 .. N-1, width]`` (``duplicated``: rotate-half
    tables of width ``head_dim`` with both halves equal; else width ``head_dim / 2``)."""
    half = head_dim // 2
    c, s = (np.asarray(a, np.float64).reshape(-1, a.shape[-1]) for a in (cos, sin))
    if c.shape != s.shape or c.shape[1] != (head_dim if duplicated else half) or c.shape[0] < 2:
        raise cv.refuse(node, f"reads rotary tables of shape {list(c.shape)}; grokc expects [positions, "
                              f"{head_dim if duplicated else half}] for head_dim {head_dim}")
    if duplicated:
        if not (np.array_equal(c[:, :half], c[:, half:]) and np.array_equal(s[:, :half], s[:, half:])):
            raise cv.refuse(node, "applies rotary tables whose two halves differ; grokc reads the rotate-half "
                                  "(non-interleaved) rotary embedding")
        c, s = c[:, :half], s[:, :half]
    mscale = float(np.hypot(c[0], s[0]).mean())
    f = np.arctan2(s[1], c[1])
    for p in (p for p in _REFINE if p < len(c)):
        angle = np.arctan2(s[p], c[p])
        f = (angle + 2 * np.pi * np.round((p * f - angle) / (2 * np.pi))) / p
    p = np.arange(len(c))[:, None]
    err = max(np.abs(c - mscale * np.cos(p * f)).max(), np.abs(s - mscale * np.sin(p * f)).max())
    if err > _ANGLE_TOL * max(mscale, 1.0) or not np.all(f > 0):
        raise cv.refuse(node, f"applies cos/sin tables that are not p * inv_freq rotations of the positions "
                              f"(off by {err:.3g}); grokc reads rotary embeddings of the token positions")
    return RopeFreqs(f, mscale)


def rope_positions(cv) -> tuple[int, int, np.ndarray | None]:
    """``(seq, past, positions)`` of the probe that yields cos/sin at positions 0 .. 4096."""
    positions = np.arange(ROPE_POSITIONS)
    return ROPE_POSITIONS, 0, positions if cv.inputs.positions else None


def check_lengths(cv, node: OpNode, seqlens: str, total: str) -> None:
    """Raise unless GroupQueryAttention's length inputs are ``past + seq - 1`` and ``past + seq``."""
    for seq, past in _PROBES:
        k, t = (np.asarray(a).reshape(-1) for a in cv.probe([seqlens, total], seq, past))
        if k.tolist() != [past + seq - 1] or t.tolist() != [past + seq]:
            raise cv.refuse(node, f"gets seqlens_k {k.tolist()} and total_sequence_length {t.tolist()} for {seq} "
                                  f"tokens after {past}; grokc expects [{past + seq - 1}] and [{past + seq}] "
                                  "(the attention mask summed, minus one)")
