"""Lowering: a planned static module + a target -> the artifact's ``Plan`` for that arch.

Each IR node becomes exactly one launch of an ``artifacts.kernel_abi`` op; an MLP_DECODE node also
adds two ``pack_mlp_tiles`` launches to the ``init`` graph, which lay its weights out as its
kernel reads them (``artifacts/mlp_tiles.py``), once at load. The arguments are
resolved here (arena buffers from the memory plan, weights by name, scalars from shapes and
attributes) and ``targets.select`` picks the kernel and launch shape for the target. Nothing
about the file layout or the runner lives here.
"""

from __future__ import annotations

from grokc.abi import mlp_tiles
from grokc.abi.ops import KERNEL_ABI, ArgKind
from grokc.artifacts.plan import Arg, Buffer, BufferKind, GraphPlan, Launch, Plan
from grokc.core.errors import UnsupportedOp
from grokc.core.ir import AttnMode, DType, Graph, Module, Node, OpKind, TensorType, WeightFormat
from grokc.core.meta import MemoryPlan
from grokc.passes.fuse_moe import ROUTING
from grokc.targets import KernelCall, Target, select


def lower(module: Module, target: Target) -> Plan:
    mem = module.meta.memory
    assert mem is not None, "lowering needs memory_plan to have run"
    buffers: dict[str, Buffer] = {}
    for p in mem.state.values():
        kind = BufferKind.IO if p.buffer.startswith("io.") else BufferKind.STATE
        buffers[p.buffer] = Buffer(p.buffer, kind, p.type.dtype.value, tuple(p.type.shape), p.offset)
    for per_graph in mem.scratch.values():
        for p in per_graph.values():
            buffers[p.buffer] = Buffer(p.buffer, BufferKind.SCRATCH, p.type.dtype.value, tuple(p.type.shape), p.offset)
    graphs, init = {}, []
    for name, g in module.graphs.items():
        launches = tuple(_launch(module, g, mem, n, target) for n in g.nodes)
        logits = mem.placement(name, g.outputs[0]).buffer
        tokens = g.tensors[g.nodes[0].outputs[0]].shape[0]
        graphs[name] = GraphPlan(name, tokens, launches, logits)
        init += [p for n in g.nodes if n.op is OpKind.MLP_DECODE for p in _pack_mlp_tiles(module, mem, n, target)]
    if init:
        graphs["init"] = GraphPlan("init", 0, tuple(init), "")
    plan = Plan(target.name, mem.arena_bytes, buffers, graphs)
    plan.validate()
    return plan


def _launch(module: Module, g: Graph, mem: MemoryPlan, n: Node, target: Target) -> Launch:
    if n.op not in _OPS:
        raise UnsupportedOp(f"op '{n.op.value}' (node {n.name}) survived the passes but has no kernel; "
                            "the fusion passes should have absorbed it")
    op, attrs, refs, dims = _OPS[n.op](module, g, n)
    args = []
    for p in KERNEL_ABI[op]:
        if p.kind is not ArgKind.PTR:
            args.append(Arg(p.name, value=dims[p.name]))
            continue
        src = refs.get(p.name)
        if src is None:
            args.append(Arg(p.name))
        elif src in module.params:
            args.append(Arg(p.name, weight=src))
        else:
            args.append(Arg(p.name, buffer=mem.placement(g.name, src).buffer))
    nulls = frozenset(p.name for p in KERNEL_ABI[op] if p.optional and refs.get(p.name) is None)
    choice = select(KernelCall(op, attrs, dims, nulls), target)
    return Launch(op, choice.kernel, choice.grid, choice.block, choice.smem, tuple(args), attrs, n.name, choice.rule,
                  choice.pdl)


# Each lowering returns (abi op, variant attrs, pointer params -> tensor/param names, scalar params).

def _embedding(m: Module, g: Graph, n: Node):
    t, h = g.tensors[n.outputs[0]].shape
    refs = {r: n.inputs.get(r) for r in ("tokens", "table", "scales", "zeros")}
    return "embedding", {"weight_format": n.attrs.weight_format.value}, {"out": n.outputs[0], **refs}, \
        {"n": t, "hidden": h, "vocab": m.params[n.inputs["table"]].shape[0], "group_size": n.attrs.group_size,
         "scale": n.attrs.scale}


def _type(m: Module, g: Graph, name: str) -> TensorType:
    return g.tensors[name] if name in g.tensors else m.state[name]


def _linear(m: Module, g: Graph, n: Node):
    a = n.attrs
    x = _type(m, g, n.inputs["x"])
    out = g.tensors[n.outputs[0]]
    quantized = a.weight_format in (WeightFormat.Q4, WeightFormat.Q8)
    refs = {
        "out": n.outputs[0], "x": n.inputs["x"],
        "weight": n.inputs["qweight" if quantized else "weight"], "scales": n.inputs.get("scales"),
        "zeros": n.inputs.get("zeros"), "norm": n.inputs.get("norm"), "residual": n.inputs.get("residual"),
        "addend": n.inputs.get("addend"), "bias": n.inputs.get("bias"),
    }
    attrs = {"weight_format": a.weight_format.value, "act": a.act.value,
             "out_dtype": "f32" if out.dtype.value == "float32" else "f16"}
    for role in ("x", "residual"):  # f32 inputs: the batch-1 decode graph's layer sums (fuse_decode_mlp)
        src = n.inputs.get(role)
        if src is not None and _type(m, g, src).dtype is DType.F32:
            attrs[f"{role}_dtype"] = "f32"
    dims = {"M": x.shape[0], "N": out.shape[1], "K": x.shape[1], "group_size": a.group_size,
            "eps": a.norm_eps if a.norm_eps is not None else 0.0}
    return "linear", attrs, refs, dims


def _mlp_sizes(m: Module, n: Node) -> dict[str, int]:
    hidden, half_inter = m.params[n.inputs["down"]].shape
    return {"hidden": hidden, "inter": 2 * half_inter}


def _mlp_decode(m: Module, g: Graph, n: Node):
    roles = ("acc", "clear", "x", "norm", "gate_up_tiles", "gate_up_scales", "gate_up_zeros", "down_tiles",
             "down_scales", "down_zeros")
    return "mlp_decode", {"weight_format": "q4"}, {r: n.inputs.get(r) for r in roles}, \
        {**_mlp_sizes(m, n), "eps": n.attrs.norm_eps}


def _pack_mlp_tiles(m: Module, mem: MemoryPlan, n: Node, target: Target) -> list[Launch]:
    """The ``init`` launches that lay an MLP_DECODE node's weights out as its kernel streams them."""
    launches = []
    for part in mlp_tiles.Part:
        name = part.name.lower()
        dims = {**_mlp_sizes(m, n), "part": int(part)}
        refs = {"out": Arg("out", buffer=mem.state[n.inputs[f"{name}_tiles"]].buffer),
                "weight": Arg("weight", weight=n.inputs[name])}
        args = tuple(refs.get(p.name) or Arg(p.name, value=dims[p.name]) for p in KERNEL_ABI["pack_mlp_tiles"])
        choice = select(KernelCall("pack_mlp_tiles", {}, dims), target)
        launches.append(Launch("pack_mlp_tiles", choice.kernel, choice.grid, choice.block, choice.smem, args, {},
                               f"init:{n.inputs[name]}", choice.rule, choice.pdl))
    return launches


def _sparse_residual(m: Module, g: Graph, n: Node):
    x = _type(m, g, n.inputs["x"])
    rows, nw = g.tensors[n.outputs[0]].shape
    refs = {"out": n.outputs[0], **{r: n.inputs.get(r) for r in ("x", "norm", "rowptr", "cols", "vals")}}
    dims = {"M": rows, "NW": nw, "K": x.shape[1], "eps": n.attrs.norm_eps if n.attrs.norm_eps is not None else 0.0}
    return "sparse_residual", {}, refs, dims


def _attention(m: Module, g: Graph, n: Node):
    a = n.attrs
    shapes, rope = m.meta.shapes, m.meta.rope_table(n.inputs["rope_table"])
    prefill = a.mode is AttnMode.PREFILL
    refs = {"out": n.outputs[0], **{r: n.inputs[r] for r in ("qkv", "rope_table", "inv_freq", "k_cache", "v_cache",
                                                              "block_table")}}
    refs.update({r: n.inputs[r] for r in (("slot", "n_real") if prefill else ("positions", "active"))})
    dims = {"L" if prefill else "B": g.tensors[n.inputs["qkv"]].shape[0], "n_heads": a.n_heads,
            "n_kv_heads": a.n_kv_heads, "head_dim": a.head_dim, "table_len": rope.table_length,
            "max_blocks": shapes.max_blocks_per_seq, "window": a.window, "scale": a.scale, "mscale": rope.mscale,
            "softcap": a.softcap}
    return ("attention_prefill" if prefill else "attention_decode"), {}, refs, dims


def _rms_norm(m: Module, g: Graph, n: Node):
    if n.attrs.group:
        raise UnsupportedOp(f"per-head rms_norm '{n.name}' survived the passes; fuse_attention should have made "
                            "it a qk_norm")
    rows, hidden = g.tensors[n.outputs[0]].shape
    refs = {"out": n.outputs[0], "x": n.inputs["x"], "weight": n.inputs["weight"], "residual": n.inputs.get("residual")}
    return "rms_norm", {}, refs, {"M": rows, "hidden": hidden, "eps": n.attrs.eps}


def _qk_norm(m: Module, g: Graph, n: Node):
    a = n.attrs
    refs = {"out": n.outputs[0], **{r: n.inputs[r] for r in ("qkv", "q_norm", "k_norm")}}
    return "qk_norm", {}, refs, {"M": g.tensors[n.outputs[0]].shape[0], "n_heads": a.n_heads,
                                 "n_kv_heads": a.n_kv_heads, "head_dim": a.head_dim, "eps": a.eps}


def _take_last(m: Module, g: Graph, n: Node):
    return "take_last", {}, {"out": n.outputs[0], "x": n.inputs["x"], "n_real": n.inputs["n_real"]}, \
        {"hidden": g.tensors[n.outputs[0]].shape[1]}


def _sample(m: Module, g: Graph, n: Node):
    rows, vocab = g.tensors[n.inputs["logits"]].shape
    refs = dict(n.inputs)
    dims = {"M": rows, "V": vocab, "n_eos": m.params[n.inputs["eos_ids"]].shape[0],
            "max_out": m.meta.shapes.max_seq}
    return "sample", {}, refs, dims


def _moe_route(m: Module, g: Graph, n: Node):
    a = n.attrs
    refs = {**dict(zip(ROUTING, n.outputs)), "logits": n.inputs["logits"], "n_real": n.inputs.get("n_real")}
    dims = {"T": g.tensors[n.outputs[0]].shape[0], "n_experts": a.n_experts, "top_k": a.top_k,
            "n_shared": a.n_shared, "norm_top_k": int(a.norm_top_k), "shared_gate": int(a.shared_gate)}
    return "moe_route", {}, refs, dims


def _stacked(g: Graph, n: Node) -> int:
    """The experts a MoE launch's ``offsets`` cover (shared chunks included)."""
    return g.tensors[n.inputs["offsets"]].shape[0] - 1


def _moe_gather(m: Module, g: Graph, n: Node):
    t, s, h = g.tensors[n.outputs[0]].shape
    refs = {"out": n.outputs[0], **{r: n.inputs.get(r) for r in ("x", "norm", "row_token", "offsets")}}
    eps = n.attrs.norm_eps
    return "moe_gather", {}, refs, {"T": t, "R": t * s, "hidden": h, "n_experts": _stacked(g, n),
                                    "eps": 0.0 if eps is None else eps}


def _moe_linear(m: Module, g: Graph, n: Node):
    a = n.attrs
    t, s, k = g.tensors[n.inputs["x"]].shape
    out = g.tensors[n.outputs[0]]
    q4 = a.weight_format is WeightFormat.Q4
    refs = {"out": n.outputs[0], "x": n.inputs["x"], "weight": n.inputs["qweight" if q4 else "weight"],
            **{r: n.inputs.get(r) for r in ("scales", "zeros", "offsets", "active")}}
    attrs = {"weight_format": a.weight_format.value, "act": a.act.value,
             "out_dtype": "f32" if out.dtype is DType.F32 else "f16"}
    return "moe_linear", attrs, refs, {"T": t, "R": t * s, "N": out.shape[2], "K": k, "group_size": a.group_size,
                                       "n_experts": a.n_experts}


def _moe_combine(m: Module, g: Graph, n: Node):
    t, h = g.tensors[n.outputs[0]].shape
    refs = {"out": n.outputs[0], **{r: n.inputs.get(r) for r in ("y", "weights", "slot_rows", "residual")}}
    return "moe_combine", {}, refs, {"T": t, "hidden": h, "S": g.tensors[n.inputs["weights"]].shape[1]}


_OPS = {
    OpKind.EMBEDDING: _embedding,
    OpKind.LINEAR: _linear,
    OpKind.SPARSE_RESIDUAL: _sparse_residual,
    OpKind.MLP_DECODE: _mlp_decode,
    OpKind.ATTENTION: _attention,
    OpKind.RMS_NORM: _rms_norm,
    OpKind.QK_NORM: _qk_norm,
    OpKind.TAKE_LAST: _take_last,
    OpKind.SAMPLE: _sample,
    OpKind.MOE_ROUTE: _moe_route,
    OpKind.MOE_GATHER: _moe_gather,
    OpKind.MOE_LINEAR: _moe_linear,
    OpKind.MOE_COMBINE: _moe_combine,
}
