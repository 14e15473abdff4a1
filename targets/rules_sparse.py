"""Kernel rules for ``sparse_residual`` (kernel in ``kernels/sparse_residual.cuh``).

Same module protocol as ``rules_misc``: ``RULES`` (op -> ordered rules, fallback last),
``HEADERS`` and ``kernel_source(symbol)``.

- ``sparse_staged``: ``MT`` rows of x per block (1, 2, 4 or 8: the smallest power of two that
  holds M, then halved until ``MT * K * 4`` bytes of staged f32 rows fit ``STAGE_SMEM``: the 48 KiB
  every block may use without opting in, less room for the kernel's static arrays), grid ``(ceil(NW / 64), ceil(M / MT))``.
- ``sparse_global`` (fallback): one row of x per block, read from global memory per entry, for a
  K too wide to stage even one row.

No programmatic edge (``pdl`` False): like the other small kernels, it only waits; the GEMV after
it is the launch that gains from starting early.
"""

from __future__ import annotations

from grokc.targets.base import KernelCall, KernelChoice, KernelRule, Target, c_params

HEADERS: tuple[str, ...] = ("pdl.cuh", "sparse_residual.cuh")

THREADS = 256          # grokc_sparse::kThreads
ROWS_PER_BLOCK = 64    # grokc_sparse::kRows
# The 48 KiB a block gets without opting in holds the static arrays too (partial sums, scales): a
# staged block of exactly 48 KiB (8 rows of K = 1536, SmolLM2's down projection in prefill) failed
# to launch, so the staged rows get 47 KiB.
STAGE_SMEM = 47 * 1024
_PTR_TYPES = {"out": "float*", "x": "const half*", "norm": "const half*", "rowptr": "const int*",
              "cols": "const int*", "vals": "const half*"}


def rows_per_block(m: int, k: int) -> int:
    """x rows a staged block takes: a power of two <= 8 covering ``m``, shrunk to fit ``STAGE_SMEM``; 0: none fits."""
    mt = 1
    while mt < min(m, 8):
        mt *= 2
    while mt and mt * k * 4 > STAGE_SMEM:
        mt //= 2
    return mt


def _grid(call: KernelCall, mt: int) -> tuple[int, int, int]:
    return (-(-int(call.dims["NW"]) // ROWS_PER_BLOCK), -(-int(call.dims["M"]) // mt), 1)


def sparse_staged(call: KernelCall, target: Target) -> KernelChoice | None:
    mt = rows_per_block(int(call.dims["M"]), int(call.dims["K"]))
    if not mt:
        return None
    return KernelChoice(f"sparse_residual_m{mt}", _grid(call, mt), (THREADS, 1, 1), mt * int(call.dims["K"]) * 4,
                        "sparse_staged")


def sparse_global(call: KernelCall, target: Target) -> KernelChoice | None:
    return KernelChoice("sparse_residual_g", _grid(call, 1), (THREADS, 1, 1), 0, "sparse_global")


RULES: dict[str, list[KernelRule]] = {"sparse_residual": [sparse_staged, sparse_global]}

_SOURCES = {
    **{f"sparse_residual_m{mt}": f"grokc_sparse::sparse_residual_rows<{mt}, true>" for mt in (1, 2, 4, 8)},
    "sparse_residual_g": "grokc_sparse::sparse_residual_rows<1, false>",
}


def kernel_source(symbol: str) -> str | None:
    """The entry point ``symbol`` as C++ over ``HEADERS``, or None when it is not one of these kernels."""
    if symbol not in _SOURCES:
        return None
    decl, args = c_params("sparse_residual", _PTR_TYPES)
    return (f'extern "C" __global__ void __launch_bounds__({THREADS}) {symbol}({decl}) {{\n'
            f"  grokc_pdl_entry();\n  {_SOURCES[symbol]}({args});\n}}\n")
