"""Rules for the layers with weights: linear layers and the token embedding.

- ``MatMul(x, W)`` with a constant ``W [K, N]`` (the exporters store ``weight.T``) or torch's
  ``Linear(x, W [N, K][, b [N]])`` -> ``LINEAR`` with the weight ``[N, K]`` (and the bias);
- ``Add(linear, b)`` of a constant ``b [N]`` to the output of a linear layer read by nothing else
  (the exporters' bias, the model builder's too) -> the bias of that ``LINEAR``;
- ``Gather(table, tokens)`` of a constant ``[V, H]`` table along axis 0 -> ``EMBEDDING``.

Weights and biases keep the source's values in f32; their names come later (``canonical.py``),
which also says which linear layers may have a bias (q, k and v: Qwen2's).
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
                grid: CarriedInt4 | None = None, bias: str | None = None) -> Act:
    """``LINEAR(x, weight [N, K])`` under the provisional parameter name ``name``, plus the source's
    constant ``bias`` when given (checked by ``bias_fits``); returns the output's kind."""
    xa = cv.act(x)
    w = cv.ir.param(name, weight, grid)
    n = cv.ir.params[w].shape[0]
    out = cv.ir.add(OpKind.LINEAR, {"x": xa.tensor, "weight": w}, n, source, LinearAttrs())
    if bias is not None:
        cv.ir.add_bias(out, cv.graph.const(bias).reshape(-1), bias, source)
    return Act(out, TOKENS, n)


def bias_fits(cv: Conversion, bias: str, n: int) -> bool:
    """``bias`` is a constant vector of the linear layer's ``n`` outputs (leading axes of 1 allowed)."""
    b = cv.graph.const(bias)
    return b is not None and b.size == n and b.shape[-1:] == (n,) and np.issubdtype(b.dtype, np.floating)


def _matmul_check(m: Match, cv: Conversion) -> bool:
    w = cv.graph.const(m.values["w"])
    return cv.act(m.values["x"]).view == TOKENS and w.ndim == 2 and w.shape[0] == cv.act(m.values["x"]).channels


def _matmul(m: Match, cv: Conversion) -> None:
    root, w = m.nodes["root"], m.values["w"]
    cv.kinds[root.outputs[0]] = emit_linear(cv, m.values["x"], cv.graph.const(w).T, f"{w}^T", root)


def _linear_check(m: Match, cv: Conversion) -> bool:
    root, w = m.nodes["root"], cv.graph.const(m.values["w"])
    x = cv.act(m.values["x"])
    bias = root.inputs[2] if len(root.inputs) > 2 and root.inputs[2] else None
    if bias is not None and (w.ndim != 2 or not bias_fits(cv, bias, w.shape[0])):
        raise cv.refuse(root, "is a linear layer whose bias is not a constant vector of its outputs")
    return x.view == TOKENS and w.ndim == 2 and w.shape[1] == x.channels


def _linear(m: Match, cv: Conversion) -> None:
    root, w = m.nodes["root"], m.values["w"]
    bias = root.inputs[2] if len(root.inputs) > 2 and root.inputs[2] else None
    cv.kinds[root.outputs[0]] = emit_linear(cv, m.values["x"], cv.graph.const(w), w, root, bias=bias)


def _bias_check(m: Match, cv: Conversion) -> bool:
    """An Add of a constant vector to a linear layer's own output, which nothing else reads."""
    x, value = cv.act(m.values["x"]), m.values["x"]
    node, producer = cv.ir.linear(x.tensor), cv.graph.producer(value)
    return (x.view == TOKENS and node is not None and "bias" not in node.inputs and producer is not None
            and cv.ir.source[node.name] is producer and len(cv.graph.consumers(value)) == 1
            and value not in cv.graph.outputs and bias_fits(cv, m.values["b"], x.channels))


def _bias(m: Match, cv: Conversion) -> None:
    root, x, b = m.nodes["root"], cv.act(m.values["x"]), m.values["b"]
    cv.ir.add_bias(x.tensor, cv.graph.const(b).reshape(-1), b, root)
    cv.kinds[root.outputs[0]] = x


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
    Rule("bias", Op("Add", X, Const("b"), name="root", commute=True), _bias_check, _bias),
    Rule("embedding", Op("Gather", Const("table"), Var("ids", Tokens), name="root"), _embedding_check, _embedding),
]
