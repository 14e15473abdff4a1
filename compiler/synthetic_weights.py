"""Synthetic weights for a config-only build: which parameters become seeded specs, and the
``init`` graph that fills them on the device.

Every parameter that comes from the checkpoint (linears, embeddings, norms) becomes a
``SyntheticTensor`` with the dtype and shape the passes gave it, so kernels see the real packed
layout; constants derived from the config (RoPE table, inverse frequencies, EOS ids) stay real.
Scales are chosen so activations keep unit scale through the layers (each linear's weights have
standard deviation about ``1/sqrt(K)``), so synthetic models run without overflow.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from grokc.abi.ops import KERNEL_ABI, ArgKind
from grokc.abi.synthetic import Fill, SyntheticTensor
from grokc.artifacts.plan import Arg, GraphPlan, Launch
from grokc.core import rope as rope_math
from grokc.passes.static_shapes import EOS_IDS
from grokc.targets import KernelCall, Target, select

CONFIG_CONSTANTS = frozenset({*rope_math.TABLES, *rope_math.TABLES.values(), EOS_IDS})  # every RoPE's table and frequencies
CODE_STD = 4.6  # standard deviation of (code - 8) for uniform codes in [0, 16)
CODE8_STD = 73.9  # standard deviation of (code - 128) for uniform codes in [0, 256) (q8 embedding tables, the q8 LM head)


def specs(params: Mapping[str, np.ndarray], seed: int) -> dict[str, SyntheticTensor]:
    out = {}
    for i, name in enumerate(sorted(n for n in params if n not in CONFIG_CONSTANTS)):
        a = params[name]
        tensor_seed = (seed + i * 0x9E3779B1) & 0x7FFFFFFF
        if name.endswith((".qweight", ".q8weight")):
            fill, scale = Fill.BYTES, 0.0
        elif name.endswith(".scales") and name.replace(".scales", ".q8weight") in params:
            k = params[name.replace(".scales", ".q8weight")].shape[-1]
            fill, scale = Fill.POSITIVE, 1.0 / (CODE8_STD * np.sqrt(k))
        elif name.endswith(".scales"):
            k = params[name.replace(".scales", ".qweight")].shape[-1] * 2   # [.., N, K/2]: stacked experts too
            fill, scale = Fill.POSITIVE, 1.0 / (CODE_STD * np.sqrt(k))
        elif name.endswith(".zeros"):  # the symmetric code: an unbiased grid
            fill, scale = Fill.CONSTANT, 128.0 if name.replace(".zeros", ".q8weight") in params else 8.0
        elif a.ndim == 1:
            fill, scale = Fill.CONSTANT, 1.0
        else:
            fill, scale = Fill.UNIFORM, float(np.sqrt(3.0 / a.shape[-1]))
        out[name] = SyntheticTensor(a.dtype.name, tuple(a.shape), fill, tensor_seed, float(np.float32(scale)))
    return out


def init_graph(tensors: Mapping[str, SyntheticTensor], target: Target) -> GraphPlan:
    """One ``fill_synthetic`` launch per tensor, replayed once by the runner at load."""
    launches = []
    for name, t in sorted(tensors.items()):
        dims = {"n": t.size, "fill": int(t.fill), "seed": t.seed, "scale": t.scale}
        choice = select(KernelCall("fill_synthetic", {}, dims), target)
        args = tuple(Arg(p.name, weight=name) if p.kind is ArgKind.PTR else Arg(p.name, value=dims[p.name])
                     for p in KERNEL_ABI["fill_synthetic"])
        launches.append(Launch("fill_synthetic", choice.kernel, choice.grid, choice.block, choice.smem, args, {},
                               f"init:{name}", choice.rule, choice.pdl))
    return GraphPlan("init", 0, tuple(launches), "")
