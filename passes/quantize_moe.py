"""Quantize the mixture-of-experts launches' weights: every expert per output channel (or group).

What: the stacked weight of each MOE_LINEAR (``[E', NW, K]``) is stored by the recipe's
``weight_format`` like a LINEAR's, expert by expert: int4 codes ``.qweight`` u8 ``[E', NW, K/2]``
with ``.scales`` (and ``.zeros``) f16 ``[E', NW, G]``, rounded to nearest or by GPTQ with each
expert's own input statistics (``tensors.expert_key``; ``compiler/calibrate_moe.py`` says how
rarely routed experts get theirs), or f16. The router (a LINEAR whose weight is
``ffn_gate_inp``) stays f16 whatever the recipe: it is ``E x H``, small beside the experts, and its
top-k choice is discontinuous in its weights.

Requires: ``fuse_moe`` (MOE_LINEAR nodes with f32 weights); run before ``quantize``, which then
leaves the router (already f16) and these weights alone.
Guarantees: MOE_LINEAR attrs carry ``weight_format`` and ``group_size``; a q4 one reads
``qweight``, ``scales`` (and ``zeros``) in place of ``weight``; deterministic.
Not handled: the fp16 residual (``--fp16-residual`` applies to the dense linears only), int8.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from grokc.core import tensors as names
from grokc.core.ir import Module, Node, OpKind, WeightFormat, frozen_array
from grokc.core.rowwise import as_f16, rowwise
from grokc.passes._graph import rebuild_graph, rebuild_module
from grokc.quant.calibration import Calibration
from grokc.quant.recipe import QuantRecipe
from grokc.quant.weights import pack_int4, quantize_weight


def run(module: Module, recipe: QuantRecipe, calibration: Calibration | None = None) -> Module:
    new_params: dict[str, np.ndarray] = {}
    graphs = {gname: rebuild_graph(g, [_quantize(n, module, recipe, calibration, new_params) for n in g.nodes])
              for gname, g in module.graphs.items()}
    return rebuild_module(module, graphs, new_params)


def _is_router(n: Node) -> bool:
    parsed = names.parse(n.inputs.get("weight", ""))
    return n.op is OpKind.LINEAR and parsed is not None and parsed[0] is names.Tensor.FFN_GATE_INP


def _quantize(n: Node, module: Module, recipe: QuantRecipe, calibration: Calibration | None, out: dict) -> Node:
    if _is_router(n) and n.attrs.weight_format is WeightFormat.F32:
        out[n.inputs["weight"]] = frozen_array(as_f16(module.params[n.inputs["weight"]]))
        return replace(n, attrs=replace(n.attrs, weight_format=WeightFormat.F16))
    if n.op is not OpKind.MOE_LINEAR or n.attrs.weight_format is not WeightFormat.F32:
        return n
    wname = n.inputs["weight"]
    w = module.params[wname]                                           # [E', NW, K]
    if recipe.weight_format is WeightFormat.F16:
        out[wname] = frozen_array(as_f16(w))
        return replace(n, attrs=replace(n.attrs, weight_format=WeightFormat.F16))
    hessians = None
    if recipe.calibrated:
        hessians = [calibration.hessian(names.expert_key(wname, e), w.shape[2]) for e in range(w.shape[0])]
    base = wname.removesuffix(".weight")
    inputs = {r: s for r, s in n.inputs.items() if r != "weight"}
    for suffix, stack in zip(("qweight", "scales", "zeros"), _experts_q4(w, replace(recipe, fp16_residual=0.0), hessians)):
        if stack is not None:
            out[f"{base}.{suffix}"] = frozen_array(stack)
            inputs[suffix] = f"{base}.{suffix}"
    return Node(n.op, n.name, inputs, n.outputs,
                replace(n.attrs, weight_format=WeightFormat.Q4, group_size=recipe.group_size))


@rowwise
def _experts_q4(w: np.ndarray, recipe: QuantRecipe, hessians: list[np.ndarray] | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Packed codes, scales and zeros of each expert of ``w`` ``[E', NW, K]``, stacked (a synthetic
    placeholder: one expert's, broadcast)."""
    parts = []
    for e in range(w.shape[0]):
        codes, scales, zeros, _ = quantize_weight(w[e], recipe, None if hessians is None else hessians[e])
        parts.append((pack_int4(codes), scales, zeros))
    return tuple(None if p[0] is None else np.stack(p) for p in zip(*parts))
