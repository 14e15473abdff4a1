"""Rotary-embedding rules: rotate-half written out, and the one-op forms.

- rotate-half: ``x * cos + cat(-x[..., d/2:], x[..., :d/2]) * sin`` on a heads view (Slice, Neg,
  Concat, Mul, Add), as Hugging Face's ``apply_rotary_pos_emb`` exports;
- ``RotaryEmbedding`` (ONNX opset 23) with ``interleaved=0`` over the whole head, on heads
  ``[B, h, S, d]`` with cos/sin ``[B, S, d/2]``.

Checks: the slices split the head in halves; cos and sin are side values that, computed on the
positions 0 .. 4096 (``checks.rope_freqs``), rotate position ``p`` by ``p * inv_freq``. Rewrite:
``ROPE(x)`` at the graph's positions; the frequencies go with the node (``RawIR.rope``) until
``canonical.py`` fits one rope config to them.
"""

from __future__ import annotations

from grokc.compiler.frontends.graph.checks import rope_freqs, rope_positions
from grokc.compiler.frontends.graph.convert import Conversion, Rule
from grokc.compiler.frontends.graph.emit import RopeFreqs
from grokc.compiler.frontends.graph.kinds import HEADS, Act
from grokc.compiler.frontends.graph.opgraph import OpNode
from grokc.compiler.frontends.graph.pattern import Match, Op, Side, Var
from grokc.core.ir import OpKind, RopeAttrs

X = Var("x", Act)
_LAST = (-1, 3)   # the head's axis of [B, h, S, d]

ROTATE_HALF = Op(
    "Add",
    Op("Mul", X, Side("cos"), commute=True),
    Op("Mul", Op("Concat", Op("Neg", Op("Slice", X, name="hi")), Op("Slice", X, name="lo"),
                 where=lambda n: n.attrs.get("axis") in _LAST), Side("sin"), commute=True),
    name="root", commute=True)
ROTARY_OP = Op("RotaryEmbedding", X, Side("cos"), Side("sin"), name="root")


def _heads(cv: Conversion, m: Match) -> Act | None:
    x = cv.act(m.values["x"])
    return x if x.view == HEADS and x.repeat == 1 and not x.present else None


def _rotate_half_check(m: Match, cv: Conversion) -> bool:
    x = _heads(cv, m)
    if x is None:
        return False
    d = x.head_dim
    lo, hi = m.nodes["lo"].attrs, m.nodes["hi"].attrs
    ok = (tuple(lo.get("starts", ())) == (0,) and tuple(lo.get("ends") or (0,))[0] == d // 2
          and tuple(hi.get("starts", ())) == (d // 2,) and tuple(hi.get("ends") or (0,))[0] >= d
          and all(tuple(a.get("axes") or ()) in ((-1,), (3,)) and tuple(a.get("steps") or (1,)) == (1,) for a in (lo, hi)))
    return ok and _freqs(cv, m) is not None


def _rotary_op_check(m: Match, cv: Conversion) -> bool:
    x, root = _heads(cv, m), m.nodes["root"]
    if x is None:
        return False
    a = root.attrs
    if a.get("interleaved", 0) or a.get("rotary_embedding_dim", 0) not in (0, x.head_dim) or len(root.inputs) > 3:
        raise cv.refuse(root, "is an interleaved, partial or position-indexed RotaryEmbedding; grokc reads the "
                              "rotate-half embedding of whole heads with gathered cos/sin")
    return _freqs(cv, m) is not None


def _freqs(cv: Conversion, m: Match) -> RopeFreqs:
    """The frequencies of the match's cos/sin (raises when they are not rotations of the positions)."""
    x, root = cv.act(m.values["x"]), m.nodes["root"]
    cos, sin = cv.probe([m.values["cos"], m.values["sin"]], *rope_positions(cv))
    return rope_freqs(cv, root, cos, sin, x.head_dim, duplicated=root.op != "RotaryEmbedding")


def emit_rope(cv: Conversion, x: Act, freqs: RopeFreqs, source: OpNode, suffix: str = "") -> Act:
    """``ROPE(x)`` of a heads view at the graph's positions; returns the rotated heads' kind."""
    out = cv.ir.add(OpKind.ROPE, {"x": x.tensor, "positions": "positions", "inv_freq": "rope_inv_freq"},
                    x.channels, source, RopeAttrs(head_dim=x.head_dim, n_heads=x.heads), suffix)
    cv.ir.rope[out] = freqs
    return x.but(tensor=out)


def _rewrite(m: Match, cv: Conversion) -> None:
    root = m.nodes["root"]
    cv.kinds[root.outputs[0]] = emit_rope(cv, cv.act(m.values["x"]), _freqs(cv, m), root)


RULES = [
    Rule("rotary embedding (rotate-half)", ROTATE_HALF, _rotate_half_check, _rewrite),
    Rule("rotary embedding (one op)", ROTARY_OP, _rotary_op_check, _rewrite),
]
