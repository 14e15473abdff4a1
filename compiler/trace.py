"""torch.export -> grokc IR.

The model is built on the ``meta`` device (no weight memory) and exported once with a dynamic
token dimension ``T``; each ATen or ``grokc::`` node maps to one IR node through ``_CONVERTERS``.
Anything else is refused with an ``UnsupportedOp`` naming the op. Parameter values do not come
from the trace: ``trace_module`` attaches the loaded weights by name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping

import numpy as np
import torch

from grokc.compiler import models
from grokc.compiler.models import transformer
from grokc.core.config import ModelConfig
from grokc.core.errors import UnsupportedModel, UnsupportedOp
from grokc.core.ir import (
    Act,
    AttentionAttrs,
    DType,
    EmbeddingAttrs,
    Graph,
    LinearAttrs,
    Module,
    MoeAttrs,
    Node,
    OpKind,
    RmsNormAttrs,
    RopeAttrs,
    TensorType,
    frozen_array,
)


def export_model(cfg: ModelConfig) -> torch.export.ExportedProgram:
    """``torch.export`` of grokc's torch model of ``cfg``'s architecture for one sequence of ``T``
    tokens (weights on ``meta``)."""
    with torch.device("meta"):
        model = models.get(cfg.architecture).model(cfg).eval()
    t = torch.export.Dim("T", min=2, max=max(cfg.max_position_embeddings, 4))
    example = (torch.zeros(8, dtype=torch.int32, device="meta"), torch.zeros(8, dtype=torch.int32, device="meta"))
    return torch.export.export(model, example, dynamic_shapes={"tokens": {0: t}, "positions": {0: t}}, strict=False)


def trace_module(cfg: ModelConfig, weights: Mapping[str, np.ndarray]) -> Module:
    """The IR module ``{"forward": graph}`` of the model, with ``weights`` (canonical names) attached.

    ``forward`` maps ``tokens [T] i32`` and ``positions [T] i32`` to ``logits [T, vocab] f32``;
    activations are typed f16 (grokc's residual stream), parameters keep their loaded dtype.
    """
    arch = models.get(cfg.architecture)
    ep = export_model(cfg)
    graph = _convert(ep)
    attached = {**transformer.parameters(cfg, weights), **arch.model.constants(cfg)}   # logit_scale folded in
    params = {name: frozen_array(np.asarray(a)) for name, a in attached.items()}
    missing = sorted(
        src for n in graph.nodes for src in n.inputs.values() if src not in params and src not in graph.tensors
    )
    if missing:
        raise UnsupportedModel(f"the model file lacks tensor '{missing[0]}' that a {arch.name} model needs")
    return Module(config=cfg, graphs={"forward": graph}, params=params)


def _convert(ep: torch.export.ExportedProgram) -> Graph:
    sig = ep.graph_signature
    fx_to_ir: dict[str, str] = {}   # fx node name -> IR tensor or parameter name
    tensors: dict[str, TensorType] = {}
    nodes: list[Node] = []
    inputs: list[str] = []
    outputs: list[str] = []
    layer_of_attention = iter(range(1 << 30))
    used_names: set[str] = set()

    for fx in ep.graph.nodes:
        if fx.op == "placeholder":
            if fx.name in sig.inputs_to_parameters:
                fx_to_ir[fx.name] = sig.inputs_to_parameters[fx.name]
            elif fx.name in sig.inputs_to_buffers:
                fx_to_ir[fx.name] = sig.inputs_to_buffers[fx.name]
            else:
                fx_to_ir[fx.name] = fx.name
                inputs.append(fx.name)
                tensors[fx.name] = TensorType(("T",), DType.I32)
        elif fx.op == "call_function":
            convert = _CONVERTERS.get(fx.target)
            if convert is None:
                raise UnsupportedOp(f"unsupported op '{fx.target}' in the traced model; grokc lowers: "
                                    + ", ".join(sorted(str(k) for k in _CONVERTERS)))
            name = _unique(_node_name(fx), used_names)
            node = convert(fx, name, [fx_to_ir.get(a.name) if isinstance(a, torch.fx.Node) else a for a in fx.args],
                           layer_of_attention)
            fx_to_ir[fx.name] = name
            tensors[name] = TensorType(_shape(fx), DType.F16)
            nodes.append(node)
        elif fx.op == "output":
            outputs = [fx_to_ir[a.name] for a in fx.args[0]]
    for out in outputs:  # logits leave the graph in f32
        tensors[out] = TensorType(tensors[out].shape, DType.F32)
        nodes = [replace(n, attrs=replace(n.attrs, out_dtype=DType.F32)) if n.name == out else n for n in nodes]
    return Graph("forward", tuple(nodes), tuple(inputs), tuple(outputs), tensors)


def _shape(fx: torch.fx.Node) -> tuple:
    return tuple(d if isinstance(d, int) else "T" for d in fx.meta["val"].shape)


def _node_name(fx: torch.fx.Node) -> str:
    stack = fx.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else ""
    op = str(fx.target).split(".")[-2] if "." in str(fx.target) else str(fx.target)
    module_leaf = path.split(".")[-1] if path else ""
    if path and module_leaf.startswith(("attn_", "ffn_", "output", "token_embd")) and op in ("linear", "embedding", "rms_norm"):
        return path
    if not path and op == "linear":
        return "output"
    return f"{path}.{op}" if path else op


def _unique(name: str, used: set[str]) -> str:
    candidate, i = name, 1
    while candidate in used:
        candidate, i = f"{name}.{i}", i + 1
    used.add(candidate)
    return candidate


Converter = Callable[[torch.fx.Node, str, list, object], Node]


def _embedding(fx, name, a, _):
    return Node(OpKind.EMBEDDING, name, {"table": a[1], "tokens": a[0]}, (name,), EmbeddingAttrs(scale=float(a[2])))


def _rms_norm(fx, name, a, _):
    return Node(OpKind.RMS_NORM, name, {"x": a[0], "weight": a[1]}, (name,), RmsNormAttrs(eps=float(a[2])))


def _head_rms_norm(fx, name, a, _):
    group = int(fx.args[1].meta["val"].shape[0])
    return Node(OpKind.RMS_NORM, name, {"x": a[0], "weight": a[1]}, (name,), RmsNormAttrs(float(a[2]), group))


def _linear(fx, name, a, _):
    bias = {"bias": a[2]} if len(a) > 2 and a[2] is not None else {}
    return Node(OpKind.LINEAR, name, {"x": a[0], "weight": a[1], **bias}, (name,), LinearAttrs())


def _rope(fx, name, a, _):
    """The frequencies ``inv_freq``; a longrope's short-factor ones (arguments 5, 6) stay out of the
    IR: ``passes/rope_table.py`` builds the per-position table from the RoPE config."""
    x_shape = fx.args[0].meta["val"].shape
    head_dim = int(a[3])
    return Node(OpKind.ROPE, name, {"x": a[0], "positions": a[1], "inv_freq": a[2]}, (name,),
                RopeAttrs(head_dim=head_dim, n_heads=int(x_shape[1]) // head_dim))


def _attention(fx, name, a, layers):
    attrs = AttentionAttrs(layer=next(layers), n_heads=int(a[3]), n_kv_heads=int(a[4]), head_dim=int(a[5]),
                           scale=float(a[6]), window=int(a[7]) if len(a) > 7 else 0,
                           softcap=float(a[8]) if len(a) > 8 else 0.0)
    return Node(OpKind.ATTENTION, name, {"q": a[0], "k": a[1], "v": a[2]}, (name,), attrs)


def _binary(op: OpKind) -> Converter:
    def convert(fx, name, a, _):
        return Node(op, name, {"a": a[0], "b": a[1]}, (name,))
    return convert


def _silu(fx, name, a, _):
    return Node(OpKind.SILU, name, {"x": a[0]}, (name,))


_MOE_ROLES = ("x", "router", "gate_exps", "up_exps", "down_exps", "shexp_gate", "shexp_up", "shexp_down",
              "shexp_gate_inp")
_MOE_ACTS = {"silu": Act.SILU_MUL, "gelu_tanh": Act.GELU_TANH_MUL}


def _moe(fx, name, a, _):
    inputs = {role: src for role, src in zip(_MOE_ROLES, a) if src is not None}
    top_k, norm_top_k, act = a[len(_MOE_ROLES):]
    attrs = MoeAttrs(n_experts=int(fx.args[1].meta["val"].shape[0]), top_k=int(top_k), norm_top_k=bool(norm_top_k),
                     act=_MOE_ACTS[act], shared="shexp_gate" in inputs, shared_gate="shexp_gate_inp" in inputs)
    return Node(OpKind.MOE, name, inputs, (name,), attrs)


def _gelu(fx, name, a, _):
    approximate = fx.kwargs.get("approximate", a[1] if len(a) > 1 else "none")
    if approximate != "tanh":
        raise UnsupportedOp(f"'{name}' is GELU with approximate={approximate!r}; grokc lowers the tanh form only")
    return Node(OpKind.GELU_TANH, name, {"x": a[0]}, (name,))


_CONVERTERS: dict[object, Converter] = {
    torch.ops.grokc.embedding.default: _embedding,
    torch.ops.grokc.rms_norm.default: _rms_norm,
    torch.ops.grokc.head_rms_norm.default: _head_rms_norm,
    torch.ops.aten.linear.default: _linear,
    torch.ops.grokc.rope.default: _rope,
    torch.ops.grokc.attention.default: _attention,
    torch.ops.aten.add.Tensor: _binary(OpKind.ADD),
    torch.ops.aten.mul.Tensor: _binary(OpKind.MUL),
    torch.ops.aten.silu.default: _silu,
    torch.ops.aten.gelu.default: _gelu,
    torch.ops.grokc.moe.default: _moe,
}
