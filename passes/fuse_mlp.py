"""Fuse a gated MLP's gate and up projections and their activation into one LINEAR.

What: ``MUL(ACT(LINEAR(x, Wg)), LINEAR(x, Wu))`` with ``ACT`` SILU (SwiGLU) or GELU_TANH (GeGLU)
becomes ``LINEAR(x, [Wg; Wu], act=SILU_MUL or GELU_TANH_MUL)``: one kernel reads both weight rows
of an output and writes ``act(gate) * up``.

Requires: plain LINEARs with unquantized weights (run before ``quantize``).
Guarantees: the MUL's output name is kept, so consumers are untouched; the fused weight is
``blk.<i>.ffn_gate_up.weight`` (gate rows, then up rows); graph inputs/outputs unchanged.
Not handled: other activations, biased gate/up, or gate/up on different inputs are left as they are.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from grokc.core.ir import Act, Graph, LinearAttrs, Module, Node, OpKind, frozen_array
from grokc.core.rowwise import concat_rows
from grokc.passes._graph import rebuild_graph, rewrite_graphs, single_use

_GATED = {OpKind.SILU: Act.SILU_MUL, OpKind.GELU_TANH: Act.GELU_TANH_MUL}


def run(module: Module) -> Module:
    return rewrite_graphs(module, _fuse_graph)


def _fuse_graph(g: Graph, module: Module) -> tuple[Graph, dict[str, np.ndarray]]:
    prod = g.producers()
    replaced: dict[str, Node] = {}
    dropped: set[str] = set()
    new_params: dict[str, np.ndarray] = {}
    for mul in g.nodes:
        if mul.op is not OpKind.MUL:
            continue
        match = _match(g, prod, mul)
        if match is None:
            continue
        silu, gate, up = match
        weight = gate.inputs["weight"].replace("ffn_gate", "ffn_gate_up")
        new_params[weight] = frozen_array(concat_rows([module.params[gate.inputs["weight"]], module.params[up.inputs["weight"]]]))
        name = gate.name.replace("ffn_gate", "ffn_gate_up")
        replaced[mul.name] = Node(OpKind.LINEAR, name, {"x": gate.inputs["x"], "weight": weight}, mul.outputs,
                                  replace(LinearAttrs(), act=_GATED[silu.op]))
        dropped |= {silu.name, gate.name, up.name}
    nodes = [replaced.get(n.name, n) for n in g.nodes if n.name not in dropped]
    return rebuild_graph(g, nodes), new_params


def _match(g: Graph, prod, mul: Node):
    for a, b in (("a", "b"), ("b", "a")):
        silu, up = prod.get(mul.inputs[a]), prod.get(mul.inputs[b])
        if silu is None or up is None or silu.op not in _GATED:
            continue
        gate = prod.get(silu.inputs["x"])
        ok = (
            gate is not None and up.op is OpKind.LINEAR and gate.op is OpKind.LINEAR
            and gate.attrs == LinearAttrs() and up.attrs == LinearAttrs()
            and gate.inputs["x"] == up.inputs["x"]
            and all(single_use(g, n.outputs[0]) for n in (silu, gate, up))
        )
        if ok:
            return silu, gate, up
    return None
