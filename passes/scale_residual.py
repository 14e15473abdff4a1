"""Store the residual stream times ``s = 2**-shift``, so that a model whose residual passes the f16
range (Gemma 3: about 1e5 on Gemma-3-270M, past 65504) keeps f16 activations, exactly.

What: the residual stream is the embedding's output and every sum added to it. The pass follows
it from the EMBEDDING: the embedding's ``scale`` is multiplied by ``s``; an RMS_NORM that adds its
result into the stream (a post-attention or post-feedforward norm with a ``residual`` input, as
``fuse_epilogues`` folds Gemma 3's ``h + post_norm(y)``) gets its weight multiplied by ``s`` (the
stored weight is ``(1 + w) * s``); every norm that reads the stream (a LINEAR's fused RMSNorm
prologue: the pre-attention, pre-feedforward and final norms; an RMS_NORM's ``x``) gets
``eps * s**2``. RMSNorm is invariant to the scale of its input once ``eps`` follows it, so every
norm's output, and so every other tensor (q/k/v, the attention, the MLP), the logits and the
tokens, is what it was. A power of two moves only the exponent: as long as no value becomes an f16
subnormal, the f16 roundings, the f32 sums of squares and ``rsqrt`` give the same bits as without
the pass (the CPU executor gives bit-identical logits on a model that does not overflow), and the
scaled norm weights and eps are exact in f16 and f32. ``meta.residual_scale`` records ``s``
(``compiler/quality.py`` divides the post-norms' weights by it to get the model they compute).

Requires: ``fuse_epilogues`` ran (each add into the stream is an RMS_NORM's ``residual`` input)
and the parameters are unquantized f32 (run before ``quantize``, which rounds the norm weights to
f16); ``shift`` >= 0.
Guarantees: graph inputs and outputs unchanged; the only changes are the embedding's ``scale``,
the post-norms' weights, and the ``eps`` of the norms that read the stream; no kernel, ABI op or
executor change (every op already takes these as attributes and weights); ``shift == 0`` returns
the module unchanged. Deterministic.
Not handled (a ``UnsupportedModel`` naming the node): anything else that reads the stream (a plain
ADD, a LINEAR adding its product into it, a LINEAR reading it without a norm, a mixture of experts'
gather, a graph output), and a post-norm weight read by another node. Residual values whose
magnitude falls below ``2**-14 / s`` become f16 subnormals and keep fewer bits (an absolute error
below ``2**-24 / s``, far below the rounding of the stream's large values); values past
``65504 / s`` still overflow.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from grokc.core.errors import UnsupportedModel
from grokc.core.ir import Graph, Module, Node, OpKind, frozen_array
from grokc.passes._graph import rebuild_graph, rebuild_module


def run(module: Module, shift: int) -> Module:
    """``module`` with its residual stream stored times ``2**-shift`` (see the module docstring)."""
    if shift == 0:
        return module
    s = 2.0 ** -shift
    graphs, post_norms = {}, set()
    for name, g in module.graphs.items():
        graphs[name], weights = _scale_graph(g, s)
        post_norms |= weights
    readers = [n for g in module.graphs.values() for n in g.nodes
               if any(v in post_norms for v in n.inputs.values())]
    for n in readers:
        if n.op is not OpKind.RMS_NORM or "residual" not in n.inputs:
            raise UnsupportedModel(f"{n.name} reads the post-norm weight {n.inputs.get('weight')}, which "
                                   "scale_residual multiplies; it cannot rescale the residual stream")
    scaled = {w: frozen_array(np.asarray(module.params[w], np.float32) * np.float32(s)) for w in sorted(post_norms)}
    return rebuild_module(module, graphs, scaled, meta=replace(module.meta, residual_scale=module.meta.residual_scale * s))


def _scale_graph(g: Graph, s: float) -> tuple[Graph, set[str]]:
    """``g`` with the scaled embedding and eps values, and the post-norm weights to multiply by ``s``."""
    stream: set[str] = set()     # tensors of the residual stream (stored times s)
    weights: set[str] = set()
    nodes = []
    for n in g.nodes:
        reads = {role for role, v in n.inputs.items() if v in stream}
        if n.op is OpKind.EMBEDDING:
            n = replace(n, attrs=replace(n.attrs, scale=n.attrs.scale * s))
            stream.add(n.outputs[0])
        elif n.op is OpKind.RMS_NORM and not n.attrs.group and reads <= {"x", "residual"}:
            if "residual" in n.inputs and "residual" not in reads:
                raise UnsupportedModel(f"{n.name} adds into {n.inputs['residual']}, which is not the residual "
                                       "stream scale_residual follows")
            if "x" in reads:
                n = replace(n, attrs=replace(n.attrs, eps=n.attrs.eps * s * s))
            if "residual" in n.inputs:
                weights.add(n.inputs["weight"])
                stream.add(n.outputs[0])
        elif n.op is OpKind.LINEAR and reads == {"x"} and n.attrs.norm_eps is not None:
            n = replace(n, attrs=replace(n.attrs, norm_eps=n.attrs.norm_eps * s * s))
        elif reads:
            raise _unhandled(n, sorted(reads))
        nodes.append(n)
    out = [o for o in g.outputs if o in stream]
    if out:
        raise UnsupportedModel(f"graph {g.name} outputs the residual stream ({out[0]}), which scale_residual "
                               "stores scaled")
    return rebuild_graph(g, nodes), weights


def _unhandled(n: Node, roles: list[str]) -> UnsupportedModel:
    return UnsupportedModel(f"{n.op.value} node {n.name} reads the residual stream as {', '.join(roles)}; "
                            "scale_residual rescales only the stream's RMSNorms and post-norm adds")
