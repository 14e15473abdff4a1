"""Elementwise rules between hidden states: SiLU, products and residual adds.

- SiLU: ``Mul(x, Sigmoid(x))`` or torch's ``silu`` -> ``SILU``;
- ``Mul(a, b)`` of two hidden states (the SwiGLU product) -> ``MUL``;
- ``Add(a, b)`` of two hidden states (a residual) -> ``ADD``.

Checks: both operands are TOKENS activations of the same width.
"""

from __future__ import annotations

from grokc.compiler.frontends.graph.convert import Conversion, Rule
from grokc.compiler.frontends.graph.kinds import TOKENS, Act
from grokc.compiler.frontends.graph.pattern import Either, Match, Op, Var
from grokc.core.ir import OpKind

X, A, B = Var("x", Act), Var("a", Act), Var("b", Act)


def _tokens(*names: str):
    def check(m: Match, cv: Conversion) -> bool:
        acts = [cv.act(m.values[n]) for n in names]
        return all(a.view == TOKENS for a in acts) and len({a.channels for a in acts}) == 1
    return check


def _silu(m: Match, cv: Conversion) -> None:
    x, root = cv.act(m.values["x"]), m.nodes["root"]
    cv.kinds[root.outputs[0]] = x.but(tensor=cv.ir.add(OpKind.SILU, {"x": x.tensor}, x.channels, root))


def _binary(op: OpKind):
    def rewrite(m: Match, cv: Conversion) -> None:
        a, b, root = cv.act(m.values["a"]), cv.act(m.values["b"]), m.nodes["root"]
        cv.kinds[root.outputs[0]] = a.but(tensor=cv.ir.add(op, {"a": a.tensor, "b": b.tensor}, a.channels, root))
    return rewrite


RULES = [
    Rule("silu", Either(Op("Mul", X, Op("Sigmoid", X), name="root", commute=True), Op("Silu", X, name="root")),
         _tokens("x"), _silu),
    Rule("product", Op("Mul", A, B, name="root"), _tokens("a", "b"), _binary(OpKind.MUL)),
    Rule("residual add", Op("Add", A, B, name="root"), _tokens("a", "b"), _binary(OpKind.ADD)),
]
