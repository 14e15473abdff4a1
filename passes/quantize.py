"""Weight quantization: the recipe registry and the pass that applies a recipe.

What: every LINEAR weight becomes either f16 or packed int4 (``artifacts/int4.py``) with one f16
scale per output channel (``group_size == 0``) or per group of ``group_size`` input channels,
symmetric (code 8 is zero) or asymmetric (an f16 zero-point per scale), optionally with a sparse
f16 residual: the ``fp16_residual`` fraction of the entries the grid serves worst, kept exact
beside the codes (after round-to-nearest: ``sparse_residual.select``; inside GPTQ's column loop,
so later columns compensate the rest: ``gptq.quantize_gptq_residual``). The codes come from
round-to-nearest (``rounding.py``) or from GPTQ's calibrated rounding (``gptq.py``), which needs
the second moments of every linear's inputs (``Calibration``, measured by the driver in
``compiler/calibrate.py``; this pass never runs the model). The LM head (the LINEAR whose output
is the graph's logits) is f16, int8 or int4 by ``recipe.lm_head`` (int8: ``artifacts/int8.py`` codes,
one scale per output channel, symmetric or asymmetric like the recipe, always round-to-nearest and
never a residual: GPTQ and ``fp16_residual`` apply to int4 weights only); the embedding table is f16, int8 or
int4 by ``recipe.embeddings`` (``quantize_embedding``: always round-to-nearest, never a residual);
the norm weights become f16. Activations are untouched: the residual stream stays f16.

A tied LM head (one that reads the embedding table) keeps its own copy whenever the two are stored
differently: an int4 head becomes ``output.qweight``/``.scales``/``.zeros`` (int8: ``output.q8weight``
and the same), and an f16 head of a
quantized table becomes ``output.weight`` (the f16 table, under the head's name), so
``token_embd.*`` always names what the ``embedding`` op reads. Sharing one quantized table between
the two happens in one case: a symmetric int8 head of an int8 table holds exactly the table's codes
and scales (both ``int8_rtn`` per row, zero 128), so it reads ``token_embd.q8weight``/``.scales``
and the artifact stores them once. int4 would need the same group layout for both, and a GPTQ
head's codes would become round-to-nearest on the embedding's grid.

Requires: unquantized (f32) parameters; run after the fusion passes that concatenate weights
(quantization is row by row, so concatenating rows and quantizing commute; the fused q/k/v and
gate/up weights share their input and so their Hessian, ``names.input_key``).
Guarantees: LINEAR and EMBEDDING attrs carry ``weight_format`` and ``group_size``; a q8/q4
EMBEDDING's inputs are ``table`` (``token_embd.q8weight`` or ``.qweight``), ``scales`` and, when
asymmetric int4, ``zeros``; a q4 or q8 LINEAR's inputs are
``qweight``, ``scales`` and optionally ``zeros`` instead of ``weight`` (the LM head's are named
``output.*``, or ``token_embd.*`` when shared as above; only the LM head is q8, with ``group_size`` 0), plus ``residual_rowptr``, ``residual_cols`` and ``residual_vals`` (weights
``<base>.residual_*``) when the recipe keeps a residual; ``meta["quant"]`` records the recipe
and how it was calibrated. Deterministic: the
same weights and statistics give the same bytes.
Not handled: int8 activations; int8 transformer-block linears; GPTQ for int8; GPTQ or asymmetric int8
for the embedding table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from grokc.artifacts import int4, int8
from grokc.artifacts.errors import BuildOptionError
from grokc.compiler import names
from grokc.compiler.ir import EmbeddingAttrs, Module, Node, OpKind, WeightFormat, frozen_array

from ._graph import rebuild_graph, rebuild_module
from ._rowwise import as_f16, rowwise
from . import sparse_residual
from .gptq import quantize_gptq_residual
from .rounding import int8_rtn, quantize_rtn

# Largest --fp16-residual: each kept entry costs 6 bytes (i32 column, f16 value), so at 10% the
# residual already outweighs the int4 codes it corrects (0.6 vs 0.5 bytes per weight).
MAX_RESIDUAL = 0.1


class Rounding(enum.Enum):
    RTN = "rtn"    # round to nearest (rounding.py)
    GPTQ = "gptq"  # calibrated error compensation (gptq.py)


@dataclass(frozen=True)
class QuantRecipe:
    """A weight-quantization scheme. ``name`` is how ``--quant`` and the manifest call it."""

    name: str
    weight_format: WeightFormat          # of the transformer-block LINEARs
    group_size: int = 0                  # 0: per output channel
    symmetric: bool = True
    rounding: Rounding = Rounding.RTN
    act_order: bool = False              # GPTQ: visit columns by decreasing input energy
    clip_search: bool = False            # GPTQ per channel: shrink each row's range where that lowers the error
    damp: float = 0.01                   # GPTQ: fraction of the mean Hessian diagonal added to it
    lm_head: WeightFormat = WeightFormat.F16
    fp16_residual: float = 0.0           # fraction of each int4 weight's entries kept as f16 corrections
    embeddings: WeightFormat = WeightFormat.F16  # the token embedding table: f16, q8 or q4 (round to nearest)

    def __post_init__(self) -> None:
        if self.weight_format not in (WeightFormat.F16, WeightFormat.Q4):
            raise BuildOptionError(f"quantization '{self.name}' must store f16 or q4 weights")
        if self.lm_head not in (WeightFormat.F16, WeightFormat.Q8, WeightFormat.Q4):
            raise BuildOptionError(f"--lm-head {self.lm_head.value} is not supported; choose fp16, int8 or int4")
        if self.embeddings not in (WeightFormat.F16, WeightFormat.Q8, WeightFormat.Q4):
            raise BuildOptionError(f"--embeddings {self.embeddings.value} is not supported; choose fp16, int8 or int4")
        if self.group_size < 0 or (self.group_size and self.group_size % 8):
            raise BuildOptionError(
                f"--group-size {self.group_size} is invalid; use 0 (per output channel) or a positive multiple of 8"
            )
        if self.rounding is Rounding.GPTQ and WeightFormat.Q4 not in (self.weight_format, self.lm_head):
            raise BuildOptionError(f"quantization '{self.name}' asks for GPTQ rounding but stores no int4 weights")
        if self.rounding is Rounding.RTN and (self.act_order or self.clip_search):
            raise BuildOptionError(f"quantization '{self.name}': act_order and clip_search need GPTQ rounding")
        if self.clip_search and self.group_size and not self.act_order:
            raise BuildOptionError(f"quantization '{self.name}': clip_search with groups needs act_order "
                                   "(static group scales)")
        if not 0 < self.damp < 1:
            raise BuildOptionError(f"quantization '{self.name}': damp {self.damp} must lie in (0, 1)")
        if not 0 <= self.fp16_residual <= MAX_RESIDUAL:
            raise BuildOptionError(f"--fp16-residual {self.fp16_residual:.4g} is outside [0, {MAX_RESIDUAL:.0%}]; "
                                   "use a small fraction of the weights such as 0.5% (0 turns it off)")
        if self.fp16_residual and WeightFormat.Q4 not in (self.weight_format, self.lm_head):
            raise BuildOptionError(f"--fp16-residual corrects int4 weights but quantization '{self.name}' stores "
                                   "none; choose an int4 recipe or --lm-head int4")

    @property
    def calibrated(self) -> bool:
        """True when the recipe needs calibration statistics (``Calibration``)."""
        return self.rounding is Rounding.GPTQ

    @property
    def summary(self) -> str:
        """One line for ``--help`` and ``grokc inspect``."""
        if self.weight_format is WeightFormat.F16:
            return "f16 weights"
        parts = ["per output channel" if not self.group_size else f"groups of {self.group_size}",
                 "symmetric" if self.symmetric else "asymmetric"]
        if self.calibrated:
            parts.append("GPTQ" + "".join(f", {x}" for x, on in (("act-order", self.act_order),
                                                                 ("clip search", self.clip_search)) if on))
        else:
            parts.append("round to nearest")
        if self.fp16_residual:
            parts.append(f"fp16 residual {self.fp16_residual:.3g}")
        return ", ".join(parts)

    def uncalibrated(self) -> "QuantRecipe":
        """The same layout with round-to-nearest codes (for weights whose values do not matter)."""
        return replace(self, rounding=Rounding.RTN, act_order=False, clip_search=False)

    def to_json(self) -> dict:
        return {"name": self.name, "weight_format": self.weight_format.value, "group_size": self.group_size,
                "symmetric": self.symmetric, "rounding": self.rounding.value, "act_order": self.act_order,
                "clip_search": self.clip_search, "damp": self.damp, "lm_head": self.lm_head.value,
                "embeddings": self.embeddings.value,
                **({"fp16_residual": self.fp16_residual} if self.fp16_residual else {})}  # absent when off: same bytes as before


@dataclass(frozen=True)
class Calibration:
    """What GPTQ needs from calibration text, measured by the driver (``compiler/calibrate.py``).

    ``hessians`` maps ``names.input_key(weight)`` (``names.LM_HEAD`` for the LM head) to the f32
    ``[K, K]`` mean of ``x^T x`` over the calibration tokens of that linear's input ``x``;
    ``info`` says how it was measured (text, samples, tokens, seed) and goes into the manifest.
    """

    hessians: Mapping[str, np.ndarray]
    info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key, h in self.hessians.items():
            if h.ndim != 2 or h.shape[0] != h.shape[1]:
                raise BuildOptionError(f"calibration statistics for {key} have shape {h.shape}; they must be square")
        object.__setattr__(self, "hessians", MappingProxyType(dict(self.hessians)))
        object.__setattr__(self, "info", MappingProxyType(dict(self.info)))

    def hessian(self, key: str, k: int) -> np.ndarray:
        if key not in self.hessians:
            raise BuildOptionError(f"the calibration statistics lack {key}; recalibrate with this model")
        h = self.hessians[key]
        if h.shape != (k, k):
            raise BuildOptionError(f"the calibration statistics for {key} are {h.shape[0]}-wide but the "
                                   f"weight has {k} inputs; recalibrate with this model")
        return h


_A = dict(weight_format=WeightFormat.Q4, symmetric=False, rounding=Rounding.GPTQ, act_order=True, clip_search=True)
QUANT: dict[str, QuantRecipe] = {
    "int4": QuantRecipe("int4", **_A),
    "int4-g128": QuantRecipe("int4-g128", **_A, group_size=128),
    "int4-g64": QuantRecipe("int4-g64", **_A, group_size=64),
    "int4-rtn": QuantRecipe("int4-rtn", WeightFormat.Q4),
    "int4-g64-rtn": QuantRecipe("int4-g64-rtn", WeightFormat.Q4, group_size=64, symmetric=False),
    "fp16": QuantRecipe("fp16", WeightFormat.F16),
}


pack_int4 = rowwise(int4.pack)   # a synthetic build's placeholder codes stay one row


def quantize_weight(w: np.ndarray, recipe: QuantRecipe, hessian: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, tuple[np.ndarray, ...] | None]:
    """int4 ``(codes, scales, zeros, residual)`` of one f32 weight ``[N, K]`` by ``recipe`` (GPTQ needs
    ``hessian [K, K]``); ``residual`` is the fp16 correction as CSR ``(rowptr, cols, vals)``, or None
    when the recipe keeps none."""
    if recipe.calibrated:
        codes, scales, zeros, dense = quantize_gptq_residual(
            w, hessian, recipe.group_size, recipe.symmetric, keep=recipe.fp16_residual, damp=recipe.damp,
            act_order=recipe.act_order, clip_search=recipe.clip_search)
        return codes, scales, zeros, sparse_residual.from_dense(dense) if recipe.fp16_residual else None
    codes, scales, zeros = quantize_rtn(w, recipe.group_size, recipe.symmetric)
    if not recipe.fp16_residual:
        return codes, scales, zeros, None
    wq = int4.dequantize(int4.pack(codes), scales, zeros, recipe.group_size)
    return codes, scales, zeros, sparse_residual.select(w, wq, recipe.fp16_residual)


def dequantized_weight(w: np.ndarray, recipe: QuantRecipe, hessian: np.ndarray | None = None) -> np.ndarray:
    """f32 ``[N, K]``: ``w`` as the kernels will see it after ``quantize_weight`` (fp16 residual included)."""
    codes, scales, zeros, residual = quantize_weight(w, recipe, hessian)
    wq = int4.dequantize(int4.pack(codes), scales, zeros, recipe.group_size)
    return wq if residual is None else sparse_residual.scatter(wq, *residual)


def embedding_group_size(hidden: int, recipe: QuantRecipe) -> int:
    """The group size of an int4 table: the recipe's when it is > 0 and divides ``hidden``, else 0 (per row)."""
    return recipe.group_size if recipe.group_size and hidden % recipe.group_size == 0 else 0


def quantize_embedding(table: np.ndarray, recipe: QuantRecipe
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """``(codes, scales, zeros, group_size)`` of an f32 embedding table ``[V, H]`` by ``recipe.embeddings``
    (q8 or q4), as ``kernel_abi``'s ``embedding`` op reads them.

    q4: round-to-nearest (``quantize_rtn``), symmetric or asymmetric by the recipe, one scale per row
    or per group (``embedding_group_size``); codes packed as ``artifacts/int4.py`` says, u8 ``[V, H/2]``.
    q8: symmetric round-to-nearest per row (``int8_rtn``), u8 ``[V, H]`` codes with code 128 as zero;
    ``zeros`` is None and ``group_size`` 0.
    """
    h = table.shape[1]
    if recipe.embeddings is WeightFormat.Q8:
        codes, scales, _ = int8_rtn(table)
        return codes, scales, None, 0
    if h % 8:
        raise BuildOptionError(f"--embeddings int4 packs 8 codes per word but the hidden size is {h}; "
                               "choose --embeddings int8 or fp16")
    gs = embedding_group_size(h, recipe)
    codes, scales, zeros = quantize_rtn(table, gs, recipe.symmetric)
    return pack_int4(codes), scales, zeros, gs


def dequantized_embedding(table: np.ndarray, recipe: QuantRecipe) -> np.ndarray:
    """f32 ``[V, H]``: ``table`` as the ``embedding`` op will see it (f16-rounded when the recipe keeps f16)."""
    if recipe.embeddings is WeightFormat.F16:
        return table.astype(np.float16).astype(np.float32)
    codes, scales, zeros, gs = quantize_embedding(table, recipe)
    return (int4 if recipe.embeddings is WeightFormat.Q4 else int8).dequantize(codes, scales, zeros, gs)


def run(module: Module, recipe: QuantRecipe, calibration: Calibration | None = None) -> Module:
    """Quantize every LINEAR weight by ``recipe`` (GPTQ ones with ``calibration``) and the embedding
    table by ``recipe.embeddings``; norms become f16."""
    if recipe.calibrated and calibration is None:
        raise BuildOptionError(f"quantization '{recipe.name}' is calibrated but no calibration statistics were given")
    new_params: dict[str, np.ndarray] = {}
    tables = {n.inputs["table"] for g in module.graphs.values() for n in g.nodes if n.op is OpKind.EMBEDDING}
    graphs = {}
    for gname, g in module.graphs.items():
        nodes = []
        for n in g.nodes:
            if n.op is OpKind.LINEAR and n.attrs.weight_format is WeightFormat.F32:
                is_head = n.outputs[0] in g.outputs
                tied = is_head and n.inputs["weight"] in tables
                n = _quantize_linear(n, module, is_head, recipe, calibration, new_params, tied)
            elif n.op is OpKind.EMBEDDING and n.attrs.weight_format is WeightFormat.F32:
                n = _quantize_embedding(n, module, recipe, new_params)
            nodes.append(n)
        graphs[gname] = rebuild_graph(g, nodes)
    for name, a in module.params.items():  # embeddings, norms, any other f32 weight: f16
        if name not in new_params and a.dtype == np.float32 and a.ndim >= 1 and not name.startswith("rope_"):
            new_params[name] = frozen_array(as_f16(a))
    quant = recipe.to_json()
    if recipe.calibrated:
        quant["calibration"] = dict(calibration.info)
    return rebuild_module(module, graphs, new_params, meta={**module.meta, "quant": quant})


def _quantize_embedding(n: Node, module: Module, recipe: QuantRecipe, out: dict) -> Node:
    tname = n.inputs["table"]
    fmt = recipe.embeddings
    if fmt is WeightFormat.F16:
        out[tname] = frozen_array(as_f16(module.params[tname]))
        return replace(n, attrs=EmbeddingAttrs(fmt))
    base = tname.removesuffix(".weight")
    codes_name = f"{base}.q8weight" if fmt is WeightFormat.Q8 else f"{base}.qweight"
    codes, scales, zeros, gs = quantize_embedding(module.params[tname], recipe)
    out[codes_name], out[f"{base}.scales"] = frozen_array(codes), frozen_array(scales)
    inputs = {"tokens": n.inputs["tokens"], "table": codes_name, "scales": f"{base}.scales"}
    if zeros is not None:
        out[f"{base}.zeros"] = frozen_array(zeros)
        inputs["zeros"] = f"{base}.zeros"
    return Node(n.op, n.name, inputs, n.outputs, EmbeddingAttrs(fmt, gs))


def _quantize_linear(n: Node, module: Module, is_head: bool, recipe: QuantRecipe, calibration: Calibration | None,
                     out: dict, tied: bool = False) -> Node:
    """``tied``: the node is the LM head and reads the embedding table's weight."""
    wname = n.inputs["weight"]
    w = module.params[wname]
    fmt = recipe.lm_head if is_head else recipe.weight_format
    if fmt is WeightFormat.F16:
        if tied and recipe.embeddings is not WeightFormat.F16:   # the f16 head keeps the f16 table as its own weight
            out[names.LM_HEAD] = frozen_array(as_f16(w))
            return replace(n, inputs={**n.inputs, "weight": names.LM_HEAD}, attrs=replace(n.attrs, weight_format=fmt))
        out[wname] = frozen_array(as_f16(w))
        return replace(n, attrs=replace(n.attrs, weight_format=fmt))
    base = names.LM_HEAD.removesuffix(".weight") if is_head else wname.removesuffix(".weight")
    if fmt is WeightFormat.Q8:
        codes, scales, zeros = int8_rtn(w, recipe.symmetric)
        if tied and recipe.embeddings is WeightFormat.Q8 and zeros is None:   # the table's own codes: one copy
            base = wname.removesuffix(".weight")
        return _with_codes(n, out, base, fmt, 0, {"q8weight": codes, "scales": scales, "zeros": zeros})
    h = calibration.hessian(names.LM_HEAD if is_head else names.input_key(wname), w.shape[1]) if recipe.calibrated else None
    codes, scales, zeros, residual = quantize_weight(w, recipe, h)
    stored = {"qweight": pack_int4(codes), "scales": scales, "zeros": zeros,
              **dict(zip(sparse_residual.ROLES, residual or (None,) * len(sparse_residual.ROLES)))}
    return _with_codes(n, out, base, fmt, recipe.group_size, stored)


def _with_codes(n: Node, out: dict, base: str, fmt: WeightFormat, group_size: int,
                stored: dict[str, np.ndarray | None]) -> Node:
    """``n`` reading quantized weights in place of ``weight``: each non-None ``stored[suffix]`` becomes
    the param ``<base>.<suffix>`` in ``out`` and an input of the node; the codes (``qweight`` or
    ``q8weight``) take the input role ``qweight``, every other suffix is its own role."""
    inputs = {r: s for r, s in n.inputs.items() if r != "weight"}
    for suffix, a in stored.items():
        if a is not None:
            out[f"{base}.{suffix}"] = frozen_array(a)
            inputs["qweight" if suffix in ("qweight", "q8weight") else suffix] = f"{base}.{suffix}"
    return Node(n.op, n.name, inputs, n.outputs, replace(n.attrs, weight_format=fmt, group_size=group_size))
