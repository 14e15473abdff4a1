"""grokc's graph IR: the only place that defines ops.

A ``Module`` holds one or more ``Graph``s (``forward`` after tracing; ``prefill_<L>`` and
``decode`` after ``passes/static_shapes.py``), the parameters as read-only numpy arrays, the
persistent state buffers (KV cache, per-step inputs) the graphs share, and a record of what the
passes decided (``meta``, ``core/meta.py``: shapes, RoPE table, quantization, memory plan).

Graphs are SSA: every tensor is produced once, by a node or as a graph input. Node inputs are
named by role (``{"x": "blk.0.attn_norm", "weight": "blk.0.attn_q.weight"}``) so an op's optional
inputs are explicit. A role may name an intermediate tensor, a graph input, a parameter, or a
state buffer; ``verify`` checks that every name resolves.

Shapes are written llama.cpp-style in comments: ``# [n_tokens, n_embd]``. Before static shapes,
the token dimension is the symbol ``T``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping, Union

import numpy as np

from grokc.core.config import ModelConfig
from grokc.core.meta import ModuleMeta


class DType(enum.Enum):
    F32 = "float32"
    F16 = "float16"
    I32 = "int32"
    U8 = "uint8"

    @property
    def itemsize(self) -> int:
        return np.dtype(self.value).itemsize


Dim = Union[int, str]  # a size, or a symbol ("T") before static shapes


@dataclass(frozen=True)
class TensorType:
    shape: tuple[Dim, ...]
    dtype: DType

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def nbytes(self) -> int:
        assert self.is_static, f"nbytes of a symbolic shape {self.shape}"
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class OpKind(enum.Enum):
    # Produced by the frontend (compiler/trace.py).
    EMBEDDING = "embedding"        # x: tokens [T] i32, table [V, H]          -> [T, H] (times attrs.scale)
    RMS_NORM = "rms_norm"          # x [T, H], weight [H or group] (+ residual) -> [T, H]
    LINEAR = "linear"              # x [T, K], weight [N, K] (+ bias, fused inputs) -> [T, N]
    ROPE = "rope"                  # x [T, heads*D], positions [T]            -> same
    ATTENTION = "attention"        # q, k, v [T, heads*D] (+ cache inputs)    -> [T, NH*D]
    ADD = "add"                    # a, b                                     -> a + b
    MUL = "mul"                    # a, b                                     -> a * b
    SILU = "silu"                  # x                                        -> x * sigmoid(x)
    MOE = "moe"                    # x [T, H], router, experts (+ shared)     -> [T, H] (MoeAttrs)
    GELU_TANH = "gelu_tanh"        # x                                        -> tanh-approximated GELU
    # Introduced by passes/fuse_attention.py.
    QK_NORM = "qk_norm"            # qkv [T, (NH+2NKV)*D], q_norm, k_norm [D]  -> same, q and k heads normalised
    # Introduced by passes/static_shapes.py.
    TAKE_LAST = "take_last"        # x [L, H], n_real [1]                     -> [1, H]
    SAMPLE = "sample"              # logits [M, V] + slot state               -> (state updates)
    # Introduced by passes/sparse_residual.py.
    SPARSE_RESIDUAL = "sparse_residual"  # x [T, K], rowptr/cols/vals (+ norm)  -> [T, NW] f32
    # Introduced by passes/fuse_decode_mlp.py.
    MLP_DECODE = "mlp_decode"      # x [1, H] + gate_up/down weights -> (acc state += x + mlp(x), clear state = 0)
    # Introduced by passes/fuse_moe.py (a MOE node's launches; S = slots a token fills, top_k + shared).
    MOE_ROUTE = "moe_route"        # logits [T, E(+1)] f32 -> weights [T, S] f32, slot_rows [T, S], row_token [T, S],
                                   #                          offsets [E'+1], active [E'+1] (i32)
    MOE_GATHER = "moe_gather"      # x [T, H] (+ norm), row_token, offsets    -> [T, S, H]: rows grouped by expert
    MOE_LINEAR = "moe_linear"      # x [T, S, K], experts [E', NW, K], offsets, active -> [T, S, N]
    MOE_COMBINE = "moe_combine"    # y [T, S, H] f32, weights, slot_rows (+ residual) -> [T, H]


class WeightFormat(enum.Enum):
    F32 = "f32"  # as loaded, before quantization
    F16 = "f16"
    Q4 = "q4"    # abi/int4.py layout with f16 scales (and optional f16 zeros)
    Q8 = "q8"    # abi/int8.py layout (u8 codes) with f16 scales (and optional f16 zeros): embedding tables, the LM head


class Act(enum.Enum):
    NONE = "none"
    SILU_MUL = "silu_mul"            # weight holds [gate; up]: y = silu(x@gate^T) * (x@up^T)
    GELU_TANH_MUL = "gelu_tanh_mul"  # the same with tanh-approximated GELU (GeGLU)


class AttnMode(enum.Enum):
    CAUSAL = "causal"    # frontend: causal attention over the T given tokens, no cache
    PREFILL = "prefill"  # static: one padded sequence into a slot of the KV cache
    DECODE = "decode"    # static: one token for each of B slots, reading the KV cache


@dataclass(frozen=True)
class NoAttrs:
    pass


@dataclass(frozen=True)
class RmsNormAttrs:
    """``group`` > 0: every ``group`` consecutive elements of a row are normalised on their own
    (per-head q/k norms; weight ``[group]``), which ``fuse_attention`` turns into a QK_NORM. An
    ungrouped norm may take an input role ``residual`` added to its result (``fuse_epilogues``)."""

    eps: float
    group: int = 0


@dataclass(frozen=True)
class QkNormAttrs:
    """RMSNorm of each q head by ``q_norm`` and each k head by ``k_norm`` in a fused qkv tensor."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float


@dataclass(frozen=True)
class EmbeddingAttrs:
    """``weight_format`` and ``group_size`` describe the stored table: f32 as traced, f16, or q8/q4
    codes with ``scales`` and optionally ``zeros`` input roles beside ``table`` (``passes/quantize.py``)."""

    weight_format: WeightFormat = WeightFormat.F32
    group_size: int = 0  # 0: one scale per row
    scale: float = 1.0   # rows are multiplied by it (Gemma 3: sqrt(hidden))


@dataclass(frozen=True)
class LinearAttrs:
    """``weight_format`` and ``group_size`` describe the stored weight; ``norm_eps`` is set when an
    RMSNorm is fused in front (input role ``norm``); ``bias`` (``[N]``, or ``[2N]`` with a gated
    activation) and ``residual`` are optional input roles, and so
    are a q4 weight's sparse f16 correction (``residual_rowptr``/``_cols``/``_vals``, from
    ``passes/quantize.py``) and ``addend`` (f32 ``[T, NW]`` added to the products, from
    ``passes/sparse_residual.py``)."""

    weight_format: WeightFormat = WeightFormat.F32
    group_size: int = 0  # 0: one scale per output channel
    act: Act = Act.NONE
    norm_eps: float | None = None
    out_dtype: DType = DType.F16


@dataclass(frozen=True)
class SparseResidualAttrs:
    """The prologue of the LINEAR whose ``addend`` this node computes: ``norm_eps`` is set when the
    node reads that linear's fused RMSNorm (input role ``norm``)."""

    norm_eps: float | None = None


@dataclass(frozen=True)
class MlpDecodeAttrs:
    """A batch-1 SwiGLU MLP added into an f32 state sum (kernel_abi's ``mlp_decode``): ``norm_eps``
    of the RMSNorm in front (input role ``norm``); both weights q4 per output channel."""

    norm_eps: float


@dataclass(frozen=True)
class MoeAttrs:
    """A MOE node as the frontend traces it (``compiler/models/moe.py``): input roles ``x``,
    ``router`` [E, H], ``gate_exps``/``up_exps`` [E, I, H], ``down_exps`` [E, H, I], and with a
    shared expert ``shexp_gate``/``shexp_up`` [Is, H], ``shexp_down`` [H, Is] (+ ``shexp_gate_inp``
    [H] when ``shared_gate``). ``act`` is the experts' gated activation."""

    n_experts: int
    top_k: int
    norm_top_k: bool
    act: Act
    shared: bool = False
    shared_gate: bool = False


@dataclass(frozen=True)
class MoeRouteAttrs:
    """``kernel_abi``'s ``moe_route``: ``n_shared`` shared-expert slots (experts ``n_experts`` ..)
    follow each token's ``top_k`` routed ones; ``shared_gate``: the logits' last column gates them."""

    n_experts: int
    top_k: int
    norm_top_k: bool
    n_shared: int = 0
    shared_gate: bool = False

    @property
    def slots(self) -> int:
        return self.top_k + self.n_shared


@dataclass(frozen=True)
class MoeGatherAttrs:
    norm_eps: float | None = None   # set: rows are RMS-normalised by the input role ``norm``


@dataclass(frozen=True)
class MoeLinearAttrs:
    """``kernel_abi``'s ``moe_linear`` over ``n_experts`` stacked experts (shared chunks included)."""

    n_experts: int
    act: Act = Act.NONE
    weight_format: WeightFormat = WeightFormat.F32
    group_size: int = 0
    out_dtype: DType = DType.F16


@dataclass(frozen=True)
class RopeAttrs:
    head_dim: int
    n_heads: int


@dataclass(frozen=True)
class AttentionAttrs:
    """With ``fused_rope`` the node takes one ``qkv`` input and rotates q and k itself, reading the
    ``rope_table`` and ``inv_freq`` parameters (``passes/fuse_attention.py``)."""

    layer: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scale: float
    mode: AttnMode = AttnMode.CAUSAL
    fused_rope: bool = False
    window: int = 0    # keys a query sees, itself included (a local layer); 0: every earlier position
    softcap: float = 0.0   # scaled scores s become softcap * tanh(s / softcap) (Grok-1); 0: none


Attrs = Union[NoAttrs, RmsNormAttrs, QkNormAttrs, EmbeddingAttrs, LinearAttrs, SparseResidualAttrs, MlpDecodeAttrs,
              RopeAttrs, AttentionAttrs, MoeAttrs, MoeRouteAttrs, MoeGatherAttrs, MoeLinearAttrs]


@dataclass(frozen=True)
class Node:
    op: OpKind
    name: str
    inputs: Mapping[str, str]     # role -> tensor/parameter/state name
    outputs: tuple[str, ...]
    attrs: Attrs = field(default_factory=NoAttrs)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", MappingProxyType(dict(self.inputs)))


@dataclass(frozen=True)
class Graph:
    name: str
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]               # per-call inputs (before static shapes) or io state names
    outputs: tuple[str, ...]
    tensors: Mapping[str, TensorType]     # every intermediate, input and output

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))

    def producers(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        uses: dict[str, list[Node]] = {}
        for n in self.nodes:
            for name in n.inputs.values():
                uses.setdefault(name, []).append(n)
        for name in self.outputs:
            uses.setdefault(name, [])
        return uses


@dataclass(frozen=True)
class Module:
    config: ModelConfig
    graphs: Mapping[str, Graph]
    params: Mapping[str, np.ndarray]       # read-only arrays
    state: Mapping[str, TensorType] = field(default_factory=dict)  # persistent buffers
    meta: ModuleMeta = field(default_factory=ModuleMeta)          # what the passes decided

    def __post_init__(self) -> None:
        for key in ("graphs", "params", "state"):
            object.__setattr__(self, key, MappingProxyType(dict(getattr(self, key))))

    def with_(self, **changes: Any) -> "Module":
        return replace(self, **changes)

    def param_type(self, name: str) -> TensorType:
        a = self.params[name]
        return TensorType(tuple(a.shape), DType(a.dtype.name))


def frozen_array(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``, as parameters are stored (C-contiguous unless ``a`` was read-only
    already, e.g. a zero-stride placeholder of synthetic weights)."""
    if not a.flags.writeable:
        return a
    a = np.ascontiguousarray(a).view()
    a.flags.writeable = False
    return a


def verify(module: Module) -> None:
    """Check the IR's invariants; raises AssertionError (an internal bug) on the first violation.

    Every node input resolves to a tensor defined earlier in its graph, a graph input, a
    parameter or a state buffer; every output is defined once; graph outputs are defined;
    parameters are read-only.
    """
    for name, arr in module.params.items():
        assert not arr.flags.writeable, f"parameter {name} is writeable"
    for g in module.graphs.values():
        defined = set(g.inputs)
        for n in g.nodes:
            for role, src in n.inputs.items():
                assert src in defined or src in module.params or src in module.state, (
                    f"{g.name}/{n.name}: input {role}={src} is not defined before use"
                )
            for out in n.outputs:
                assert out not in defined, f"{g.name}/{n.name}: {out} defined twice"
                assert out in g.tensors, f"{g.name}/{n.name}: output {out} has no type"
                defined.add(out)
        for out in g.outputs:
            assert out in defined, f"{g.name}: output {out} is never produced"
