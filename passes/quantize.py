"""Weight quantization: the recipe registry, the round-to-nearest int4 quantizer, and the pass.

What: every LINEAR weight becomes either f16 or packed int4 (``artifacts/int4.py``) with one f16
scale per output channel (``group_size == 0``) or per group of ``group_size`` input channels,
symmetric (code 8 is zero) or asymmetric (an f16 zero-point per scale). The LM head (the LINEAR
whose output is the graph's logits), the embedding table and the norm weights stay f16 unless the
recipe says otherwise. Activations are untouched: the residual stream stays f16.

Requires: unquantized (f32) parameters; run after the fusion passes that concatenate weights
(per-output-channel scales make concatenation and quantization commute).
Guarantees: LINEAR attrs carry ``weight_format`` and ``group_size``; a q4 LINEAR's inputs are
``qweight``, ``scales`` and optionally ``zeros`` instead of ``weight``; ``meta["quant"]`` records
the recipe. Deterministic: the same weights give the same bytes.
Not handled: int8 activations; calibrated rounding lives in ``passes/gptq.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

import numpy as np

from grokc.artifacts import int4
from grokc.artifacts.errors import BuildOptionError
from grokc.compiler.ir import Module, Node, OpKind, WeightFormat, frozen_array

from ._graph import rebuild_graph, rebuild_module


@dataclass(frozen=True)
class QuantRecipe:
    """A weight-quantization scheme. ``name`` is how ``--quant`` and the manifest call it."""

    name: str
    weight_format: WeightFormat          # of the transformer-block LINEARs
    group_size: int = 0                  # 0: per output channel
    symmetric: bool = True

    def __post_init__(self) -> None:
        if self.weight_format not in (WeightFormat.F16, WeightFormat.Q4):
            raise BuildOptionError(f"quantization '{self.name}' must store f16 or q4 weights")
        if self.group_size < 0 or (self.group_size and self.group_size % 8):
            raise BuildOptionError(
                f"--group-size {self.group_size} is invalid; use 0 (per output channel) or a positive multiple of 8"
            )

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["weight_format"] = self.weight_format.value
        return d


QUANT: dict[str, QuantRecipe] = {
    "int4": QuantRecipe("int4", WeightFormat.Q4),
    "fp16": QuantRecipe("fp16", WeightFormat.F16),
}


def quantize_rtn(w: np.ndarray, group_size: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Round-to-nearest int4 of ``w`` f32 ``[N, K]``: ``(codes u8 [N, K], scales f16 [N, G], zeros f16 [N, G] | None)``.

    Symmetric: ``scale = absmax / 7``, ``code = round(w / scale) + 8`` in ``[1, 15]``. Asymmetric:
    ``scale = (max - min) / 15``, ``zero = round(-min / scale)``, ``code = round(w / scale) + zero``
    clipped to ``[0, 15]``. Scales are rounded to f16 before the codes are computed, so the codes
    are optimal for the scales the kernel will see. A last group shorter than ``group_size`` is
    allowed.
    """
    n, k = w.shape
    gs = group_size or k
    g = -(-k // gs)
    padded = np.pad(w.astype(np.float32), ((0, 0), (0, g * gs - k)))
    blocks = padded.reshape(n, g, gs)                       # [N, G, gs]
    valid = (np.arange(g * gs) < k).reshape(g, gs)          # [G, gs]
    big = np.float32(np.finfo(np.float32).max)
    if symmetric:
        absmax = np.where(valid, np.abs(blocks), 0).max(-1)             # [N, G]
        scales = _f16_scale(absmax / 7)
        codes = np.clip(np.rint(blocks / scales[..., None]), -8, 7) + 8
        zeros = None
    else:
        lo = np.minimum(np.where(valid, blocks, big).min(-1), 0)
        hi = np.maximum(np.where(valid, blocks, -big).max(-1), 0)
        scales = _f16_scale((hi - lo) / 15)
        zeros = np.clip(np.rint(-lo / scales), 0, 15).astype(np.float16)
        codes = np.clip(np.rint(blocks / scales[..., None]) + zeros[..., None].astype(np.float32), 0, 15)
    codes = codes.reshape(n, g * gs)[:, :k].astype(np.uint8)
    return codes, scales.astype(np.float16), zeros


def _f16_scale(s: np.ndarray) -> np.ndarray:
    """Scales as the kernel sees them (f16), never zero (an all-zero row keeps scale 1)."""
    s16 = s.astype(np.float16).astype(np.float32)
    return np.where(s16 > 0, s16, np.float32(1.0))


def run(module: Module, recipe: QuantRecipe) -> Module:
    """Quantize every LINEAR weight by ``recipe``; LM head, embeddings and norms become f16."""
    new_params: dict[str, np.ndarray] = {}
    graphs = {}
    for gname, g in module.graphs.items():
        nodes = []
        for n in g.nodes:
            if n.op is OpKind.LINEAR and n.attrs.weight_format is WeightFormat.F32:
                is_head = n.outputs[0] in g.outputs
                fmt = WeightFormat.F16 if is_head else recipe.weight_format
                n = _quantize_linear(n, module, fmt, recipe, new_params)
            nodes.append(n)
        graphs[gname] = rebuild_graph(g, nodes)
    for name, a in module.params.items():  # embeddings, norms, any other f32 weight: f16
        if name not in new_params and a.dtype == np.float32 and a.ndim >= 1 and not name.startswith("rope_"):
            new_params[name] = frozen_array(a.astype(np.float16))
    return rebuild_module(module, graphs, new_params, meta={**module.meta, "quant": recipe.to_json()})


def _quantize_linear(n: Node, module: Module, fmt: WeightFormat, recipe: QuantRecipe, out: dict) -> Node:
    wname = n.inputs["weight"]
    w = module.params[wname]
    if fmt is WeightFormat.F16:
        out[wname] = frozen_array(w.astype(np.float16))
        return replace(n, attrs=replace(n.attrs, weight_format=fmt))
    base = wname.removesuffix(".weight")
    codes, scales, zeros = quantize_rtn(w, recipe.group_size, recipe.symmetric)
    out[f"{base}.qweight"] = frozen_array(int4.pack(codes))
    out[f"{base}.scales"] = frozen_array(scales)
    inputs = {r: s for r, s in n.inputs.items() if r != "weight"}
    inputs.update(qweight=f"{base}.qweight", scales=f"{base}.scales")
    if zeros is not None:
        out[f"{base}.zeros"] = frozen_array(zeros)
        inputs["zeros"] = f"{base}.zeros"
    return Node(n.op, n.name, inputs, n.outputs, replace(n.attrs, weight_format=fmt, group_size=recipe.group_size))
