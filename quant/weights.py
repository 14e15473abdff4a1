"""One weight in, its stored form out: the numerics a recipe applies to a single tensor.

``quantize_weight`` gives a linear's int4 codes, scales, zero-points and optional fp16 residual
(round to nearest, ``rtn.py``; or GPTQ, ``gptq.py``); ``quantize_embedding`` an embedding table's
int8 or int4 codes; the ``dequantized_*`` functions give back the f32 weight the kernels will
multiply by, which calibration (``compiler/calibrate.py``) and the quality report read. The
packed layouts are the ABI's (``abi/int4.py``, ``abi/int8.py``).
"""

from __future__ import annotations

import numpy as np

from grokc.abi import int4, int8
from grokc.core.errors import BuildOptionError
from grokc.core.ir import WeightFormat
from grokc.core.rowwise import rowwise
from grokc.quant import residual
from grokc.quant.gptq import quantize_gptq_residual
from grokc.quant.recipe import QuantRecipe
from grokc.quant.rtn import int8_rtn, quantize_rtn

pack_int4 = rowwise(int4.pack)   # a synthetic build's placeholder codes stay one row


def quantize_weight(w: np.ndarray, recipe: QuantRecipe, hessian: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, tuple[np.ndarray, ...] | None]:
    """int4 ``(codes, scales, zeros, residual)`` of one f32 weight ``[N, K]`` by ``recipe`` (GPTQ needs
    ``hessian [K, K]``); ``residual`` is the fp16 correction as CSR ``(rowptr, cols, vals)``, or None
    when the recipe keeps none."""
    if recipe.calibrated:
        codes, scales, zeros, dense = quantize_gptq_residual(
            w, hessian, recipe.group_size, recipe.symmetric, keep=recipe.fp16_residual, damp=recipe.damp,
            act_order=recipe.act_order, clip_search=recipe.clip_search)
        return codes, scales, zeros, residual.from_dense(dense) if recipe.fp16_residual else None
    codes, scales, zeros = quantize_rtn(w, recipe.group_size, recipe.symmetric)
    if not recipe.fp16_residual:
        return codes, scales, zeros, None
    wq = int4.dequantize(int4.pack(codes), scales, zeros, recipe.group_size)
    return codes, scales, zeros, residual.select(w, wq, recipe.fp16_residual)


def dequantized_weight(w: np.ndarray, recipe: QuantRecipe, hessian: np.ndarray | None = None) -> np.ndarray:
    """f32 ``[N, K]``: ``w`` as the kernels will see it after ``quantize_weight`` (fp16 residual included)."""
    return dequantize_weight(quantize_weight(w, recipe, hessian), recipe)


def dequantize_weight(stored: tuple, recipe: QuantRecipe) -> np.ndarray:
    """f32 ``[N, K]`` of ``quantize_weight``'s ``(codes, scales, zeros, residual)`` by ``recipe``."""
    codes, scales, zeros, csr = stored
    wq = int4.dequantize(int4.pack(codes), scales, zeros, recipe.group_size)
    return wq if csr is None else residual.scatter(wq, *csr)


def embedding_group_size(hidden: int, recipe: QuantRecipe) -> int:
    """The group size of an int4 table: the recipe's when it is > 0 and divides ``hidden``, else 0 (per row)."""
    return recipe.group_size if recipe.group_size and hidden % recipe.group_size == 0 else 0


def quantize_embedding(table: np.ndarray, recipe: QuantRecipe
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """``(codes, scales, zeros, group_size)`` of an f32 embedding table ``[V, H]`` by ``recipe.embeddings``
    (q8 or q4), as ``kernel_abi``'s ``embedding`` op reads them.

    q4: round-to-nearest (``quantize_rtn``), symmetric or asymmetric by the recipe, one scale per row
    or per group (``embedding_group_size``); codes packed as ``abi/int4.py`` says, u8 ``[V, H/2]``.
    q8: symmetric round-to-nearest per row (``int8_rtn``), u8 ``[V, H]`` codes with code 128 as zero;
    ``zeros`` is None and ``group_size`` 0.
    """
    h = table.shape[1]
    if recipe.embeddings is WeightFormat.Q8:
        codes, scales, _ = int8_rtn(table)
        return codes, scales, None, 0
    if h % 8:
        raise BuildOptionError(f"--embeddings int4 packs 8 codes per word but the hidden size is {h}; "
                               "choose --embeddings int8 or fp16")
    gs = embedding_group_size(h, recipe)
    codes, scales, zeros = quantize_rtn(table, gs, recipe.symmetric)
    return pack_int4(codes), scales, zeros, gs


def dequantized_embedding(table: np.ndarray, recipe: QuantRecipe) -> np.ndarray:
    """f32 ``[V, H]``: ``table`` as the ``embedding`` op will see it (f16-rounded when the recipe keeps f16)."""
    if recipe.embeddings is WeightFormat.F16:
        return table.astype(np.float16).astype(np.float32)
    codes, scales, zeros, gs = quantize_embedding(table, recipe)
    return (int4 if recipe.embeddings is WeightFormat.Q4 else int8).dequantize(codes, scales, zeros, gs)
