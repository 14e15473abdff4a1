"""GPTQ: int4 rounding that compensates each weight's error with the columns not yet quantized.

What: ``quantize_gptq(w, hessian, ...)`` quantizes one weight ``W [N, K]`` whose linear reads
inputs with second moment ``hessian = E[x^T x] [K, K]`` (from calibration text, ``compiler/
calibrate.py``), column by column, minimising the output error ``||X (W - Q)^T||^2`` rather
than ``||W - Q||^2`` (Frantar et al. 2022, "GPTQ"): after column ``j`` is rounded, its error,
scaled by the inverse Hessian, is subtracted from the columns after it. Numerics follow the
paper's reference code: a damped Hessian (``damp`` times its mean diagonal added to the
diagonal), the upper Cholesky factor ``U`` of its inverse, blocks of ``block`` columns and one
matrix product per block for the rest ("lazy batch updates"). Inside a block a column takes the
errors of the block's columns before it when it is reached (one matrix-vector product), not as
each of them is rounded.

The result has exactly the form of ``rounding.quantize_rtn``'s ``(codes, scales, zeros)``: the
same grid (``rounding.rtn_grid``), the same code rule (``rounding.rtn_codes``), f16 scales,
so the kernels read it unchanged (``abi/int4.py``).

Grid choices:
- per output channel (``group_size == 0``): one scale (and zero) per row, fixed before the
  column loop from the row's range;
- per group, columns in order: a group's scale is set when the loop reaches its first column,
  from the columns as updated so far (the paper's code);
- ``act_order``: columns are visited in order of decreasing ``H_jj`` (the most active inputs
  first, while the most freedom is left to compensate); codes are unpermuted before they are
  returned. With groups this uses "static groups":
  every group's scale is fixed up front from the original weights, so the group of a column is
  still ``k // group_size`` of its original index and the packed layout is unchanged.
- ``clip_search`` (with scales fixed up front): each row's (or group's) range is shrunk by the
  ratio of ``CLIP_GRID`` that minimises its ``diag(H)``-weighted round-to-nearest error, trading
  a clipped outlier for a finer step everywhere else.

Sparse f16 residual (``quantize_gptq_residual``, ``keep`` > 0): a first pass without
corrections scores every entry by its GPTQ loss ``|w - q| / U_jj`` and gives each column a quota,
its count among the ``keep * N * K`` worst; the second pass, when it rounds a column, keeps its
``quota`` largest ``|w - q|`` as f16 corrections, so their error (now only the f16 rounding) is
not what the later columns compensate (SpQR's outliers, Dettmers et al. 2023, with a fixed
budget). Restoring entries after GPTQ instead would undo compensation already spread over later
columns (on a tiny model it raised the KL it was meant to lower). Twice GPTQ's time.

Requires: ``w`` f32 ``[N, K]``; ``hessian`` ``[K, K]`` symmetric positive semi-definite (inputs
that never fire, ``H_jj == 0``, get weight 0 as in the reference code).
Guarantees: deterministic (float64 numpy, no randomness); codes in ``[0, 16)``; f16 scales
(and zero-points, integers in ``[0, 15]``).
Not handled: the grid itself (``rounding.py``); running the model (the driver does that);
activation-aware rescaling (AWQ), which would need a per-input-channel scale folded into the
norm before the linear.
"""

from __future__ import annotations

import numpy as np

from grokc.quant.rtn import grid_of_range, int4_nearest, rtn_codes, rtn_grid, rtn_range

CLIP_GRID = tuple(1.0 - 0.025 * i for i in range(21))  # 1.0 .. 0.5: scale shrink ratios tried by clip_search


def quantize_gptq(w: np.ndarray, hessian: np.ndarray, group_size: int, symmetric: bool, *, damp: float = 0.01,
                  act_order: bool = False, clip_search: bool = False,
                  block: int = 128) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """GPTQ int4 of ``w`` f32 ``[N, K]``: ``(codes u8 [N, K], scales f16 [N, G], zeros f16 [N, G] | None)``.

    Parameters
    ----------
    hessian: ``[K, K]``, the second moment of the linear's inputs (any positive scale).
    group_size: 0 for one scale per output channel, else columns per scale (a last shorter group is allowed).
    damp: fraction of the mean diagonal added to the diagonal before inverting.
    act_order: visit columns by decreasing ``H_jj`` (static group scales when grouped).
    clip_search: shrink each row's (group's) range by the best ratio of ``CLIP_GRID`` (per channel or with act_order).
    block: columns per lazy batch update (rounded to a multiple of ``group_size`` when grouped).
    """
    return quantize_gptq_residual(w, hessian, group_size, symmetric, damp=damp, act_order=act_order,
                                  clip_search=clip_search, block=block)[:3]


def quantize_gptq_residual(w: np.ndarray, hessian: np.ndarray, group_size: int, symmetric: bool, *,
                           keep: float = 0.0, damp: float = 0.01, act_order: bool = False, clip_search: bool = False,
                           block: int = 128) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """``quantize_gptq`` with a sparse f16 residual: ``(codes, scales, zeros, residual f16 [N, K])``,
    ``residual`` zero except at the at most ``floor(keep * N * K + 1/2)`` corrected entries (``keep`` 0: none)."""
    n, k = w.shape
    if hessian.shape != (k, k):
        raise ValueError(f"hessian of shape {hessian.shape} does not match a weight with K={k}")
    gs = group_size or k
    n_groups = -(-k // gs)
    static = group_size == 0 or act_order                       # every scale known before the loop
    if clip_search and not static:
        raise ValueError("clip_search needs scales fixed before the loop: per output channel, or act_order")
    weights = w.astype(np.float64)                              # [N, K]
    h = hessian.astype(np.float64)                              # [K, K]
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    weights[:, dead] = 0.0

    if static:
        clip = _clip_ratios(weights, np.diag(h), group_size, symmetric) if clip_search else 1.0
        scales, zeros = _grid(weights, group_size, symmetric, clip)  # [N, G]
    else:
        scales, zeros = np.zeros((n, n_groups), np.float32), (None if symmetric else np.zeros((n, n_groups), np.float32))
        block = max(gs, block // gs * gs)                       # a group never straddles two blocks

    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(k)
    h = h[np.ix_(order, order)]
    u = _inverse_cholesky(h, damp)                              # [K, K] upper: H^-1 = U^T U
    group_of = order // gs                                      # [K] group of each visited column
    # Column-major from here on (row j of wt is column order[j] of W), so a column is contiguous.
    wt = np.ascontiguousarray(weights[:, order].T)              # [K, N]
    st = np.ascontiguousarray(scales.T)                         # [G, N]
    zt = None if zeros is None else np.ascontiguousarray(zeros.T)
    quota = np.zeros(k, np.int64)                               # [K] corrections per visited column
    budget = int(np.floor(keep * n * k + 0.5))
    if budget:  # a first pass without corrections ranks every entry by its loss |err| = |w - q| / U_jj
        loss = _loop(wt.copy(), st.copy(), None if zt is None else zt.copy(), u, group_of, quota, static, gs,
                     symmetric, block, score=True)[3]
        worst = np.argsort(-loss.reshape(-1), kind="stable")[:budget]            # [budget] flat [K, N]
        quota = np.bincount(worst // n, minlength=k)
    codes, st, zt, _, corr = _loop(wt, st, zt, u, group_of, quota, static, gs, symmetric, block)

    unpermuted = np.empty((n, k), np.uint8)
    unpermuted[:, order] = codes.T
    residual = np.empty((n, k), np.float16)
    residual[:, order] = corr.T
    scales, zeros = st.T, None if zt is None else zt.T
    return unpermuted, scales.astype(np.float16), None if zeros is None else zeros.astype(np.float16), residual


def _loop(wt: np.ndarray, st: np.ndarray, zt: np.ndarray | None, u: np.ndarray, group_of: np.ndarray,
          quota: np.ndarray, static: bool, gs: int, symmetric: bool, block: int,
          score: bool = False) -> tuple[np.ndarray, ...]:
    """GPTQ's column loop over ``wt [K, N]`` (visiting order, updated in place) with grids ``st``/``zt``
    ``[G, N]`` (set here when not ``static``): ``(codes u8 [K, N], st, zt, |err| [K, N] (with
    ``score``, else None), corrections f16 [K, N])``; column ``j`` keeps its ``quota[j]`` largest
    ``|w - q|`` as f16 corrections."""
    k, n = wt.shape
    codes = np.zeros((k, n), np.uint8)
    loss = np.zeros((k, n), np.float64) if score else None
    corr = np.zeros((k, n), np.float16)
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        cols = wt[b0:b1]                                        # [B, N] view
        errs = np.zeros_like(cols)                              # [B, N]
        done = 0                                                # errs[:done] are subtracted from cols[done:]
        for i in range(b1 - b0):
            j = b0 + i
            g = group_of[j]
            if not static and j % gs == 0:                      # first column of a group: set its grid
                if i > done:                                    # from its columns as updated so far
                    cols[i:] -= u[b0 + done:j, j:b1].T @ errs[done:i]
                    done = i
                s, z = _grid(cols[i:i + gs].T, 0, symmetric, 1.0)
                st[g] = s[:, 0]
                if zt is not None:
                    zt[g] = z[:, 0]
            elif i > done:   # the errors of the block's columns before this one, one matrix-vector product
                cols[i] -= u[b0 + done:j, j] @ errs[done:i]
            c = rtn_codes(cols[i], st[g], None if zt is None else zt[g])    # [N]
            codes[j] = c
            q = (c - (np.float32(8) if zt is None else zt[g])) * st[g]      # what the kernel will see
            if quota[j]:                                        # the worst-served entries: kept in f16
                d = cols[i] - q                                 # [N]
                top = np.argsort(-np.abs(d), kind="stable")[:quota[j]]
                corr[j, top] = d[top]
                q = q + corr[j].astype(np.float64)
            errs[i] = (cols[i] - q) / u[j, j]
            if score:
                loss[j] = np.abs(errs[i])
        wt[b1:] -= u[b0:b1, b1:].T @ errs                       # the lazy update of later blocks
    return codes, st, zt, loss, corr


def _grid(w: np.ndarray, group_size: int, symmetric: bool, clip) -> tuple[np.ndarray, np.ndarray | None]:
    """f32 scales (and zeros) ``[N, G]`` of ``w [N, K]`` by ``rounding.rtn_grid``."""
    return rtn_grid(w.astype(np.float32), group_size, symmetric, clip)


def _clip_ratios(w: np.ndarray, importance: np.ndarray, group_size: int, symmetric: bool) -> np.ndarray:
    """Per row and group, the ratio of ``CLIP_GRID`` whose round-to-nearest error
    ``sum_k H_kk (w_k - q_k)^2`` over the group is least (the first on ties): f32 ``[N, G]``."""
    n, k = w.shape
    gs = group_size or k
    g = -(-k // gs)
    w32 = w.astype(np.float32)
    blocks = np.pad(w32, ((0, 0), (0, g * gs - k))).reshape(n, g, gs)          # [N, G, gs]
    weight = np.pad(importance.astype(np.float32), (0, g * gs - k)).reshape(g, gs)  # [G, gs], 0 on padding
    best = np.full((n, g), np.inf, np.float32)
    ratio = np.ones((n, g), np.float32)
    diff = np.empty_like(blocks)
    span = rtn_range(w32, group_size, symmetric)
    for r in CLIP_GRID:
        s, z = grid_of_range(span, symmetric, np.float32(r))             # [N, G]
        q = int4_nearest(blocks, s[..., None], None if z is None else z[..., None], out=diff)
        np.subtract(blocks, q, out=diff)
        err = np.einsum("ngk,gk->ng", np.square(diff, out=diff), weight)   # [N, G]
        better = err < best
        best[better], ratio[better] = err[better], r
    return ratio


def _inverse_cholesky(h: np.ndarray, damp: float) -> np.ndarray:
    """Upper Cholesky factor ``U`` of ``(H + damp * mean(diag H) * I)^-1`` (float64), from one Cholesky.

    With ``P`` the reversal permutation and ``P H P = C C^T`` (``C`` lower), ``H = R R^T`` for the
    upper ``R = P C P``, so ``H^-1 = U^T U`` with the upper ``U = R^-1 = P C^-1 P``.
    """
    h = h.copy()
    h[np.diag_indices_from(h)] += damp * np.mean(np.diag(h))
    c = np.linalg.cholesky(h[::-1, ::-1])
    return np.ascontiguousarray(_lower_inverse(c)[::-1, ::-1])


def _lower_inverse(c: np.ndarray) -> np.ndarray:
    """Inverse of a lower-triangular matrix by halves: ``[[A, 0], [B, D]]^-1 = [[A^-1, 0], [-D^-1 B A^-1, D^-1]]``."""
    n = len(c)
    if n <= 64:
        return np.linalg.inv(c)
    m = n // 2
    a, d = _lower_inverse(c[:m, :m]), _lower_inverse(c[m:, m:])
    out = np.zeros_like(c)
    out[:m, :m], out[m:, m:] = a, d
    out[m:, :m] = -d @ (c[m:, :m] @ a)
    return out
