"""Small helpers the passes share for rebuilding graphs and modules without mutating them."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from grokc.core.ir import Graph, Module, Node, TensorType


def rebuild_graph(g: Graph, nodes: Iterable[Node], new_types: Mapping[str, TensorType] = {},
                  renames: Mapping[str, str] = {}) -> Graph:
    """``g`` with ``nodes`` (inputs renamed by ``renames``), keeping only the tensor types in use."""
    nodes = tuple(
        Node(n.op, n.name, {r: renames.get(s, s) for r, s in n.inputs.items()}, n.outputs, n.attrs) for n in nodes
    )
    types = {**g.tensors, **new_types}
    used = set(g.inputs) | {o for n in nodes for o in n.outputs}
    outputs = tuple(renames.get(o, o) for o in g.outputs)
    return Graph(g.name, nodes, g.inputs, outputs, {k: v for k, v in types.items() if k in used})


def rebuild_module(m: Module, graphs: Mapping[str, Graph], new_params: Mapping[str, object] = {}, **changes) -> Module:
    """``m`` with new graphs and parameters added; parameters no graph references are dropped."""
    params = {**m.params, **new_params}
    referenced = {s for g in graphs.values() for n in g.nodes for s in n.inputs.values()}
    return m.with_(graphs=graphs, params={k: v for k, v in params.items() if k in referenced}, **changes)


def rewrite_graphs(m: Module, rewrite: Callable[[Graph, Module], tuple[Graph, dict]]) -> Module:
    """Apply ``rewrite(graph, module) -> (new graph, new parameters)`` to every graph of ``m``."""
    graphs, params = {}, {}
    for name, g in m.graphs.items():
        graphs[name], new = rewrite(g, m)
        params.update(new)
    return rebuild_module(m, graphs, params)


def single_use(g: Graph, tensor: str) -> bool:
    """True when exactly one node reads ``tensor`` and it is not a graph output."""
    return tensor not in g.outputs and len(g.consumers().get(tensor, [])) == 1
