"""Split every int4 LINEAR that keeps an fp16 residual into SPARSE_RESIDUAL + LINEAR.

What: ``passes/quantize.py`` hangs a weight's CSR correction (``quant/residual.py``) on its LINEAR
as the input roles ``residual_rowptr``, ``residual_cols``, ``residual_vals`` (weights
``<base>.residual_*``). This pass splits every such LINEAR into a SPARSE_RESIDUAL node, which
writes ``delta = prologue(x) @ R^T`` (f32 ``[T, NW]``, the linear's RMSNorm recomputed), and the
LINEAR, which adds ``delta`` to its products before the activation (input role ``addend``). The
memory planner gives ``delta`` an arena slot like any intermediate; each node lowers to one launch
(the ABI's ``sparse_residual`` and ``linear``).

Requires: static shapes (``passes/static_shapes.py``), so that the prefill LM head already reads
the last token's row; runs before ``memory_plan``.
Guarantees: modules without residual inputs are unchanged; graph inputs and outputs are kept.
"""

from __future__ import annotations

from dataclasses import replace

from grokc.core.ir import DType, Module, Node, OpKind, SparseResidualAttrs, TensorType
from grokc.passes._graph import rebuild_graph

ROLES = ("residual_rowptr", "residual_cols", "residual_vals")  # LINEAR input roles; weights <base>.<role>


def run(module: Module) -> Module:
    """Split each LINEAR with a sparse residual into SPARSE_RESIDUAL (writes ``addend``) + LINEAR."""
    graphs = {}
    for gname, g in module.graphs.items():
        nodes, types = [], {}
        for n in g.nodes:
            if n.op is OpKind.LINEAR and ROLES[0] in n.inputs:
                delta = f"{n.outputs[0]}.residual_delta"
                x = g.tensors[n.inputs["x"]] if n.inputs["x"] in g.tensors else module.state[n.inputs["x"]]
                nw = module.params[n.inputs[ROLES[0]]].shape[0] - 1
                types[delta] = TensorType((x.shape[0], nw), DType.F32)  # [T, NW]
                inputs = {"x": n.inputs["x"], "rowptr": n.inputs[ROLES[0]], "cols": n.inputs[ROLES[1]],
                          "vals": n.inputs[ROLES[2]]}
                if "norm" in n.inputs:
                    inputs["norm"] = n.inputs["norm"]
                nodes.append(Node(OpKind.SPARSE_RESIDUAL, f"{n.name}.residual", inputs, (delta,),
                                  SparseResidualAttrs(n.attrs.norm_eps if "norm" in n.inputs else None)))
                linear_inputs = {r: s for r, s in n.inputs.items() if r not in ROLES}
                n = replace(n, inputs={**linear_inputs, "addend": delta})
            nodes.append(n)
        graphs[gname] = rebuild_graph(g, nodes, types)
    return module.with_(graphs=graphs)
