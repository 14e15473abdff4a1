"""Weights a source model already stored as int4 blocks: keeping them on their own grid.

A graph frontend that reads pre-quantized weights (an ONNX ``MatMulNBits``) hands the compiler
their exact f32 values and, in ``ModuleMeta.carried``, the grid they lie on (``CarriedInt4``:
scales, optional zero-points, group size). When the recipe stores such a weight as int4, the
quantize pass takes its codes from that grid instead of quantizing again: round to nearest on a
grid the values already lie on gives back the source's codes, so nothing is re-quantized. A fused
weight (``attn_qkv``, ``ffn_gate_up``) is carried when all its parts are, on grids of one group
size and the same symmetry (rows concatenate). Scales and zero-points are stored in f16, as every
int4 weight of grokc is (``abi/int4.py``).

``carriable`` says which block sizes grokc keeps: those its fast int4 kernels read (a multiple of
32, ``targets/rules_linear.py``), or any size covering the whole row (one scale per output
channel); other sizes are re-quantized by the recipe.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from grokc.core import tensors as names
from grokc.core.meta import CarriedInt4
from grokc.core.rowwise import concat_rows
from grokc.quant.rtn import rtn_codes

FAST_BLOCK = 32  # the int4 group sizes of the gemv/gemm kernels are multiples of this


def carriable(block_size: int, k: int) -> bool:
    """True when int4 blocks of ``block_size`` along ``K`` go into grokc's layout as they are."""
    return k % 8 == 0 and (block_size >= k or block_size % FAST_BLOCK == 0)


def group_size(block_size: int, k: int) -> int:
    """grokc's ``group_size`` for blocks of ``block_size`` along ``K``: 0 (per output channel) when one
    block covers the row."""
    return 0 if block_size >= k else block_size


def grid_for(carried: Mapping[str, CarriedInt4], weight: str) -> CarriedInt4 | None:
    """The grid of ``weight`` (canonical name, possibly a fusion) when every part of it is carried on
    grids that concatenate (one group size, all symmetric or all with zero-points); else None."""
    grids = [carried.get(p) for p in names.parts(weight)]
    if any(g is None for g in grids) or len({(g.group_size, g.zeros is None) for g in grids}) != 1:
        return None
    if len(grids) == 1:
        return grids[0]
    zeros = None if grids[0].zeros is None else concat_rows([g.zeros for g in grids])
    return CarriedInt4(concat_rows([g.scales for g in grids]), zeros, grids[0].group_size, grids[0].source)


def codes_on_grid(w: np.ndarray, grid: CarriedInt4) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(codes u8 [N, K], scales f16 [N, G], zeros f16 [N, G] | None)`` of ``w`` f32 ``[N, K]`` on
    ``grid``: round to nearest on the grid (``rtn_codes``), which for values on it are the source's
    own codes. A zero scale (an all-zero block) gives the zero code. Raises ``ValueError`` when ``w``
    does not lie on the grid (a frontend bug)."""
    k = w.shape[1]
    expand = np.arange(k) // (grid.group_size or k)
    scales = np.asarray(grid.scales, np.float32)
    safe = np.where(scales == 0, np.float32(1), scales)[:, expand]
    zeros = None if grid.zeros is None else np.asarray(grid.zeros, np.float32)[:, expand]
    codes = rtn_codes(w, safe, zeros)
    back = (codes.astype(np.float32) - (8 if zeros is None else zeros)) * scales[:, expand]
    if not np.allclose(back, w, rtol=1e-6, atol=0):
        raise ValueError("a carried int4 weight does not lie on its grid")
    return codes, scales.astype(np.float16), None if zeros is None else np.asarray(grid.zeros).astype(np.float16)


def summary(carried: Mapping[str, CarriedInt4], kept: list[str]) -> dict:
    """What the manifest records of the carried weights the quantize pass kept (``kept``: their names)."""
    grids = [carried[p] for w in kept for p in names.parts(w)]
    return {"weights": len(grids), "source": sorted({g.source for g in grids}),
            "group_sizes": sorted({g.group_size for g in grids}),
            "symmetric": sorted({g.zeros is None for g in grids})}
