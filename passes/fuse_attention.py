"""Fuse a layer's q/k/v projections, their rotary embeddings and the attention into two nodes
(three with per-head q/k norms).

What: ``ATTENTION(ROPE(Q), ROPE(K), LINEAR(x, Wv[, bv]))`` with ``Q = LINEAR(x, Wq[, bq])`` and
``K`` likewise, each optionally behind a per-head ``RMS_NORM`` (``group == head_dim``: Qwen3,
Gemma 3), becomes ``qkv = LINEAR(x, [Wq; Wk; Wv], bias=[bq; bk; bv])``, then
``QK_NORM(qkv, q_norm, k_norm)`` when the heads are normalised, then ``ATTENTION(qkv)`` with
``fused_rope``: the attention kernel rotates q and k itself and writes the rotated keys to the KV
cache in the same pass.

Requires: the frontend graph (plain LINEARs with unquantized weights, ROPE nodes with ``x``,
``positions`` and ``inv_freq`` inputs); run before ``quantize`` so the concatenation is exact.
Guarantees: every ATTENTION node has ``fused_rope=True`` and inputs ``qkv``, ``positions``,
``inv_freq``; the graph's inputs and outputs are unchanged; the separate q/k/v weights (and
biases) are replaced by ``blk.<i>.attn_qkv.weight`` (``.bias``; rows: q, then k, then v).
Not handled: an attention whose inputs do not have exactly this shape (biases on some of q/k/v
only, a norm on q but not k) is refused (the kernels only exist in fused form), naming the layer.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from grokc.core.errors import UnsupportedModel
from grokc.core.ir import (
    DType,
    Graph,
    LinearAttrs,
    Module,
    Node,
    OpKind,
    QkNormAttrs,
    RmsNormAttrs,
    TensorType,
    frozen_array,
)
from grokc.core.rowwise import concat_rows
from grokc.core.tensors import Tensor, name
from grokc.passes._graph import rebuild_graph, rewrite_graphs, single_use


def run(module: Module) -> Module:
    return rewrite_graphs(module, _fuse_graph)


def _fuse_graph(g: Graph, module: Module) -> tuple[Graph, dict[str, np.ndarray]]:
    prod = g.producers()
    replaced: dict[str, list[Node]] = {}   # anchor node name -> nodes emitted in its place
    dropped: set[str] = set()
    new_types: dict[str, TensorType] = {}
    new_params: dict[str, np.ndarray] = {}
    for attn in g.nodes:
        if attn.op is not OpKind.ATTENTION or attn.attrs.fused_rope:
            continue
        i = attn.attrs.layer
        q_rope, k_rope, v_lin = (prod.get(attn.inputs[r]) for r in ("q", "k", "v"))
        q_norm, q_lin = _through_norm(prod, q_rope)
        k_norm, k_lin = _through_norm(prod, k_rope)
        if not _matches(g, attn, q_rope, k_rope, q_lin, k_lin, v_lin, q_norm, k_norm):
            raise UnsupportedModel(f"attention in layer {i} is not the q/k/v (+ biases, per-head norms) + RoPE "
                                   "pattern grokc fuses")
        lins = (q_lin, k_lin, v_lin)
        weight = name(Tensor.ATTN_QKV, i)
        new_params[weight] = frozen_array(concat_rows([module.params[n.inputs["weight"]] for n in lins]))
        inputs = {"x": q_lin.inputs["x"], "weight": weight}
        if "bias" in q_lin.inputs:
            inputs["bias"] = name(Tensor.ATTN_QKV, i, "bias")
            new_params[inputs["bias"]] = frozen_array(np.concatenate([module.params[n.inputs["bias"]] for n in lins]))
        qkv = f"blk.{i}.attn_qkv"
        t = g.tensors[q_lin.outputs[0]].shape[0]
        new_types[qkv] = TensorType((t, new_params[weight].shape[0]), DType.F16)
        emitted = [Node(OpKind.LINEAR, qkv, inputs, (qkv,), LinearAttrs())]
        if q_norm is not None:
            a = attn.attrs
            normed = f"{qkv}.normed"
            new_types[normed] = new_types[qkv]
            emitted.append(Node(OpKind.QK_NORM, f"blk.{i}.qk_norm",
                                {"qkv": qkv, "q_norm": q_norm.inputs["weight"], "k_norm": k_norm.inputs["weight"]},
                                (normed,), QkNormAttrs(a.n_heads, a.n_kv_heads, a.head_dim, q_norm.attrs.eps)))
            qkv = normed
            dropped |= {q_norm.name, k_norm.name}
        replaced[q_lin.name] = emitted
        replaced[attn.name] = [Node(
            OpKind.ATTENTION, attn.name,
            {"qkv": qkv, "positions": q_rope.inputs["positions"], "inv_freq": q_rope.inputs["inv_freq"]},
            attn.outputs, replace(attn.attrs, fused_rope=True),
        )]
        dropped |= {k_lin.name, v_lin.name, q_rope.name, k_rope.name}
    nodes = [m for n in g.nodes if n.name not in dropped for m in replaced.get(n.name, [n])]
    return rebuild_graph(g, nodes, new_types), new_params


def _through_norm(prod: dict[str, Node], rope: Node | None) -> tuple[Node | None, Node | None]:
    """(the per-head norm in front of a ROPE or None, the node in front of that)."""
    if rope is None or rope.op is not OpKind.ROPE:
        return None, None
    x = prod.get(rope.inputs["x"])
    if x is not None and x.op is OpKind.RMS_NORM and x.attrs.group:
        return x, prod.get(x.inputs["x"])
    return None, x


def _matches(g: Graph, attn: Node, q_rope, k_rope, q_lin, k_lin, v_lin, q_norm, k_norm) -> bool:
    lins = (q_lin, k_lin, v_lin)
    if any(n is None or n.op is not OpKind.LINEAR or n.attrs != LinearAttrs() for n in lins):
        return False
    if len({n.inputs["x"] for n in lins}) != 1 or len({"bias" in n.inputs for n in lins}) != 1:
        return False
    if set(q_rope.inputs) != {"x", "positions", "inv_freq"}:
        return False
    if (q_rope.inputs["positions"], q_rope.inputs["inv_freq"]) != (k_rope.inputs["positions"], k_rope.inputs["inv_freq"]):
        return False
    if (q_norm is None) != (k_norm is None):
        return False
    norms = () if q_norm is None else (q_norm, k_norm)
    if norms and {n.attrs for n in norms} != {RmsNormAttrs(q_norm.attrs.eps, attn.attrs.head_dim)}:
        return False
    return all(single_use(g, n.outputs[0]) for n in (q_rope, k_rope, *lins, *norms))
