"""The order of passes, in one list, and the function that runs them.

``compile_module`` is pure: a traced module and build options in, a static, quantized, planned
module out. ``GROKC_VERIFY_IR=1`` (or ``--debug``) runs ``ir.verify`` after every pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from grokc.core.ir import Module, verify
from grokc.passes import (
    fuse_attention,
    fuse_decode_mlp,
    fuse_epilogues,
    fuse_mlp,
    memory_plan,
    quantize,
    rope_table,
    sparse_residual,
    static_shapes,
)
from grokc.passes.rope_table import RopeTableConfig
from grokc.passes.static_shapes import StaticShapes
from grokc.quant.calibration import Calibration
from grokc.quant.recipe import QuantRecipe


@dataclass(frozen=True)
class CompileOptions:
    shapes: StaticShapes
    quant: QuantRecipe
    calibration: Calibration | None = None  # what a calibrated recipe needs (compiler/calibrate.py)
    # (hidden, inter) -> whether every target has the split-K batch-1 MLP kernel; None: no target asked
    mlp_decode_fits: Callable[[int, int], bool] | None = None


def passes(opts: CompileOptions) -> list[tuple[str, Callable[[Module], Module]]]:
    """The pipeline, in order; each entry is (name recorded in the manifest, pure Module -> Module)."""
    residual = [("sparse_residual", sparse_residual.run)] if opts.quant.fp16_residual else []
    fits = opts.mlp_decode_fits
    mlp = [("fuse_decode_mlp", lambda m: fuse_decode_mlp.run(m, fits))] if fits is not None else []
    return [
        ("fuse_attention", fuse_attention.run),
        ("fuse_mlp", fuse_mlp.run),
        ("fuse_epilogues", fuse_epilogues.run),
        ("rope_table", lambda m: rope_table.run(m, RopeTableConfig(length=opts.shapes.max_seq))),
        ("quantize", lambda m: quantize.run(m, opts.quant, opts.calibration)),
        ("static_shapes", lambda m: static_shapes.run(m, opts.shapes)),
        *residual,                      # only when asked for: builds without it keep their bytes
        *mlp,                           # only for targets that have the kernel
        ("memory_plan", memory_plan.run),
    ]


def compile_module(module: Module, opts: CompileOptions, check: bool = False,
                   progress: Callable[[str], None] | None = None) -> Module:
    applied = []
    for name, run in passes(opts):
        if progress:
            progress(f"pass {name}")
        module = run(module)
        applied.append(name)
        if check:
            verify(module)
    return module.with_(meta={**module.meta, "passes": applied})
