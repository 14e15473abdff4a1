"""Kernel rule for ``fill_synthetic`` (``kernels/synthetic.cuh``): a grid-stride loop, one rule.

Same module protocol as the other rule modules: ``RULES``, ``HEADERS``, ``kernel_source``.
"""

from __future__ import annotations

from grokc.targets.base import KernelCall, KernelChoice, KernelRule, Target

HEADERS: tuple[str, ...] = ("pdl.cuh", "synthetic.cuh",)
SYMBOL = "fill_synthetic_gs256"


def grid_stride(call: KernelCall, target: Target) -> KernelChoice:
    blocks = max(1, min(-(-int(call.dims["n"]) // 256), target.num_sms * 16))
    return KernelChoice(SYMBOL, (blocks, 1, 1), (256, 1, 1), 0, "grid_stride")


RULES: dict[str, list[KernelRule]] = {"fill_synthetic": [grid_stride]}


def kernel_source(symbol: str) -> str | None:
    if symbol != SYMBOL:
        return None
    return (f'extern "C" __global__ void __launch_bounds__(256) {SYMBOL}(void* out, int n, int fill, int seed, '
            "float scale) {\n  grokc_pdl_entry();\n  grokc_synthetic::fill(out, n, fill, seed, scale);\n}\n")
