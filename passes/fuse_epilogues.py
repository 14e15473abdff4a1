"""Fold an RMSNorm in front of, and a residual add behind, the LINEARs next to them.

What:
- ``LINEAR(RMS_NORM(x, g))`` becomes ``LINEAR(x, norm=g)``: the kernel normalises each row of
  ``x`` while it stages it (the sum of squares costs nothing extra in a GEMV). Applied when every
  reader of the norm's output is a LINEAR without a norm of its own.
- ``ADD(h, LINEAR(...))`` becomes ``LINEAR(..., residual=h)`` whose output takes the ADD's name;
  ``ADD(h, RMS_NORM(y))`` (a norm after the attention or MLP, Gemma 3) becomes
  ``RMS_NORM(y, residual=h)`` the same way.

Requires: LINEAR nodes (any weight format); run after the fuse_attention/fuse_mlp passes so a
norm feeds a single fused LINEAR.
Guarantees: graph inputs and outputs unchanged; every ungrouped RMS_NORM that fed only LINEARs and
every ADD of a single-use LINEAR or ungrouped RMS_NORM result is gone; numerics are those of
``abi/ops.py``'s ``linear`` and ``rms_norm``.
Not handled: norms feeding anything else stay separate nodes (the ``rms_norm`` op).
"""

from __future__ import annotations

from dataclasses import replace

from grokc.core.ir import Graph, Module, Node, OpKind
from grokc.passes._graph import rebuild_graph, rebuild_module, single_use


def run(module: Module) -> Module:
    graphs = {name: _fold_residuals(_fold_norms(g)) for name, g in module.graphs.items()}
    return rebuild_module(module, graphs)


def _fold_norms(g: Graph) -> Graph:
    uses = g.consumers()
    folded = {
        n.name: n for n in g.nodes
        if n.op is OpKind.RMS_NORM and not n.attrs.group and "residual" not in n.inputs
        and n.outputs[0] not in g.outputs and uses[n.outputs[0]]
        and all(u.op is OpKind.LINEAR and u.attrs.norm_eps is None and u.inputs["x"] == n.outputs[0]
                for u in uses[n.outputs[0]])
    }
    by_output = {n.outputs[0]: n for n in folded.values()}
    nodes = []
    for n in g.nodes:
        if n.name in folded:
            continue
        norm = by_output.get(n.inputs.get("x")) if n.op is OpKind.LINEAR else None
        if norm is not None:
            n = Node(n.op, n.name, {**n.inputs, "x": norm.inputs["x"], "norm": norm.inputs["weight"]}, n.outputs,
                     replace(n.attrs, norm_eps=norm.attrs.eps))
        nodes.append(n)
    return rebuild_graph(g, nodes)


def _fold_residuals(g: Graph) -> Graph:
    prod = g.producers()
    fused: dict[str, Node] = {}   # ADD name -> the LINEAR / RMS_NORM that absorbs it, emitted at the ADD's place
    absorbed: set[str] = set()    # names of those nodes
    for add in g.nodes:
        if add.op is not OpKind.ADD:
            continue
        for lin_role, res_role in (("b", "a"), ("a", "b")):
            lin = prod.get(add.inputs[lin_role])
            takes = lin is not None and (lin.op is OpKind.LINEAR or (lin.op is OpKind.RMS_NORM and not lin.attrs.group))
            if (takes and "residual" not in lin.inputs
                    and lin.name not in absorbed and single_use(g, lin.outputs[0])):
                fused[add.name] = Node(lin.op, lin.name, {**lin.inputs, "residual": add.inputs[res_role]},
                                       add.outputs, lin.attrs)
                absorbed.add(lin.name)
                break
    nodes = [fused.get(n.name, n) for n in g.nodes if n.name not in absorbed]
    return rebuild_graph(g, nodes)
