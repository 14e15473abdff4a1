"""Weight quantization: the recipe registry and the pass that applies a recipe.

What: every LINEAR weight becomes either f16 or packed int4 (``abi/int4.py``) with one f16
scale per output channel (``group_size == 0``) or per group of ``group_size`` input channels,
symmetric (code 8 is zero) or asymmetric (an f16 zero-point per scale), optionally with a sparse
f16 residual: the ``fp16_residual`` fraction of the entries the grid serves worst, kept exact
beside the codes (after round-to-nearest: ``sparse_residual.select``; inside GPTQ's column loop,
so later columns compensate the rest: ``gptq.quantize_gptq_residual``). The codes come from
round-to-nearest (``rounding.py``) or from GPTQ's calibrated rounding (``gptq.py``), which needs
the second moments of every linear's inputs (``Calibration``, measured by the driver in
``compiler/calibrate.py``; this pass never runs the model). The LM head (the LINEAR whose output
is the graph's logits) is f16, int8 or int4 by ``recipe.lm_head`` (int8: ``abi/int8.py`` codes,
one scale per output channel, symmetric or asymmetric like the recipe, always round-to-nearest and
never a residual: GPTQ and ``fp16_residual`` apply to int4 weights only); the embedding table is f16, int8 or
int4 by ``recipe.embeddings`` (``quantize_embedding``: always round-to-nearest, never a residual);
the norm weights become f16. Activations are untouched: the residual stream stays f16.

A weight the source model stored as int4 blocks (``meta.carried``, from a graph frontend) that the
recipe stores as int4 keeps its own codes and grid (``quant/carried.py``): its group size and
symmetry are the source's, whatever the recipe says, and it gets no GPTQ and no residual (it holds
exactly the values the source computes with). ``meta.quant.carried`` says how many were kept.

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
``<base>.residual_*``) when the recipe keeps a residual; ``meta.quant`` records the recipe
and how it was calibrated. Deterministic: the
same weights and statistics give the same bytes.
Not handled: int8 activations; int8 transformer-block linears; GPTQ for int8; GPTQ or asymmetric int8
for the embedding table.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from grokc.core import tensors as names
from grokc.core.errors import BuildOptionError
from grokc.core.ir import (
    Module,
    Node,
    OpKind,
    WeightFormat,
    frozen_array,
)
from grokc.core.meta import QuantInfo
from grokc.core.rowwise import as_f16
from grokc.passes import sparse_residual
from grokc.passes._graph import rebuild_graph, rebuild_module
from grokc.quant import carried as carried_grids
from grokc.quant.calibration import Calibration, weight_key
from grokc.quant.recipe import QuantRecipe
from grokc.quant.rtn import int8_rtn
from grokc.quant.weights import pack_int4, quantize_embedding, quantize_weight


def run(module: Module, recipe: QuantRecipe, calibration: Calibration | None = None) -> Module:
    """Quantize every LINEAR weight by ``recipe`` (GPTQ ones with ``calibration``) and the embedding
    table by ``recipe.embeddings``; norms become f16."""
    if recipe.calibrated and calibration is None:
        raise BuildOptionError(f"quantization '{recipe.name}' is calibrated but no calibration statistics were given")
    new_params: dict[str, np.ndarray] = {}
    kept: list[str] = []   # carried weights stored on their own grid
    tables = {n.inputs["table"] for g in module.graphs.values() for n in g.nodes if n.op is OpKind.EMBEDDING}
    graphs = {}
    for gname, g in module.graphs.items():
        nodes = []
        for n in g.nodes:
            if n.op is OpKind.LINEAR and n.attrs.weight_format is WeightFormat.F32:
                is_head = n.outputs[0] in g.outputs
                tied = is_head and n.inputs["weight"] in tables
                n = _quantize_linear(n, module, is_head, recipe, calibration, new_params, tied, kept)
            elif n.op is OpKind.EMBEDDING and n.attrs.weight_format is WeightFormat.F32:
                n = _quantize_embedding(n, module, recipe, new_params)
            nodes.append(n)
        graphs[gname] = rebuild_graph(g, nodes)
    for name, a in module.params.items():  # embeddings, norms, any other f32 weight: f16
        if name not in new_params and a.dtype == np.float32 and a.ndim >= 1 and not name.startswith("rope_"):
            new_params[name] = frozen_array(as_f16(a))
    quant = QuantInfo(recipe.to_json(), dict(calibration.info) if recipe.calibrated else None,
                      carried=carried_grids.summary(module.meta.carried, kept) if kept else None)
    return rebuild_module(module, graphs, new_params, meta=replace(module.meta, quant=quant, carried={}))


def _quantize_embedding(n: Node, module: Module, recipe: QuantRecipe, out: dict) -> Node:
    tname = n.inputs["table"]
    fmt = recipe.embeddings
    if fmt is WeightFormat.F16:
        out[tname] = frozen_array(as_f16(module.params[tname]))
        return replace(n, attrs=replace(n.attrs, weight_format=fmt))
    base = tname.removesuffix(".weight")
    codes_name = f"{base}.q8weight" if fmt is WeightFormat.Q8 else f"{base}.qweight"
    codes, scales, zeros, gs = quantize_embedding(module.params[tname], recipe)
    out[codes_name], out[f"{base}.scales"] = frozen_array(codes), frozen_array(scales)
    inputs = {"tokens": n.inputs["tokens"], "table": codes_name, "scales": f"{base}.scales"}
    if zeros is not None:
        out[f"{base}.zeros"] = frozen_array(zeros)
        inputs["zeros"] = f"{base}.zeros"
    return Node(n.op, n.name, inputs, n.outputs, replace(n.attrs, weight_format=fmt, group_size=gs))


def _quantize_linear(n: Node, module: Module, is_head: bool, recipe: QuantRecipe, calibration: Calibration | None,
                     out: dict, tied: bool = False, kept: list[str] | None = None) -> Node:
    """``tied``: the node is the LM head and reads the embedding table's weight; ``kept`` collects the
    carried weights stored on their own grid."""
    wname = n.inputs["weight"]
    w = module.params[wname]
    if not is_head:
        recipe = recipe.for_weight(wname)
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
    grid = carried_grids.grid_for(module.meta.carried, names.LM_HEAD if is_head else wname)
    if fmt is WeightFormat.Q4 and grid is not None:
        codes, scales, zeros = carried_grids.codes_on_grid(w, grid)
        if kept is not None:
            kept.append(names.LM_HEAD if is_head else wname)
        return _with_codes(n, out, base, fmt, grid.group_size, {"qweight": pack_int4(codes), "scales": scales,
                                                               "zeros": zeros})
    h = calibration.hessian(names.LM_HEAD if is_head else names.input_key(wname), w.shape[1]) if recipe.calibrated else None
    done = calibration.quantized.get(weight_key(w, recipe.to_json(), h)) if h is not None and calibration.quantized else None
    codes, scales, zeros, residual = done or quantize_weight(w, recipe, h)   # done: sequential calibration's own
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
