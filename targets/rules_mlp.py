"""Kernel rules for ``mlp_decode`` (kernel in ``kernels/mlp_decode.cuh``).

Same module protocol as ``rules_misc``: ``RULES``, ``HEADERS`` and ``kernel_source(symbol)``.

- ``mlp_decode.split_k``: one block of 512 threads per 64 intermediate outputs, the block's gate/up
  rows and down columns staged whole in shared memory (``102 H + 3368`` bytes), down's partial sums
  added with vector reductions. sm_90 and newer (bulk copies, mbarriers, ``red.v4.f32``), ``H`` a
  multiple of 256 up to 2048 (the staged rows must fit), ``I`` a multiple of 64, q4 per output
  channel. Its launch carries a programmatic edge: its blocks request their weights while the launch
  before (the attention output projection) finishes.

There is no fallback kernel: ``passes/fuse_decode_mlp.py`` creates the op only where ``fits`` says
this rule answers, for every target of the build (``compiler/build.py``).
"""

from __future__ import annotations

import re

from .base import KernelCall, KernelChoice, KernelRule, Target, c_params

HEADERS: tuple[str, ...] = ("common.cuh", "pdl.cuh", "linear_common.cuh", "linear_gemv2.cuh", "mlp_decode.cuh")

THREADS = 512       # grokc::mlp::kThreads
UNITS = 64          # grokc::mlp::kUnits: intermediate outputs per block
MIN_SM = 90
MAX_HIDDEN = 2048
SYMBOL = "mlp_decode_q4"
_PTR_TYPES = {"acc": "float*", "clear": "float*", "x": "const half*", "norm": "const half*",
              "gate_up": "const uint8_t*", "gate_up_scales": "const half*", "gate_up_zeros": "const half*",
              "down": "const uint8_t*", "down_scales": "const half*", "down_zeros": "const half*"}


def smem_bytes(hidden: int) -> int:
    """Dynamic shared memory of a launch, as mlp_decode.cuh lays it out (MLP_DECODE_SMEM)."""
    return 102 * hidden + 3368


def fits(sm: int, smem_per_block: int, hidden: int, inter: int) -> bool:
    """Whether ``split_k`` takes a batch-1 MLP of these sizes on a target (the fusion pass asks)."""
    return (sm >= MIN_SM and hidden % 256 == 0 and 256 <= hidden <= MAX_HIDDEN and inter % UNITS == 0
            and inter >= UNITS and smem_bytes(hidden) <= smem_per_block)


def split_k(call: KernelCall, target: Target) -> KernelChoice | None:
    h, i = int(call.dims["hidden"]), int(call.dims["inter"])
    if call.attrs.get("weight_format", "q4") != "q4" or not fits(target.sm, target.smem_per_block, h, i):
        return None
    return KernelChoice(SYMBOL, (i // UNITS, 1, 1), (THREADS, 1, 1), smem_bytes(h), "mlp_decode.split_k", pdl=True)


RULES: dict[str, list[KernelRule]] = {"mlp_decode": [split_k]}


_ABLATION = re.compile(rf"{SYMBOL}(?:_a(?P<abl>[1-9]\d{{0,2}}))?")  # timing ablations (mlp_decode.cuh's ABL)


def kernel_source(symbol: str) -> str | None:
    """The entry point ``symbol`` as C++ over ``HEADERS``, or None when it is not this kernel."""
    if (m := _ABLATION.fullmatch(symbol)) is None:
        return None
    decl, args = c_params("mlp_decode", _PTR_TYPES)
    return (f'extern "C" __global__ void __launch_bounds__({THREADS}, 1) {symbol}({decl}) {{\n'
            f"  grokc::mlp::mlp_decode<{m['abl'] or 0}>({args});\n}}\n")
