"""Expand each mixture-of-experts FFN into device-side routing and grouped expert launches.

What: ``ADD(h, MOE(RMS_NORM(h, g)))`` becomes, in order (``kernel_abi``'s MoE ops)::

    logits  = LINEAR(h, router, norm=g)             # f32 [T, E (+1)]: the router, RMSNorm folded in
    routing = MOE_ROUTE(logits)                     # top-k, weights, entries grouped by expert
    xs      = MOE_GATHER(h, norm=g, routing)        # [T*S, H]: each entry's normed row, by expert
    act     = MOE_LINEAR(xs, gate_up_exps)          # [T*S, I]: act(gate) * up of each entry's expert
    y       = MOE_LINEAR(act, down_exps)            # [T*S, H] f32
    h'      = MOE_COMBINE(y, routing, residual=h)   # h + the weighted sum of each token's entries

so the routing happens on the device and the expert kernels read which experts to use from device
memory: every graph stays a fixed list of launches, and a launch reads only the chosen experts.
The weights: ``blk.<i>.ffn_gate_up_exps.weight`` [E', 2I, H] (each expert's gate rows, then its
up rows) and ``blk.<i>.ffn_down_exps.weight`` [E', H, I]. A shared expert of size ``Is``
(Qwen2-MoE) becomes ``c = ceil(Is / I)`` more experts ``E .. E + c - 1`` that every token uses:
a gated MLP is the sum of the MLPs over any split of its intermediate units, so chunk ``j`` takes
units ``j*I .. (j+1)*I - 1`` (the last padded with zero rows and columns, which add nothing);
its sigmoid gate becomes the router's last row. ``E' = E + c``.

Requires: the frontend graph (MOE nodes with f32 weights); run before ``fuse_epilogues`` and
``quantize``.
Guarantees: no MOE node is left; the norm and the residual add are folded when the MOE is their
only reader; the ADD's output name is kept, so consumers are untouched; graph inputs and outputs
are unchanged; the numbers are the MOE's (``compiler/models/moe.py``) up to f16 activations.
Not handled: an RMSNorm with other readers stays a node of its own (no kernel runs it alone).
"""

from __future__ import annotations

import numpy as np

from grokc.core.ir import (
    DType,
    Graph,
    LinearAttrs,
    Module,
    MoeAttrs,
    MoeGatherAttrs,
    MoeLinearAttrs,
    MoeRouteAttrs,
    Node,
    OpKind,
    TensorType,
    frozen_array,
)
from grokc.core.rowwise import zeros_like_placeholders
from grokc.core.tensors import Tensor, name, parse
from grokc.passes._graph import rebuild_graph, rewrite_graphs, single_use

ROUTING = ("weights", "slot_rows", "row_token", "offsets", "active")   # moe_route's outputs, in ABI order


def run(module: Module) -> Module:
    return rewrite_graphs(module, _fuse_graph)


def shared_chunks(shared_size: int, expert_size: int) -> int:
    """How many experts of ``expert_size`` hold a shared expert of ``shared_size``."""
    return -(-shared_size // expert_size)


def _fuse_graph(g: Graph, module: Module) -> tuple[Graph, dict[str, np.ndarray]]:
    prod, uses = g.producers(), g.consumers()
    replaced: dict[str, list[Node]] = {}   # anchor node name -> nodes emitted in its place
    dropped: set[str] = set()
    new_types: dict[str, TensorType] = {}
    new_params: dict[str, np.ndarray] = {}
    for moe in g.nodes:
        if moe.op is not OpKind.MOE:
            continue
        norm = prod.get(moe.inputs["x"])
        if norm is None or norm.op is not OpKind.RMS_NORM or not single_use(g, norm.outputs[0]):
            norm = None
        add = next((u for u in uses.get(moe.outputs[0], []) if u.op is OpKind.ADD), None)
        if add is None or not single_use(g, moe.outputs[0]):
            add = None
        nodes, types, params = _expand(g, module, moe, norm, add)
        new_types.update(types)
        new_params.update(params)
        replaced[(add or moe).name] = nodes
        dropped |= {moe.name} | ({norm.name} if norm else set())
    # the expansion sits where its anchor was (the MOE itself when no ADD reads it: a post norm, Grok-1)
    nodes = [m for n in g.nodes for m in replaced.get(n.name, [] if n.name in dropped else [n])]
    return rebuild_graph(g, nodes, new_types), new_params


def _expand(g: Graph, module: Module, moe: Node, norm: Node | None, add: Node | None):
    a: MoeAttrs = moe.attrs
    p = module.params
    layer = parse(moe.inputs["router"])[1]
    gate, up, down = (p[moe.inputs[r]] for r in ("gate_exps", "up_exps", "down_exps"))   # [E, I, H] x 2, [E, H, I]
    router = p[moe.inputs["router"]]                                                    # [E, H]
    n_shared = 0
    if a.shared:
        n_shared = shared_chunks(p[moe.inputs["shexp_gate"]].shape[0], gate.shape[1])
        gate, up, down = with_shared(gate, up, down, *(p[moe.inputs[r]] for r in ("shexp_gate", "shexp_up", "shexp_down")))
        if a.shared_gate:
            router = _concat([router, p[moe.inputs["shexp_gate_inp"]]], 0)              # [E + 1, H]
    stacked, inter, hidden = gate.shape
    route = MoeRouteAttrs(a.n_experts, a.top_k, a.norm_top_k, n_shared, a.shared_gate)
    s = route.slots
    w_router, w_gate_up, w_down = name(Tensor.FFN_GATE_INP, layer), name(Tensor.FFN_GATE_UP_EXPS, layer), \
        name(Tensor.FFN_DOWN_EXPS, layer)
    params = {w_router: frozen_array(router), w_down: frozen_array(down),
              w_gate_up: frozen_array(_concat([gate, up], 1))}                          # [E', 2I, H]
    h = norm.inputs["x"] if norm else moe.inputs["x"]
    t = g.tensors[moe.outputs[0]].shape[0]
    base = moe.name
    out = add.outputs[0] if add else moe.outputs[0]
    types = {
        f"{base}.logits": TensorType((t, router.shape[0]), DType.F32),
        **{f"{base}.{r}": TensorType((t, s), DType.F32 if r == "weights" else DType.I32) for r in ROUTING[:3]},
        f"{base}.offsets": TensorType((stacked + 1,), DType.I32), f"{base}.active": TensorType((stacked + 1,), DType.I32),
        f"{base}.x": TensorType((t, s, hidden), DType.F16), f"{base}.act": TensorType((t, s, inter), DType.F16),
        f"{base}.y": TensorType((t, s, hidden), DType.F32), out: g.tensors[out],
    }
    normed = {"norm": norm.inputs["weight"]} if norm else {}
    eps = norm.attrs.eps if norm else None
    groups = {"offsets": f"{base}.offsets", "active": f"{base}.active"}
    nodes = [
        Node(OpKind.LINEAR, f"{base}.router", {"x": h, "weight": w_router, **normed}, (f"{base}.logits",),
             LinearAttrs(norm_eps=eps, out_dtype=DType.F32)),
        Node(OpKind.MOE_ROUTE, f"{base}.route", {"logits": f"{base}.logits"}, tuple(f"{base}.{r}" for r in ROUTING),
             route),
        Node(OpKind.MOE_GATHER, f"{base}.gather", {"x": h, **normed, "row_token": f"{base}.row_token",
                                                   "offsets": f"{base}.offsets"}, (f"{base}.x",), MoeGatherAttrs(eps)),
        Node(OpKind.MOE_LINEAR, f"{base}.gate_up", {"x": f"{base}.x", "weight": w_gate_up, **groups}, (f"{base}.act",),
             MoeLinearAttrs(stacked, a.act)),
        Node(OpKind.MOE_LINEAR, f"{base}.down", {"x": f"{base}.act", "weight": w_down, **groups}, (f"{base}.y",),
             MoeLinearAttrs(stacked, out_dtype=DType.F32)),
        Node(OpKind.MOE_COMBINE, f"{base}.combine", {
            "y": f"{base}.y", "weights": f"{base}.weights", "slot_rows": f"{base}.slot_rows",
            **({"residual": next(v for v in add.inputs.values() if v != moe.outputs[0])} if add else {})}, (out,)),
    ]
    return nodes, types, params


def _concat(parts: list[np.ndarray], axis: int) -> np.ndarray:
    shape = list(parts[0].shape)
    shape[axis] = sum(q.shape[axis] for q in parts)
    return zeros_like_placeholders(parts, tuple(shape), lambda: np.concatenate(parts, axis))


def with_shared(gate: np.ndarray, up: np.ndarray, down: np.ndarray, s_gate: np.ndarray, s_up: np.ndarray,
                 s_down: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The routed experts followed by the shared expert's chunks of their size (zero-padded)."""
    e, inter, hidden = gate.shape
    c = shared_chunks(s_gate.shape[0], inter)
    pad = c * inter - s_gate.shape[0]

    def rows(w: np.ndarray) -> np.ndarray:                                                  # [c, I, H]
        return zeros_like_placeholders([w], (c, inter, hidden),
                                       lambda: np.pad(w, ((0, pad), (0, 0))).reshape(c, inter, hidden))

    cols = zeros_like_placeholders([s_down], (c, hidden, inter), lambda: np.pad(s_down, ((0, 0), (0, pad)))
                                   .reshape(hidden, c, inter).transpose(1, 0, 2))          # [c, H, I]
    return _concat([gate, rows(s_gate)], 0), _concat([up, rows(s_up)], 0), _concat([down, cols], 0)


def canonical_weights(layer: int, router: np.ndarray, gate_up: np.ndarray, down: np.ndarray, n_experts: int,
                      shared_size: int) -> dict[str, np.ndarray]:
    """The inverse of the stacking above: a layer's canonical MoE weights from its router ``[E (+1), H]``,
    ``gate_up`` ``[E', 2I, H]`` and ``down`` ``[E', H, I]`` (the quality report reads them)."""
    inter = gate_up.shape[1] // 2
    out = {name(Tensor.FFN_GATE_INP, layer): router[:n_experts], name(Tensor.FFN_GATE_EXPS, layer): gate_up[:n_experts, :inter],
           name(Tensor.FFN_UP_EXPS, layer): gate_up[:n_experts, inter:], name(Tensor.FFN_DOWN_EXPS, layer): down[:n_experts]}
    if shared_size:
        rows = lambda w: w.reshape(-1, w.shape[-1])[:shared_size]                              # noqa: E731
        out[name(Tensor.FFN_GATE_SHEXP, layer)] = rows(gate_up[n_experts:, :inter])
        out[name(Tensor.FFN_UP_SHEXP, layer)] = rows(gate_up[n_experts:, inter:])
        out[name(Tensor.FFN_DOWN_SHEXP, layer)] = down[n_experts:].transpose(1, 0, 2).reshape(down.shape[1], -1)[:, :shared_size]
    if router.shape[0] > n_experts:
        out[name(Tensor.FFN_GATE_INP_SHEXP, layer)] = router[n_experts:]
    return out
