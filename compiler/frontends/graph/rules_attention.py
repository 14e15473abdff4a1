"""Attention rules: causal grouped-query attention in the forms the exporters write.

- written out (torch's sdpa and eager exports): ``MatMul(Softmax(MatMul(q, k^T) * scale + mask), v)``
  with the scale anywhere on the way (on q and on k, as sdpa splits it, or on the scores), an
  optional ``Where(IsNaN(p), 0, p)`` after the softmax and casts around it;
- ``Attention`` (ONNX opset 23) and torch's ``scaled_dot_product_attention`` (``SDPA``), with a mask
  input or ``is_causal``.

q is a rotated heads view; k (transposed for the MatMul form) and v are heads views, both behind the
key/value-cache Concat or neither, and repeated for GQA or not (``kinds.py``). Checks: the heads
agree, the scale is ``head_dim ** -0.5``, the mask is causal (``checks.check_causal``). Rewrite: one
``ATTENTION(q, k, v)``; the cache outputs it accounts for become served graph outputs.
"""

from __future__ import annotations

import numpy as np

from grokc.compiler.frontends.graph.checks import check_causal
from grokc.compiler.frontends.graph.convert import Conversion, Rule
from grokc.compiler.frontends.graph.kinds import HEADS, KT, Act
from grokc.compiler.frontends.graph.opgraph import OpNode
from grokc.compiler.frontends.graph.pattern import Const, Either, Match, Op, Side, Var, opt, scalar
from grokc.core.ir import AttentionAttrs, OpKind

Q, K, V = Var("q", Act), Var("k", Act), Var("v", Act)
_SCALAR = lambda a: a.size == 1  # noqa: E731

_SCORES = Op("MatMul", opt("Mul", Q, Const("s1", _SCALAR), commute=True),
             opt("Mul", K, Const("s2", _SCALAR), commute=True))
_SCALED = Either(Op("Mul", _SCORES, Const("s3", _SCALAR), commute=True), Op("Div", _SCORES, Const("d3", _SCALAR)),
                 _SCORES)
_PROBS = Op("Softmax", opt("Cast", opt("Add", _SCALED, Side("mask"), commute=True)),
            where=lambda n: n.attrs.get("axis", -1) in (-1, 3))
WRITTEN_OUT = Op("MatMul", opt("Cast", Either(Op("Where", Op("IsNaN", _PROBS), Const(None, scalar(0.0)), _PROBS), _PROBS)),
                 V, name="root")
ONE_OP = Op(("Attention", "SDPA"), Q, K, V, name="root")


def attention_scale(cv: Conversion, node: OpNode, scale: float, head_dim: int) -> float:
    if abs(scale * head_dim ** 0.5 - 1) > 1e-5:
        raise cv.refuse(node, f"scales attention scores by {scale:.6g}; grokc's Llama family scales by "
                              f"head_dim ** -0.5 = {head_dim ** -0.5:.6g}")
    return head_dim ** -0.5


def emit_attention(cv: Conversion, node: OpNode, q: Act, k: Act, v: Act, scale: float, mask: str | None,
                   causal: bool, suffix: str = "") -> Act:
    """``ATTENTION(q, k, v)`` after the checks every form shares; returns the output heads' kind."""
    if q.view != HEADS or q.present or q.repeat != 1 or v.view != HEADS:
        raise cv.refuse(node, "attends with a query or value that is not a heads view [batch, heads, seq, head_dim] "
                              "of a projection")
    if (k.present is None) != (v.present is None) or k.repeat != v.repeat or k.kv_heads != v.kv_heads \
            or {q.head_dim, k.head_dim, v.head_dim} != {q.head_dim} or q.heads % k.kv_heads or k.heads not in (
                q.heads, k.kv_heads):
        raise cv.refuse(node, f"attends {q.heads} query heads to keys and values that do not pair up (keys: "
                              f"{k.kv_heads} heads x {k.repeat}, values: {v.kv_heads} x {v.repeat}, cached "
                              f"{k.present is not None}/{v.present is not None})")
    if mask is not None:
        check_causal(cv, node, mask, cached=k.present is not None)
    elif not causal:
        raise cv.refuse(node, "attends without a mask and without is_causal; grokc compiles causal attention only")
    attrs = AttentionAttrs(layer=-1, n_heads=q.heads, n_kv_heads=k.kv_heads, head_dim=q.head_dim,
                           scale=attention_scale(cv, node, scale, q.head_dim))
    out = cv.ir.add(OpKind.ATTENTION, {"q": q.tensor, "k": k.tensor, "v": v.tensor}, q.heads * q.head_dim, node,
                    attrs, suffix)
    cv.served.update(p for p in (k.present, v.present) if p)
    cv.kv_tensors.update((k.tensor, v.tensor))
    return Act(out, HEADS, q.heads * q.head_dim, q.heads, q.head_dim)


def _consts(cv: Conversion, m: Match, *names: str) -> list[float]:
    return [float(np.asarray(cv.graph.const(m.values[n])).reshape(-1)[0]) for n in names if n in m.values]


def _written_out_check(m: Match, cv: Conversion) -> bool:
    k = cv.act(m.values["k"])
    return k.view == KT and cv.act(m.values["q"]).view == HEADS


def _written_out(m: Match, cv: Conversion) -> None:
    q, k, v = (cv.act(m.values[r]) for r in "qkv")
    root = m.nodes["root"]
    scale = float(np.prod(_consts(cv, m, "s1", "s2", "s3"))) / float(np.prod(_consts(cv, m, "d3")))
    cv.kinds[root.outputs[0]] = emit_attention(cv, root, q, k, v, scale, m.values.get("mask"), causal=False)


def _one_op_check(m: Match, cv: Conversion) -> bool:
    root = m.nodes["root"]
    a = root.attrs
    if any(o and cv.graph.consumers(o) or o in cv.graph.outputs for o in root.outputs[1:]):
        raise cv.refuse(root, "returns its key/value cache or scores; grokc reads attention with the cache "
                              "concatenated in front of it")
    if a.get("softcap", 0) or a.get("qk_matmul_output_mode", 0) or a.get("dropout_p", 0):
        raise cv.refuse(root, "applies a softcap, dropout or another scores mode; grokc compiles plain attention")
    return all(cv.act(m.values[r]).view == HEADS for r in "qkv")


def _one_op(m: Match, cv: Conversion) -> None:
    root = m.nodes["root"]
    q, k, v = (cv.act(m.values[r]) for r in "qkv")
    scale = root.attrs.get("scale") or q.head_dim ** -0.5
    mask = root.inputs[3] if len(root.inputs) > 3 and root.inputs[3] else None
    cv.kinds[root.outputs[0]] = emit_attention(cv, root, q, k, v, scale, mask, bool(root.attrs.get("is_causal", 0)))


RULES = [
    Rule("attention (written out)", WRITTEN_OUT, _written_out_check, _written_out),
    Rule("attention (one op)", ONE_OP, _one_op_check, _one_op),
]
