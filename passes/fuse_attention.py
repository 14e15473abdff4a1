"""Fuse a layer's q/k/v projections, their rotary embeddings and the attention into two nodes.

What: ``ATTENTION(ROPE(LINEAR(x, Wq)), ROPE(LINEAR(x, Wk)), LINEAR(x, Wv))`` becomes
``qkv = LINEAR(x, [Wq; Wk; Wv])`` and ``ATTENTION(qkv)`` with ``fused_rope``: the attention
kernel rotates q and k itself and writes the rotated keys to the KV cache in the same pass.

Requires: the frontend graph (plain LINEARs with unquantized weights, ROPE nodes with ``x``,
``positions`` and ``inv_freq`` inputs); run before ``quantize`` so the concatenation is exact.
Guarantees: every ATTENTION node has ``fused_rope=True`` and inputs ``qkv``, ``positions``,
``inv_freq``; the graph's inputs and outputs are unchanged; the separate q/k/v weights are
replaced by ``blk.<i>.attn_qkv.weight`` (rows: q, then k, then v).
Not handled: an attention whose inputs do not have exactly this shape is refused (the kernels
only exist in fused form), naming the layer.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from grokc.core.errors import UnsupportedModel
from grokc.core.ir import DType, Graph, LinearAttrs, Module, Node, OpKind, TensorType, frozen_array
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
        q_rope, k_rope, v_lin = (prod.get(attn.inputs[r]) for r in ("q", "k", "v"))
        q_lin, k_lin = (prod.get(r.inputs["x"]) if r is not None and r.op is OpKind.ROPE else None
                        for r in (q_rope, k_rope))
        if not _matches(g, q_rope, k_rope, q_lin, k_lin, v_lin):
            raise UnsupportedModel(f"attention in layer {attn.attrs.layer} is not the Llama q/k/v + RoPE pattern "
                                   "grokc fuses; only the Llama family is supported")
        i = attn.attrs.layer
        weight = name(Tensor.ATTN_QKV, i)
        new_params[weight] = frozen_array(concat_rows([module.params[n.inputs["weight"]] for n in (q_lin, k_lin, v_lin)]))
        qkv = f"blk.{i}.attn_qkv"
        t = g.tensors[q_lin.outputs[0]].shape[0]
        new_types[qkv] = TensorType((t, new_params[weight].shape[0]), DType.F16)
        replaced[q_lin.name] = [Node(OpKind.LINEAR, qkv, {"x": q_lin.inputs["x"], "weight": weight}, (qkv,), LinearAttrs())]
        replaced[attn.name] = [Node(
            OpKind.ATTENTION, attn.name,
            {"qkv": qkv, "positions": q_rope.inputs["positions"], "inv_freq": q_rope.inputs["inv_freq"]},
            attn.outputs, replace(attn.attrs, fused_rope=True),
        )]
        dropped |= {k_lin.name, v_lin.name, q_rope.name, k_rope.name}
    nodes = [m for n in g.nodes if n.name not in dropped for m in replaced.get(n.name, [n])]
    return rebuild_graph(g, nodes, new_types), new_params


def _matches(g: Graph, q_rope, k_rope, q_lin, k_lin, v_lin) -> bool:
    lins = (q_lin, k_lin, v_lin)
    if any(n is None or n.op is not OpKind.LINEAR or n.attrs != LinearAttrs() for n in lins):
        return False
    if len({n.inputs["x"] for n in lins}) != 1 or set(q_rope.inputs) != {"x", "positions", "inv_freq"}:
        return False
    if (q_rope.inputs["positions"], q_rope.inputs["inv_freq"]) != (k_rope.inputs["positions"], k_rope.inputs["inv_freq"]):
        return False
    return all(single_use(g, n.outputs[0]) for n in (q_rope, k_rope, q_lin, k_lin, v_lin))
