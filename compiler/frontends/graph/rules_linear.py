"""Rules for the layers with weights: linear layers and the token embedding.

- ``MatMul(x, W)`` with a constant ``W [K, N]`` (the exporters store ``weight.T``) or torch's
  ``Linear(x, W [N, K])`` -> ``LINEAR`` with the weight ``[N, K]``;
- ``Gather(table, tokens)`` of a constant ``[V, H]`` table along axis 0 -> ``EMBEDDING``;
- a constant added to a linear layer's output (a bias) is refused: the Llama family has none.

Weights keep the source's values in f32; their names come later (``canonical.py``).
"""

from __future__ import annotations

import numpy as np

from grokc.compiler.frontends.graph.convert import Conversion, Rule
from grokc.compiler.frontends.graph.kinds import TOKENS, Act, Tokens
from grokc.compiler.frontends.graph.opgraph import OpNode
from grokc.compiler.frontends.graph.pattern import Const, Match, Op, Var
from grokc.core.ir import EmbeddingAttrs, LinearAttrs, OpKind
from grokc.core.meta import CarriedInt4

X = Var("x", Act)


def emit_linear(cv: Conversion, x: str, weight: np.ndarray, name: str, source: OpNode,
                grid: CarriedInt4 | None = None) -> Act:
    """``LINEAR(x, weight [N, K])`` under the provisional parameter name ``name``; returns the output's kind."""
    xa = cv.act(x)
    w = cv.ir.param(name, weight, grid)
    n = cv.ir.params[w].shape[0]
    return Act(cv.ir.add(OpKind.LINEAR, {"x": xa.tensor, "weight": w}, n, source, LinearAttrs()), TOKENS, n)


def _matmul_check(m: Match, cv: Conversion) -> bool:
    w = cv.graph.const(m.values["w"])
    return cv.act(m.values["x"]).view == TOKENS and w.ndim == 2 and w.shape[0] == cv.act(m.values["x"]).channels


def _matmul(m: Match, cv: Conversion) -> None:
    root, w = m.nodes["root"], m.values["w"]
    cv.kinds[root.outputs[0]] = emit_linear(cv, m.values["x"], cv.graph.const(w).T, f"{w}^T", root)


def _linear_check(m: Match, cv: Conversion) -> bool:
    root, w = m.nodes["root"], cv.graph.const(m.values["w"])
    x = cv.act(m.values["x"])
    if len(root.inputs) > 2 and root.inputs[2]:
        raise cv.refuse(root, f"is a linear layer with a bias ({_BIAS})")
    return x.view == TOKENS and w.ndim == 2 and w.shape[1] == x.channels


def _linear(m: Match, cv: Conversion) -> None:
    root, w = m.nodes["root"], m.values["w"]
    cv.kinds[root.outputs[0]] = emit_linear(cv, m.values["x"], cv.graph.const(w), w, root)


def _bias_check(m: Match, cv: Conversion) -> bool:
    x, b = cv.act(m.values["x"]), cv.graph.const(m.values["b"])
    node = cv.ir.producer(x.tensor)
    if x.view == TOKENS and node is not None and node.op is OpKind.LINEAR and b.shape[-1:] == (x.channels,):
        raise cv.refuse(m.nodes["root"], f"adds a bias to the linear layer in front of it ({_BIAS})")
    return False


_BIAS = "grokc's Llama family has no biases"


def _embedding_check(m: Match, cv: Conversion) -> bool:
    return cv.graph.const(m.values["table"]).ndim == 2 and m.nodes["root"].attrs.get("axis", 0) == 0


def emit_embedding(cv: Conversion, table: np.ndarray, name: str, tokens: str, source: OpNode) -> None:
    w = cv.ir.param(name, table)
    h = cv.ir.params[w].shape[1]
    out = cv.ir.add(OpKind.EMBEDDING, {"table": w, "tokens": "tokens"}, h, source, EmbeddingAttrs())
    cv.kinds[source.outputs[0]] = Act(out, TOKENS, h)


def _embedding(m: Match, cv: Conversion) -> None:
    t = m.values["table"]
    emit_embedding(cv, cv.graph.const(t), t, m.values["ids"], m.nodes["root"])


RULES = [
    Rule("linear (MatMul)", Op("MatMul", X, Const("w"), name="root"), _matmul_check, _matmul),
    Rule("linear (torch)", Op("Linear", X, Const("w"), name="root"), _linear_check, _linear),
    Rule("bias", Op("Add", X, Const("b"), name="root", commute=True), _bias_check, lambda m, cv: None),
    Rule("embedding", Op("Gather", Const("table"), Var("ids", Tokens), name="root"), _embedding_check, _embedding),
]
