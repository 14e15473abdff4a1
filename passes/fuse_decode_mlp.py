"""Fuse each SwiGLU MLP of the batch-1 decode graph into one MLP_DECODE whose result is an f32 sum.

What: in ``decode_1``, ``LINEAR(x=h1, norm, act=silu_mul) -> LINEAR(residual=h1)`` (gate_up, then
down adding the residual) becomes one ``MLP_DECODE``: its kernel computes each block's share of
the activations and adds down's partial products straight into an f32 state buffer, so down never
waits for the whole of gate_up (``targets/kernels/mlp_decode.cuh``). The layer output that down
wrote as f16 is now that state buffer; its readers (the next layer's qkv ``x`` and o ``residual``,
the LM head's ``x``) read it as f32, which the ``linear`` ABI rounds to f16 as it is read, so every
value means what it meant before. The kernel adds into its buffer, which must be zero on entry:
MLP ``l`` clears the buffer MLP ``l + 1`` adds into (the last clears the first's, for the next
step; the arena starts zeroed), so ``l`` and ``l + 1`` never share one: two buffers, alternating,
and a third for the last layer when the count is odd. The kernel streams the weights' codes in its
own layouts (``artifacts/mlp_tiles.py``): each MLP gets two state buffers that lowering's ``init``
graph fills from the stored weights at load (the other graphs keep reading the stored layout).

Requires: static shapes (``decode_1``), quantized q4 per-channel MLP weights, run before
``memory_plan``; ``fits(hidden, inter)`` says whether every target of the build has the kernel
(``targets/rules_mlp.py``; ``compiler/build.py`` asks it for each ``--arch``).
Guarantees: other graphs untouched; ``decode_1``'s logits and tokens are those of the unfused graph
up to the order of f32 additions inside down (the CPU executor gives identical bits); new state
``decode.mlp_acc.<i>`` f32 ``[1, hidden]``, and ``decode.mlp_tiles.<layer>.gate_up`` / ``.down``
u8, as large as the weights' codes (the node keeps the stored weights as inputs ``gate_up`` and
``down``, for the packing).
Not handled (left unfused): other batch sizes, grouped or f16 MLP weights, graphs with sparse
f16 residuals (their ``sparse_residual`` nodes read x as f16), shapes ``fits`` refuses.
"""

from __future__ import annotations

from typing import Callable

from grokc.core.ir import Act, DType, Graph, LinearAttrs, MlpDecodeAttrs, Module, Node, OpKind, TensorType, WeightFormat
from grokc.passes._graph import rebuild_graph, rebuild_module, single_use

GRAPH = "decode_1"
STATE = "decode.mlp_acc"
TILES = "decode.mlp_tiles"


def run(module: Module, fits: Callable[[int, int], bool]) -> Module:
    g = module.graphs.get(GRAPH)
    if g is None or any(n.op is OpKind.SPARSE_RESIDUAL for n in g.nodes):
        return module
    pairs = _mlp_pairs(g)
    if not pairs:
        return module
    hidden, inter = g.tensors[pairs[0][1].outputs[0]].shape[1], g.tensors[pairs[0][0].outputs[0]].shape[1]
    if not fits(hidden, inter):
        return module
    n = len(pairs)
    accs = [f"{STATE}.{i}" for i in range(2 if n % 2 == 0 else 3)]
    acc_of = [accs[2] if (n % 2 and layer == n - 1) else accs[layer % 2] for layer in range(n)]
    fused, dropped, renames, tiles = {}, set(), {}, {}
    for layer, (gate_up, down) in enumerate(pairs):
        for part, node in (("gate_up", gate_up), ("down", down)):
            tiles[f"{TILES}.{layer}.{part}"] = TensorType((module.params[node.inputs["qweight"]].size,), DType.U8)
        fused[gate_up.name] = Node(OpKind.MLP_DECODE, gate_up.name.replace("ffn_gate_up", "ffn"), {
            "x": gate_up.inputs["x"], "norm": gate_up.inputs["norm"],
            "gate_up": gate_up.inputs["qweight"], "gate_up_scales": gate_up.inputs["scales"],
            **({"gate_up_zeros": gate_up.inputs["zeros"]} if "zeros" in gate_up.inputs else {}),
            "gate_up_tiles": f"{TILES}.{layer}.gate_up",
            "down": down.inputs["qweight"], "down_scales": down.inputs["scales"], "down_tiles": f"{TILES}.{layer}.down",
            **({"down_zeros": down.inputs["zeros"]} if "zeros" in down.inputs else {}),
            "acc": acc_of[layer], "clear": acc_of[(layer + 1) % n],
        }, (), MlpDecodeAttrs(gate_up.attrs.norm_eps))
        dropped.add(down.name)
        renames[down.outputs[0]] = acc_of[layer]
    nodes = [fused.get(x.name, x) for x in g.nodes if x.name not in dropped]
    state = {**module.state, **{a: TensorType((1, hidden), DType.F32) for a in accs}, **tiles}
    return rebuild_module(module, {**module.graphs, GRAPH: rebuild_graph(g, nodes, renames=renames)}, state=state)


def _q4_per_channel(n: Node) -> bool:
    a = n.attrs
    return (isinstance(a, LinearAttrs) and a.weight_format is WeightFormat.Q4 and a.group_size == 0
            and "addend" not in n.inputs)


def _mlp_pairs(g: Graph) -> list[tuple[Node, Node]]:
    """(gate_up, down) of every MLP, in order: q4 per channel, down adding gate_up's input as residual."""
    prod = g.producers()
    pairs = []
    for down in g.nodes:
        if down.op is not OpKind.LINEAR or not _q4_per_channel(down) or down.attrs.act is not Act.NONE:
            continue
        gate_up = prod.get(down.inputs["x"])
        ok = (gate_up is not None and gate_up.op is OpKind.LINEAR and _q4_per_channel(gate_up)
              and gate_up.attrs.act is Act.SILU_MUL and gate_up.attrs.norm_eps is not None
              and down.inputs.get("residual") == gate_up.inputs["x"] and down.attrs.norm_eps is None
              and g.tensors[gate_up.inputs["x"]].shape[0] == 1 and single_use(g, gate_up.outputs[0])
              and down.outputs[0] not in g.outputs and down.attrs.out_dtype is DType.F16)
        if ok:
            pairs.append((gate_up, down))
    return pairs
