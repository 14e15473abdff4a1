"""The fp16 sparse residual of an int4 weight: which corrections to keep, as CSR.

The corrections of one quantized weight ``W [NW, K]`` whose kernels see ``Wq`` (the dequantized
int4 codes), stored in f16 as CSR: ``Wq + R`` is ``W`` at the kept entries up to the f16 rounding
of ``R``. ``select`` picks the ``budget`` fraction of entries where the int4 grid serves ``W``
worst, by the saliency ``|R_ij|`` (times ``sqrt(H_jj)`` when the second moment ``H`` of the
linear's inputs is given), ``R = W - Wq``: right after round-to-nearest, where nothing else
depends on the rounding. GPTQ chooses its corrections inside its column loop instead
(``gptq.quantize_gptq_residual``), so that later columns compensate what is left; ``from_dense``
turns its ``[NW, K]`` result into the same CSR; ``scatter`` adds a CSR back onto ``Wq``.

Guarantees: ``select`` is deterministic (ties at the budget's edge go to the lowest flat index;
a zero residual is never kept) and keeps ``floor(budget * NW * K + 1/2)`` entries at most, rows
sorted, columns ascending within a row.
Not handled: outliers that change the grid itself (SpQR re-fits a group's scale without them).
"""

from __future__ import annotations

import numpy as np


def select(w: np.ndarray, wq: np.ndarray, budget: float,
           hessian_diag: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sparse f16 correction of ``wq`` toward ``w`` (both f32 ``[NW, K]``).

    Parameters
    ----------
    budget: fraction of the ``NW * K`` entries to keep, in ``[0, 1)``.
    hessian_diag: ``[K]``, ``E[x_j^2]`` of the linear's inputs; None ranks by ``|w - wq|`` alone.

    Returns
    -------
    ``(rowptr i32 [NW + 1], cols i32 [nnz], vals f16 [nnz])`` with ``vals = w - wq`` at the kept entries.
    """
    nw, k = w.shape
    r = w.astype(np.float32) - wq.astype(np.float32)                        # [NW, K]
    saliency = np.abs(r)
    if hessian_diag is not None:
        saliency = saliency * np.sqrt(np.maximum(hessian_diag.astype(np.float32), 0))[None, :]
    flat = saliency.reshape(-1)
    keep = min(int(np.floor(budget * flat.size + 0.5)), int(np.count_nonzero(flat)))
    if keep <= 0:
        idx = np.zeros(0, np.int64)
    else:
        edge = np.partition(flat, flat.size - keep)[flat.size - keep]      # the keep-th largest
        above = np.flatnonzero(flat > edge)
        ties = np.flatnonzero(flat == edge)[:keep - above.size]            # lowest indices first
        idx = np.sort(np.concatenate([above, ties]))
    rows, cols = np.divmod(idx, k)
    rowptr = np.zeros(nw + 1, np.int32)
    np.cumsum(np.bincount(rows, minlength=nw), out=rowptr[1:])
    return rowptr, cols.astype(np.int32), r.reshape(-1)[idx].astype(np.float16)


def from_dense(r: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR ``(rowptr i32 [NW + 1], cols i32 [nnz], vals f16 [nnz])`` of the nonzero entries of ``r [NW, K]``."""
    rows, cols = np.nonzero(r)                                  # row-major: rows sorted, columns ascending
    rowptr = np.zeros(r.shape[0] + 1, np.int32)
    np.cumsum(np.bincount(rows, minlength=r.shape[0]), out=rowptr[1:])
    return rowptr, cols.astype(np.int32), r[rows, cols].astype(np.float16)


def scatter(wq: np.ndarray, rowptr: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> np.ndarray:
    """f32 ``[NW, K]``: ``wq`` with the CSR correction added (the weight the kernels multiply by)."""
    out = np.array(wq, np.float32)
    rows = np.repeat(np.arange(out.shape[0]), np.diff(rowptr.astype(np.int64)))
    np.add.at(out, (rows, cols.astype(np.int64)), vals.astype(np.float32))
    return out
