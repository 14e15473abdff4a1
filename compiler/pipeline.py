"""The order of passes, in two lists, and the functions that run them.

``shared_passes`` turn a traced module into the static, quantized module every architecture of a
build starts from; ``target_passes`` then make the choices one architecture makes alone (which
fused kernels it has) and plan its memory. So a multi-arch build's sm90 module is exactly an
sm90-only build's. Both functions are pure. ``GROKC_VERIFY_IR=1`` (or ``--debug``) runs
``ir.verify`` after every pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from grokc.core.ir import Module, verify
from grokc.passes import (
    fuse_attention,
    fuse_decode_mlp,
    fuse_epilogues,
    fuse_mlp,
    fuse_moe,
    memory_plan,
    quantize,
    quantize_moe,
    rope_table,
    scale_residual,
    sparse_residual,
    static_shapes,
)
from grokc.passes.rope_table import RopeTableConfig
from grokc.passes.static_shapes import StaticShapes
from grokc.quant.calibration import Calibration
from grokc.quant.recipe import QuantRecipe
from grokc.targets import Target, rules_mlp

Pass = tuple[str, Callable[[Module], Module]]   # (name recorded in the manifest, pure Module -> Module)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class CompileOptions:
    shapes: StaticShapes
    quant: QuantRecipe
    calibration: Calibration | None = None  # what a calibrated recipe needs (compiler/calibrate.py)


def shared_passes(opts: CompileOptions, moe: bool = False, residual_shift: int = 0) -> list[Pass]:
    """The passes every architecture shares, in order (``moe``: the model has mixture-of-experts layers;
    ``residual_shift``: its architecture stores the residual stream times ``2**-residual_shift``)."""
    residual = [("sparse_residual", sparse_residual.run)] if opts.quant.fp16_residual else []
    rescale = [("scale_residual", lambda m: scale_residual.run(m, residual_shift))] if residual_shift else []
    experts = [("fuse_moe", fuse_moe.run)] if moe else []
    quantize_experts = [("quantize_moe", lambda m: quantize_moe.run(m, opts.quant, opts.calibration))] if moe else []
    return [
        ("fuse_attention", fuse_attention.run),
        ("fuse_mlp", fuse_mlp.run),
        *experts,
        ("fuse_epilogues", fuse_epilogues.run),
        ("rope_table", lambda m: rope_table.run(m, RopeTableConfig(length=opts.shapes.max_seq))),
        *rescale,                       # only the families that ask: the others keep their bytes
        *quantize_experts,
        ("quantize", lambda m: quantize.run(m, opts.quant, opts.calibration)),
        ("static_shapes", lambda m: static_shapes.run(m, opts.shapes)),
        *residual,                      # only when asked for: builds without it keep their bytes
    ]


def target_passes(target: Target) -> list[Pass]:
    """One architecture's passes, in order, after the shared ones."""
    mlp = [("fuse_decode_mlp", lambda m: fuse_decode_mlp.run(m, lambda h, i: rules_mlp.fits(target, h, i)))]
    return [
        *(mlp if rules_mlp.available(target) else []),   # only targets with the kernel
        ("memory_plan", memory_plan.run),
    ]


def run_passes(module: Module, passes: list[Pass], check: bool = False, progress: Progress | None = None) -> Module:
    """``module`` through ``passes`` in order, each name appended to ``meta.passes``."""
    for name, run in passes:
        if progress:
            progress(f"pass {name}")
        module = run(module)
        module = module.with_(meta=replace(module.meta, passes=(*module.meta.passes, name)))
        if check:
            verify(module)
    return module
