"""A ``torch.export`` program -> ``OpGraph``: its ATen graph in the shared vocabulary (``graph/opgraph.py``).

Each ``call_function`` node becomes one ``OpNode`` named as the FX node, its tensor arguments (and
the symbolic sizes inside list arguments) as inputs, its other arguments normalised into the
attributes the rules read: ``aten.linear`` -> ``Linear``, ``aten.embedding`` -> ``Gather``,
``aten.transpose.int`` and ``permute`` -> ``Transpose`` with a ``perm``, ``aten.slice.Tensor`` ->
``Slice`` with ``starts``/``ends``/``axes``/``steps`` (and each piece of a ``chunk``/``split``, taken
by ``getitem``, the same), ``aten.mean.dim`` -> ``ReduceMean``,
``aten.to``/``_to_copy`` -> ``Cast``, ``aten.scaled_dot_product_attention`` -> ``SDPA``,
``aten.sym_size.int`` -> ``Size``, ``repeat_interleave`` (an int count) -> ``RepeatInterleave``, and so on (``_OPS``). A scalar operand of an arithmetic op
becomes a constant value. An ATen op without an entry keeps its own name: rules never match it,
so it is either a side value (masks, positions) or named as the node grokc cannot read.

Parameters, buffers and lifted constants are the graph's constants; the user inputs are its inputs.
The evaluator runs the nodes a side value depends on with real tensors (``aten`` ops called as
the program would; a node whose target is not a torch operator or Python arithmetic is refused), a ``Size`` of an activation answered from the shape the conversion gives it.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import fx

from grokc.compiler.frontends.graph.opgraph import OpGraph, OpNode
from grokc.core.errors import UnsupportedModel

_A = torch.ops.aten
_INT_MAX = 2 ** 63 - 1
_SKIP = {"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size", "sym_constrain_range"}
_PY_OPS = {operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
           operator.mod, operator.neg, operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
           torch.sym_int, torch.sym_float, torch.sym_max, torch.sym_min, torch.sym_not}
_PIECES = {"chunk", "split", "split_with_sizes"}   # read through the getitems that take their pieces


def to_opgraph(ep: torch.export.ExportedProgram, source: str) -> OpGraph:
    sig = ep.graph_signature
    named = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    state = {**ep.state_dict, **ep.constants}
    constants: dict[str, np.ndarray] = {}
    shapes: dict[str, tuple | None] = {}
    dtypes: dict[str, str] = {}
    inputs: list[str] = []
    nodes: list[OpNode] = []
    for n in ep.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            shapes[n.name] = tuple(int(d) if isinstance(d, int) else str(d) for d in val.shape)
            dtypes[n.name] = str(val.dtype).removeprefix("torch.")
        if n.op == "placeholder":
            if n.name in named:
                constants[n.name] = _numpy(state[named[n.name]])
            elif n.name in sig.user_inputs:
                inputs.append(n.name)
        elif n.op == "call_function":
            op = _op_name(n.target)
            if op in _SKIP or (op in _PIECES and all(_op_name(u.target) == "getitem" for u in n.users)):
                continue
            piece = _piece(n) if op == "getitem" else None
            nodes.append(piece or _translate(n, op, constants))
    out = next(n for n in ep.graph.nodes if n.op == "output")
    outputs = tuple(a.name for a in fx.node.map_aggregate(out.args[0], lambda a: a)
                    if isinstance(a, fx.Node)) if isinstance(out.args[0], (tuple, list)) else (out.args[0].name,)
    graph = OpGraph(tuple(nodes), tuple(inputs), outputs, shapes, dtypes, constants, evaluate=None, source=source)
    graph.evaluate = _Evaluator(ep, graph)
    return graph


def _op_name(target: Any) -> str:
    return getattr(target, "__name__", str(target)).split(".")[0]


def _translate(n: fx.Node, op: str, constants: dict[str, np.ndarray]) -> OpNode:
    args = list(n.args)
    kw = dict(n.kwargs)
    rank = len(n.args[0].meta["val"].shape) if args and isinstance(args[0], fx.Node) and isinstance(
        n.args[0].meta.get("val"), torch.Tensor) else 0

    def const(i: int, value: Any) -> str:
        name = f"{n.name}:{i}"
        constants[name] = np.asarray(value, np.float32 if isinstance(value, float) else np.int64)
        return name

    def operand(i: int) -> str:
        a = args[i] if i < len(args) else None
        return a.name if isinstance(a, fx.Node) else const(i, a)

    tensors = [a.name for a in args if isinstance(a, fx.Node)]
    symbolic = [a.name for a in fx.node.map_aggregate(args, lambda a: a) if isinstance(a, fx.Node)] \
        if any(isinstance(a, (list, tuple)) for a in args) else []
    extra = [s for s in symbolic if s not in tensors]
    entry = _OPS.get(op)
    if entry is None:
        return OpNode(n.name, f"aten.{op}", tuple(dict.fromkeys(tensors + extra)), (n.name,), {}, str(n.target))
    name, build = entry
    ins, attrs = build(args, kw, rank, operand)
    return OpNode(n.name, name, tuple(ins) + tuple(extra), (n.name,), attrs, str(n.target))


def _piece(n: fx.Node) -> OpNode | None:
    """``getitem(chunk|split|split_with_sizes(x, ..., dim), i)`` -> the ``Slice`` of ``x`` it is (the
    pieces' sizes from the split's own shapes); None when the sizes are symbolic or it is another getitem."""
    src = n.args[0]
    if not isinstance(src, fx.Node) or src.op != "call_function" or _op_name(src.target) not in _PIECES:
        return None
    x, vals = src.args[0], src.meta.get("val")
    rank = len(x.meta["val"].shape)
    dim = _axis(src.args[2] if len(src.args) > 2 else src.kwargs.get("dim", 0), rank)
    try:
        sizes = [int(t.shape[dim]) for t in vals]
    except (TypeError, AttributeError):   # a symbolic size: left for the message naming the node
        return None
    start = sum(sizes[: n.args[1]])
    return OpNode(n.name, "Slice", (x.name,), (n.name,),
                  {"axes": [dim], "starts": [start], "ends": [start + sizes[n.args[1]]], "steps": [1]}, str(src.target))


def _binary(args, kw, rank, operand):
    if kw.get("alpha", 1) != 1:
        return [operand(0), operand(1), "alpha"], {}
    return [operand(0), operand(1)], {}


def _axis(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _slice(args, kw, rank, operand):
    dim, start, end, step = (list(args) + [0, None, None, 1])[1:5] if len(args) > 1 else (0, None, None, 1)
    return [operand(0)], {"axes": [_axis(dim, rank)], "starts": [start or 0],
                          "ends": [_INT_MAX if end is None or end >= _INT_MAX else end], "steps": [step or 1]}


def _transpose(args, kw, rank, operand):
    perm = list(range(rank))
    a, b = _axis(args[1], rank), _axis(args[2], rank)
    perm[a], perm[b] = perm[b], perm[a]
    return [operand(0)], {"perm": perm}


def _sdpa(args, kw, rank, operand):
    mask = args[3] if len(args) > 3 else kw.get("attn_mask")
    attrs = {"scale": kw.get("scale"), "is_causal": int(bool(kw.get("is_causal", args[5] if len(args) > 5 else False))),
             "dropout_p": kw.get("dropout_p", args[4] if len(args) > 4 else 0.0), "enable_gqa": kw.get("enable_gqa")}
    return [operand(0), operand(1), operand(2)] + ([mask.name] if isinstance(mask, fx.Node) else []), attrs


def _repeat_interleave(args, kw, rank, operand):
    dim = args[2] if len(args) > 2 else kw.get("dim")
    return [operand(0)], {"repeats": args[1] if isinstance(args[1], int) else None,
                          "axis": None if dim is None else _axis(dim, rank)}


def _cast(args, kw, rank, operand):
    dtype = kw.get("dtype", args[1] if len(args) > 1 and isinstance(args[1], torch.dtype) else None)
    return [operand(0)], {"to": str(dtype).removeprefix("torch.") if dtype is not None else "same"}


_OPS = {
    "embedding": ("Gather", lambda a, k, r, o: ([o(0), o(1)], {"axis": 0})),
    "linear": ("Linear", lambda a, k, r, o: ([o(0), o(1)] + ([o(2)] if len(a) > 2 and a[2] is not None else []), {})),
    "mul": ("Mul", _binary), "add": ("Add", _binary), "sub": ("Sub", _binary), "div": ("Div", _binary),
    "pow": ("Pow", _binary),
    "mean": ("ReduceMean", lambda a, k, r, o: ([o(0)], {"axes": list(a[1]), "keepdims": int(bool(
        a[2] if len(a) > 2 else k.get("keepdim", False)))})),
    "rsqrt": ("Rsqrt", lambda a, k, r, o: ([o(0)], {})), "sqrt": ("Sqrt", lambda a, k, r, o: ([o(0)], {})),
    "reciprocal": ("Reciprocal", lambda a, k, r, o: ([o(0)], {})), "neg": ("Neg", lambda a, k, r, o: ([o(0)], {})),
    "cos": ("Cos", lambda a, k, r, o: ([o(0)], {})), "sin": ("Sin", lambda a, k, r, o: ([o(0)], {})),
    "sigmoid": ("Sigmoid", lambda a, k, r, o: ([o(0)], {})), "silu": ("Silu", lambda a, k, r, o: ([o(0)], {})),
    "to": ("Cast", _cast), "_to_copy": ("Cast", _cast), "clone": ("Identity", lambda a, k, r, o: ([o(0)], {})),
    "alias": ("Identity", lambda a, k, r, o: ([o(0)], {})), "contiguous": ("Identity", lambda a, k, r, o: ([o(0)], {})),
    "view": ("Reshape", lambda a, k, r, o: ([o(0)], {})), "reshape": ("Reshape", lambda a, k, r, o: ([o(0)], {})),
    "_unsafe_view": ("Reshape", lambda a, k, r, o: ([o(0)], {})),
    "transpose": ("Transpose", _transpose),
    "permute": ("Transpose", lambda a, k, r, o: ([o(0)], {"perm": [_axis(d, r) for d in a[1]]})),
    "unsqueeze": ("Unsqueeze", lambda a, k, r, o: ([o(0)], {"axes": [_axis(a[1], r + 1)]})),
    "expand": ("Expand", lambda a, k, r, o: ([o(0)], {})),
    "repeat_interleave": ("RepeatInterleave", _repeat_interleave),
    "slice": ("Slice", _slice),
    "cat": ("Concat", lambda a, k, r, o: ([t.name for t in a[0]], {"axis": a[1] if len(a) > 1 else k.get("dim", 0)})),
    "scaled_dot_product_attention": ("SDPA", _sdpa),
    "softmax": ("Softmax", lambda a, k, r, o: ([o(0)], {"axis": a[1]})),
    "_softmax": ("Softmax", lambda a, k, r, o: ([o(0)], {"axis": a[1]})),
    "matmul": ("MatMul", lambda a, k, r, o: ([o(0), o(1)], {})), "bmm": ("MatMul", lambda a, k, r, o: ([o(0), o(1)], {})),
    "sym_size": ("Size", lambda a, k, r, o: ([o(0)], {"dim": a[1]})),
    "rms_norm": ("RMSNormalization", lambda a, k, r, o: ([o(0), o(2)], {"epsilon": a[3] if len(a) > 3 else 1e-6,
                                                                        "axis": -1})),
}


def _callable_op(target: Any) -> bool:
    """An operator the evaluator may call: a torch operator (ATen or higher-order) or Python arithmetic."""
    return isinstance(target, (torch._ops.OperatorBase, torch._ops.OpOverloadPacket)) or target in _PY_OPS


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy()


class _Evaluator:
    """Run the nodes ``values`` depend on with real tensors (see the module doc)."""

    def __init__(self, ep: torch.export.ExportedProgram, graph: OpGraph):
        self._nodes = {n.name: n for n in ep.graph.nodes}
        self._order = {n.name: i for i, n in enumerate(ep.graph.nodes)}
        self._graph = graph

    def __call__(self, values: Sequence[str], feeds: Mapping[str, np.ndarray], shapes: Mapping[str, tuple]) -> list:
        env: dict[str, Any] = {}
        needed = self._cone(values, feeds, shapes, env)
        for name in sorted(needed, key=self._order.__getitem__):
            n = self._nodes[name]
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda a: env[a.name])
            if not _callable_op(n.target):
                raise UnsupportedModel(f"{self._graph.source}: node '{name}' calls {n.target!r}, which is not an "
                                       "ATen operator; grokc computes nothing else from a program")
            try:
                env[name] = n.target(*args, **kwargs)
            except Exception as exc:   # an ATen op fails on the probe  # noqa: BLE001
                raise UnsupportedModel(f"{self._graph.source}: cannot compute '{name}' ({n.target}) on a probe input "
                                       f"({type(exc).__name__}); grokc checks masks and rotary tables by computing "
                                       "them") from exc
        return [np.asarray(env[v].detach().numpy() if isinstance(env[v], torch.Tensor) else env[v]) for v in values]

    def _cone(self, values, feeds, shapes, env) -> set[str]:
        needed, stack = set(), list(values)
        while stack:
            v = stack.pop()
            if v in env or v in needed:
                continue
            n = self._nodes[v]
            if v in feeds:
                env[v] = torch.from_numpy(np.asarray(feeds[v]))
            elif v in self._graph.constants:
                env[v] = torch.from_numpy(np.array(self._graph.constants[v]))
            elif n.op == "call_function" and _op_name(n.target) == "sym_size" and n.args[0].name in shapes:
                env[v] = int(shapes[n.args[0].name][n.args[1]])
            elif n.op == "placeholder":
                raise UnsupportedModel(f"{self._graph.source}: '{v}' is needed to check the graph but no probe "
                                       "input stands for it")
            else:
                needed.add(v)
                stack.extend(a.name for a in n.all_input_nodes)
        return needed
