"""RMSNorm rules: the decomposed form the exporters write, and the one-op forms.

- decomposed: ``w * (x * 1/sqrt(mean(x^2, -1) + eps))`` as Pow (or Mul x x), ReduceMean over the
  last axis (keepdims), Add eps, Sqrt then Reciprocal (or Rsqrt, or Div by the Sqrt), Mul by x, Mul
  by the weight; casts to f32 and back around it are taken as they come (``opt``);
- ``RMSNormalization`` (ONNX opset 23), ``SimplifiedLayerNormalization`` (onnxruntime's, in the ONNX
  domain) and torch's ``rms_norm`` (read as ``RMSNormalization``), over the last axis.

Checks: the weight is a constant ``[C]`` of the normalised activation, eps a positive scalar, the
reduction over the last axis. Rewrite: one ``RMS_NORM``.
"""

from __future__ import annotations

import numpy as np

from grokc.compiler.frontends.graph.convert import Conversion, Rule
from grokc.compiler.frontends.graph.kinds import TOKENS, Act
from grokc.compiler.frontends.graph.opgraph import OpNode
from grokc.compiler.frontends.graph.pattern import Const, Either, Match, Op, Var, opt, scalar
from grokc.core.ir import OpKind, RmsNormAttrs

X = Var("x", Act)
_EPS = Const("eps", lambda a: a.size == 1 and 0 < float(a.reshape(-1)[0]) < 1)


def _last_axis(node: OpNode) -> bool:
    return tuple(node.attrs.get("axes", ())) in ((-1,), (2,)) and node.attrs.get("keepdims", 1) == 1


_MEAN_SQUARE = Op("ReduceMean", Either(Op("Pow", X, Const(None, scalar(2.0))), Op("Mul", X, X)), where=_last_axis)
_STD = Op("Sqrt", Op("Add", _MEAN_SQUARE, _EPS, commute=True))
_NORMED = Either(
    Op("Mul", X, Either(Op("Reciprocal", _STD), Op("Rsqrt", Op("Add", _MEAN_SQUARE, _EPS, commute=True))), commute=True),
    Op("Div", X, _STD),
)
DECOMPOSED = Op("Mul", Const("w"), opt("Cast", _NORMED), name="root", commute=True)
FUSED = Op(("RMSNormalization", "SimplifiedLayerNormalization"), X, Const("w"), name="root",
           where=lambda n: n.attrs.get("axis", -1) in (-1, 2))


def norm_check(m: Match, cv: Conversion) -> bool:
    """The weight is ``[C]`` of a TOKENS activation ``x``."""
    x = cv.act(m.values["x"])
    return x.view == TOKENS and cv.graph.const(m.values["w"]).shape == (x.channels,)


def eps_of(m: Match, cv: Conversion) -> float:
    if "eps" in m.values:
        return float(np.asarray(cv.graph.const(m.values["eps"])).reshape(-1)[0])
    return float(m.nodes["root"].attrs.get("epsilon", 1e-5))


def emit_norm(cv: Conversion, x: Act, weight: str, eps: float, source: OpNode, suffix: str = "") -> Act:
    """``RMS_NORM(x, weight)`` with the constant ``weight``; returns the output's kind."""
    w = cv.ir.param(weight, cv.graph.const(weight))
    return x.but(tensor=cv.ir.add(OpKind.RMS_NORM, {"x": x.tensor, "weight": w}, x.channels, source,
                                  RmsNormAttrs(eps=eps), suffix))


def _rewrite(m: Match, cv: Conversion) -> None:
    root = m.nodes["root"]
    cv.kinds[root.outputs[0]] = emit_norm(cv, cv.act(m.values["x"]), m.values["w"], eps_of(m, cv), root)


RULES = [
    Rule("rms_norm (decomposed)", DECOMPOSED, norm_check, _rewrite),
    Rule("rms_norm (one op)", FUSED, norm_check, _rewrite),
]
