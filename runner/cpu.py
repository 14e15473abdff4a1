"""The CPU executor: runs a plan's launches with numpy. It is the oracle the CUDA kernels are tested
against, and what ``grokc run --device cpu`` uses.

Each op of ``artifacts/kernel_abi.py`` is one function in ``OPS``, called as ``OPS[op](args, attrs)``
where ``args`` maps every ABI parameter name to a numpy array (pointers; ``None`` for a null optional
pointer) or a Python int/float (scalars), and ``attrs`` is the launch's variant. Outputs are written
in place. The semantics are the ABI docstring's, nothing added: fp16 storage, fp32 arithmetic.

A pointer is read the way a kernel reads it: as flat memory shaped by the launch's scalars, so a
buffer larger than the launch needs (``io.prompt [max_bucket]`` for a shorter bucket) is fine, but
its dtype must be the one the ABI names.

The parameter readers are ``runner/cpu_params.py``; a mixture of experts' routing, gathering and
combining are ``runner/cpu_moe.py``.

``CpuExecutor`` implements ``runner/executor.py`` over one host arena laid out as the plan says. It
keeps an f32 copy of every linear weight (dequantized once when q4 or q8), so replays cost only the math.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from grokc.abi import int4, int8, mlp_tiles
from grokc.abi.ops import KERNEL_ABI, KV_BLOCK_SIZE, ArgKind
from grokc.abi.rng import uniform
from grokc.abi.synthetic import Fill, SyntheticTensor, materialize
from grokc.artifacts.plan import Buffer, Launch, Plan
from grokc.core.errors import ArtifactError, TargetError
from grokc.runner.cpu_moe import expert_rows, moe_combine, moe_gather, moe_route
from grokc.runner.cpu_params import F16, F32, I32, U8
from grokc.runner.cpu_params import arr as _arr
from grokc.runner.cpu_params import as_f16 as _as_f16
from grokc.runner.cpu_params import opt as _opt
from grokc.runner.cpu_params import prologue as _prologue
from grokc.runner.cpu_params import variant as _variant

# -- embedding, linear, take_last --------------------------------------------------------------

def embedding(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    n, hidden, vocab = args["n"], args["hidden"], args["vocab"]
    fmt = _variant(attrs, "embedding", "weight_format")
    tokens = _arr(args, "tokens", I32, n).astype(np.int64)  # [n]
    out = _arr(args, "out", F16, n, hidden)                  # [n, H]
    valid = (tokens >= 0) & (tokens < vocab)
    rows = np.zeros((n, hidden), F32)                        # out-of-range tokens: zero rows
    if fmt == "f16":
        rows[valid] = _arr(args, "table", F16, vocab, hidden)[tokens[valid]]
    else:
        rows[valid] = _dequantized_rows(args, fmt, tokens[valid])
    out[...] = rows * F32(args["scale"])                     # f32 product, rounded to f16 once


def _dequantized_rows(args: dict[str, Any], fmt: str, pick: np.ndarray) -> np.ndarray:
    """f32 ``[len(pick), H]``: rows ``pick`` of a q8/q4 embedding table, dequantized (not yet scaled)."""
    hidden, vocab, gs = args["hidden"], args["vocab"], args["group_size"]
    if gs < 0 or gs % 8 or (fmt == "q4" and hidden % 8):
        raise ArtifactError(f"{fmt} embedding with hidden={hidden}, group_size={gs}: group_size must be 0 or a "
                            "multiple of 8 (and hidden a multiple of 8 for q4); rebuild the artifact with this grokc")
    groups = -(-hidden // (gs or hidden))
    scales = _arr(args, "scales", F16, vocab, groups)[pick]  # [r, G]
    zeros = _opt(args, "zeros", F16, vocab, groups)          # [vocab, G] or None: the symmetric code
    zeros = None if zeros is None else zeros[pick]
    if fmt == "q4":
        return int4.dequantize(_arr(args, "table", U8, vocab, hidden // 2)[pick], scales, zeros, gs)  # [r, H]
    return int8.dequantize(_arr(args, "table", U8, vocab, hidden)[pick], scales, zeros, gs)           # [r, H]


def dense_weight(args: dict[str, Any], attrs: Mapping[str, str], op: str = "linear") -> np.ndarray:
    """The f32 ``[NW, K]`` matrix a linear launch multiplies by (q4 and q8 codes dequantized); for a
    ``moe_linear`` launch (``op``) its experts' matrices one after the other, ``[n_experts * NW, K]``."""
    n, k, gs = args["N"], args["K"], args["group_size"]
    nw = (n if _variant(attrs, op, "act") == "none" else 2 * n) * args.get("n_experts", 1)
    fmt = _variant(attrs, op, "weight_format")
    if fmt == "f16":
        return _arr(args, "weight", F16, nw, k).astype(F32)
    if k % 8 or gs < 0:
        raise ArtifactError(f"{fmt} linear with K={k}, group_size={gs}: K must be a multiple of 8 "
                            "and group_size >= 0; rebuild the artifact with this grokc")
    groups = -(-k // (gs or k))
    scales = _arr(args, "scales", F16, nw, groups)     # [NW, G]
    zeros = _opt(args, "zeros", F16, nw, groups)       # [NW, G] or None: the symmetric code (8 or 128)
    if fmt == "q8":
        return int8.dequantize(_arr(args, "weight", U8, nw, k), scales, zeros, gs)       # [NW, K]
    return int4.dequantize(_arr(args, "weight", U8, nw, k // 2), scales, zeros, gs)     # [NW, K]


ROW_BLOCK = 8


def matmul_rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """f32 ``x [M, K] @ w.T`` (``w [NW, K]``), each row's sums independent of every other row.

    BLAS picks its kernels (and so the order of each dot product's additions) by the shape: one
    matmul of ``M`` rows would make a row's bits depend on how many other rows share it, i.e. on
    how many slots a decode step serves. Here the rows go through in blocks of ``ROW_BLOCK``
    (the last one zero-padded), every block one matmul of the same shape, so a row comes out the
    same whatever ``M``, its index or the other rows are: batch invariance (``decode_1`` and
    ``decode_B`` give a request the same logits) and bucket invariance (padding rows change nothing).
    """
    m, k = x.shape
    blocks = -(-m // ROW_BLOCK)
    padded = np.zeros((blocks * ROW_BLOCK, k), F32)
    padded[:m] = x
    return (padded.reshape(blocks, ROW_BLOCK, k) @ w.T).reshape(blocks * ROW_BLOCK, w.shape[0])[:m]


def linear(args: dict[str, Any], attrs: Mapping[str, str], dense: np.ndarray | None = None) -> None:
    """``out = epilogue(prologue(x) @ W^T)``; ``dense`` is W as f32 ``[NW, K]`` when the caller has it."""
    m, n, k = args["M"], args["N"], args["K"]
    act = _variant(attrs, "linear", "act")
    out_dtype = F16 if _variant(attrs, "linear", "out_dtype") == "f16" else F32
    w = dense_weight(args, attrs) if dense is None else dense  # [NW, K]
    y = matmul_rows(_prologue(args, m, k, _variant(attrs, "linear", "x_dtype")), w)  # [M, NW]
    addend = _opt(args, "addend", F32, m, w.shape[0])          # [M, NW]
    if addend is not None:
        y = y + addend
    bias = _opt(args, "bias", F16, w.shape[0])                 # [NW]
    if bias is not None:
        y = y + bias.astype(F32)
    y = _activate(y, n, act)                                   # [M, N]
    residual = None if args["residual"] is None else \
        _as_f16(args, "residual", _variant(attrs, "linear", "residual_dtype"), m, n)   # [M, N]; may alias out
    if residual is not None:
        y = y + residual.astype(F32)                           # read before out is written
    _arr(args, "out", out_dtype, m, n)[...] = y


def _silu(g: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):                           # exp(-g) -> inf gives silu -> -0
        return g / (F32(1) + np.exp(-g))


def _gelu_tanh(g: np.ndarray) -> np.ndarray:
    return F32(0.5) * g * (F32(1) + np.tanh(F32(math.sqrt(2 / math.pi)) * (g + F32(0.044715) * g * g * g)))


_GATES = {"silu_mul": _silu, "gelu_tanh_mul": _gelu_tanh}


def _activate(y: np.ndarray, n: int, act: str) -> np.ndarray:
    """f32 ``[M, N]`` from the raw products ``y`` ``[M, NW]`` by a ``linear``'s ``act``: gate rows first."""
    return y if act == "none" else _GATES[act](y[:, :n]) * y[:, n:]


def moe_linear(args: dict[str, Any], attrs: Mapping[str, str], dense: np.ndarray | None = None) -> None:
    """Each expert's rows times its matrix; ``dense`` is ``dense_weight`` of the launch when the caller has it."""
    r, n, k, ne = args["R"], args["N"], args["K"], args["n_experts"]
    act = _variant(attrs, "moe_linear", "act")
    out = _arr(args, "out", F16 if _variant(attrs, "moe_linear", "out_dtype") == "f16" else F32, r, n)
    w = (dense_weight(args, attrs, "moe_linear") if dense is None else dense).reshape(ne, -1, k)   # [E', NW, K]
    offsets, x = expert_rows(args, ne, r), _arr(args, "x", F16, r, k)
    for e in np.flatnonzero(np.diff(offsets)):   # in blocks of rows, as linear: a row's bits are its own
        out[offsets[e]:offsets[e + 1]] = _activate(matmul_rows(x[offsets[e]:offsets[e + 1]].astype(F32), w[e]), n, act)


def rms_norm(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    """``out = rms(x) * weight (+ residual)`` per row, f32, rounded once."""
    m, h = args["M"], args["hidden"]
    x = _arr(args, "x", F16, m, h).astype(F32)                 # [M, H]
    inv_rms = F32(1) / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + F32(args["eps"]))   # [M, 1]
    y = x * inv_rms * _arr(args, "weight", F16, h).astype(F32)
    residual = _opt(args, "residual", F16, m, h)               # [M, H]; may alias out
    if residual is not None:
        y = y + residual.astype(F32)
    _arr(args, "out", F16, m, h)[...] = y


def qk_norm(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    """Per-head RMSNorm of the q heads (by ``q_norm``) and k heads (``k_norm``) of qkv; v copied."""
    m, nh, nkv, d = args["M"], args["n_heads"], args["n_kv_heads"], args["head_dim"]
    qkv = _arr(args, "qkv", F16, m, nh + 2 * nkv, d)
    out = _arr(args, "out", F16, m, nh + 2 * nkv, d)
    heads = qkv[:, :nh + nkv].astype(F32)                      # [M, NH+NKV, D]
    w = np.concatenate([np.repeat(_arr(args, r, F16, 1, d), n, 0) for r, n in (("q_norm", nh), ("k_norm", nkv))])
    inv_rms = F32(1) / np.sqrt(np.mean(heads * heads, axis=2, keepdims=True) + F32(args["eps"]))   # [M, heads, 1]
    normed = heads * inv_rms * w.astype(F32)
    v = qkv[:, nh + nkv:].copy()                               # read before out is written (they may alias)
    out[:, :nh + nkv] = normed
    out[:, nh + nkv:] = v


def mlp_decode(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    """``acc += x + down(silu(gate) * up)`` (batch 1), then ``clear = 0``: the two ``linear`` launches
    it replaces, gate_up's f16 activations and down's residual add in f32, summed into ``acc``; the
    weights' codes unpacked from their tiles (artifacts/mlp_tiles.py)."""
    h, i = args["hidden"], args["inter"]
    weights = {part: mlp_tiles.unpack(_arr(args, f"{name}_tiles", U8, math.prod(mlp_tiles.shape(part, h, i)) // 2),
                                      part, h, i)
               for part, name in ((mlp_tiles.Part.GATE_UP, "gate_up"), (mlp_tiles.Part.DOWN, "down"))}
    q4 = {"weight_format": "q4", "out_dtype": "f16"}
    act = np.empty((1, i), F16)
    linear({"out": act, "x": args["x"], "weight": weights[mlp_tiles.Part.GATE_UP], "scales": args["gate_up_scales"],
            "zeros": args["gate_up_zeros"], "norm": args["norm"], "residual": None, "addend": None, "bias": None,
            "M": 1, "N": i,
            "K": h, "group_size": 0, "eps": args["eps"]}, {**q4, "act": "silu_mul"})
    y = np.empty((1, h), F32)
    linear({"out": y, "x": act, "weight": weights[mlp_tiles.Part.DOWN], "scales": args["down_scales"],
            "zeros": args["down_zeros"], "norm": None, "residual": args["x"], "addend": None, "bias": None,
            "M": 1, "N": h, "K": i,
            "group_size": 0, "eps": 0.0}, {**q4, "act": "none", "out_dtype": "f32"})
    acc = _arr(args, "acc", F32, 1, h)
    acc += y
    _arr(args, "clear", F32, 1, h)[...] = 0


def pack_mlp_tiles(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    part, h, i = mlp_tiles.Part(args["part"]), args["hidden"], args["inter"]
    n, k = mlp_tiles.shape(part, h, i)
    _arr(args, "out", U8, n * k // 2)[...] = mlp_tiles.pack(_arr(args, "weight", U8, n, k // 2), part, h, i)


def sparse_residual(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    """``out[m, n] = sum over row n of the CSR of vals * prologue(x)[m, cols]`` (f32 ``[M, NW]``)."""
    m, nw, k = args["M"], args["NW"], args["K"]
    rowptr = _arr(args, "rowptr", I32, nw + 1).astype(np.int64)   # [NW + 1]
    nnz = int(rowptr[-1])
    if rowptr[0] != 0 or np.any(np.diff(rowptr) < 0):
        raise ArtifactError("sparse_residual: rowptr must start at 0 and never decrease; rebuild the artifact")
    cols = _arr(args, "cols", I32, nnz).astype(np.int64)          # [nnz]
    if nnz and (cols.min() < 0 or cols.max() >= k):
        raise ArtifactError(f"sparse_residual: a column lies outside [0, {k}); rebuild the artifact")
    vals = _arr(args, "vals", F16, nnz).astype(F32)               # [nnz]
    rows = np.repeat(np.arange(nw), np.diff(rowptr))              # [nnz] output row of each entry
    terms = _prologue(args, m, k)[:, cols] * vals                 # [M, nnz]
    flat = (np.arange(m)[:, None] * nw + rows).reshape(-1)        # [M * nnz] index into out
    _arr(args, "out", F32, m, nw)[...] = np.bincount(flat, terms.reshape(-1), m * nw).reshape(m, nw)


def take_last(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    hidden = args["hidden"]
    x = _arr(args, "x", F16, -1, hidden)                       # [L, H]
    t_real = int(_arr(args, "n_real", I32, 1)[0])
    if not 1 <= t_real <= x.shape[0]:
        raise ValueError(f"take_last: n_real={t_real} is outside [1, {x.shape[0]}]")
    _arr(args, "out", F16, 1, hidden)[0] = x[t_real - 1]


# -- attention ---------------------------------------------------------------------------------

def _rope_cos_sin(args: dict[str, Any], pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin f32 ``[T, D/2]`` at positions ``pos [T]``: the table below table_len, computed past it."""
    half, table_len = args["head_dim"] // 2, args["table_len"]
    table = _arr(args, "rope_table", F32, table_len, half, 2)  # [table_len, D/2, (cos, sin)]
    inv_freq = _arr(args, "inv_freq", F32, half)               # [D/2]
    pos = pos.astype(np.int64)
    inside = pos < table_len
    cs = np.empty((pos.size, half, 2), F32)                    # [T, D/2, 2]
    cs[inside] = table[pos[inside]]
    angle = pos[~inside].astype(F32)[:, None] * inv_freq       # [T', D/2], f32 as cosf/sinf see it
    cs[~inside] = F32(args["mscale"]) * np.stack([np.cos(angle), np.sin(angle)], axis=-1)
    return cs[..., 0], cs[..., 1]


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE of f16 ``[T, heads, D]`` in f32, rounded back to f16."""
    half = x.shape[-1] // 2
    x = x.astype(F32)
    x1, x2 = x[..., :half], x[..., half:]                      # [T, heads, D/2]
    c, s = cos[:, None, :], sin[:, None, :]                    # [T, 1, D/2]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(F16)


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool, window: int = 0,
            softcap: float = 0.0) -> np.ndarray:
    """Softmax attention in f32 of q f16 ``[T, NH, D]`` over k, v f16 ``[S, NKV, D]`` -> ``[T, NH, D]``.

    Query head h reads kv head ``h // (NH // NKV)``; with ``causal`` (T == S) query t sees keys 0..t,
    and only ``t - window < j`` of them when ``window > 0``; ``softcap > 0`` caps the scaled scores
    (``softcap * tanh(s / softcap)``).
    """
    t, nh, d = q.shape
    nkv = k.shape[1]
    g = nh // nkv
    mask = None
    if causal:
        i, j = np.arange(t)[:, None], np.arange(k.shape[0])[None, :]
        mask = (j <= i) & ((j > i - window) if window > 0 else True)   # [T, S]
    out = np.empty((t, nh, d), F32)
    for j in range(nkv):
        qj = q[:, j * g:(j + 1) * g].astype(F32).transpose(1, 0, 2)       # [G, T, D]
        s = (qj @ k[:, j].astype(F32).T) * F32(scale)                      # [G, T, S]
        if softcap > 0:
            s = F32(softcap) * np.tanh(s / F32(softcap))
        if mask is not None:
            s = np.where(mask, s, F32(-np.inf))
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        out[:, j * g:(j + 1) * g] = (p @ v[:, j].astype(F32)).transpose(1, 0, 2)
    return out


def _attn_views(args: dict[str, Any], rows: int) -> tuple[np.ndarray, ...]:
    """qkv ``[rows, NH+2NKV, D]``, out ``[rows, NH*D]``, k/v caches ``[NB, NKV, S, D]``, block_table
    ``[B, MB]``."""
    nh, nkv, d = args["n_heads"], args["n_kv_heads"], args["head_dim"]
    if nkv <= 0 or nh % nkv or d % 2:
        raise ArtifactError(f"attention with n_heads={nh}, n_kv_heads={nkv}, head_dim={d}: heads must "
                            "be a multiple of kv heads and head_dim even; rebuild the artifact")
    qkv = _arr(args, "qkv", F16, rows, nh + 2 * nkv, d)
    out = _arr(args, "out", F16, rows, nh * d)
    k_cache = _arr(args, "k_cache", F16, -1, nkv, KV_BLOCK_SIZE, d)
    v_cache = _arr(args, "v_cache", F16, -1, nkv, KV_BLOCK_SIZE, d)
    block_table = _arr(args, "block_table", I32, -1, args["max_blocks"])
    return qkv, out, k_cache, v_cache, block_table


def _cache_index(table_row: np.ndarray, pos: np.ndarray, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """(block, row) in the KV pool of positions ``pos [T]`` of a slot whose blocks are ``table_row [MB]``."""
    if pos.size and pos.max() >= table_row.size * KV_BLOCK_SIZE:
        raise IndexError(f"KV position {pos.max()} is past the slot's {table_row.size * KV_BLOCK_SIZE}")
    blocks = table_row[pos // KV_BLOCK_SIZE].astype(np.int64)
    if blocks.size and (blocks.min() < 0 or blocks.max() >= n_blocks):
        raise IndexError(f"block table names blocks outside the pool of {n_blocks}")
    return blocks, pos % KV_BLOCK_SIZE


def attention_prefill(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    big_l, nh, nkv = args["L"], args["n_heads"], args["n_kv_heads"]
    qkv, out, k_cache, v_cache, block_table = _attn_views(args, big_l)
    b = int(_arr(args, "slot", I32, 1)[0])
    t_real = int(_arr(args, "n_real", I32, 1)[0])
    if not 0 <= t_real <= big_l:
        raise ValueError(f"attention_prefill: n_real={t_real} is outside [0, {big_l}]")
    pos = np.arange(t_real)                                    # [T]; padding rows are never read
    cos, sin = _rope_cos_sin(args, pos)                        # [T, D/2]
    q = _rotate(qkv[:t_real, :nh], cos, sin)                   # [T, NH, D]
    k = _rotate(qkv[:t_real, nh:nh + nkv], cos, sin)           # [T, NKV, D]
    v = qkv[:t_real, nh + nkv:]                                # [T, NKV, D]
    blocks, rows = _cache_index(block_table[b], pos, k_cache.shape[0])
    k_cache[blocks, :, rows] = k                               # [T, NKV, D] scattered over blocks
    v_cache[blocks, :, rows] = v
    out[t_real:] = 0
    if t_real:
        out[:t_real] = _attend(q, k, v, args["scale"], causal=True, window=args["window"],
                               softcap=args["softcap"]).reshape(t_real, -1)


def attention_decode(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    batch, nh, nkv = args["B"], args["n_heads"], args["n_kv_heads"]
    qkv, out, k_cache, v_cache, block_table = _attn_views(args, batch)
    live = np.flatnonzero(_arr(args, "active", I32, batch))          # [A] active slots
    positions = _arr(args, "positions", I32, batch)[live].astype(np.int64)  # [A]
    cos, sin = _rope_cos_sin(args, positions)                  # [A, D/2]
    q = _rotate(qkv[live, :nh], cos, sin)                      # [A, NH, D]
    k = _rotate(qkv[live, nh:nh + nkv], cos, sin)              # [A, NKV, D]
    v = qkv[live, nh + nkv:]                                   # [A, NKV, D]
    out[...] = 0                                               # inactive: zero row, cache untouched
    window = args["window"]
    for i, (b, p) in enumerate(zip(live, positions)):
        lo = max(0, p - window + 1) if window > 0 else 0       # a local layer reads its window only
        blocks, rows = _cache_index(block_table[b], np.arange(lo, p + 1), k_cache.shape[0])  # [p+1-lo]
        k_cache[blocks[-1], :, rows[-1]] = k[i]
        v_cache[blocks[-1], :, rows[-1]] = v[i]
        keys, values = k_cache[blocks, :, rows], v_cache[blocks, :, rows]  # [p+1-lo, NKV, D]
        out[b] = _attend(q[i:i + 1], keys, values, args["scale"], causal=False, softcap=args["softcap"]).reshape(-1)


# -- sampling ----------------------------------------------------------------------------------

def _choose(row: np.ndarray, temperature: float, top_k: int, top_p: float, u: float) -> int:
    """One token from f32 logits ``[V]``: greedy, or top-k / top-p / inverse-CDF as the ABI says.

    Masses are summed in float64 so the oracle's boundaries are those of the f32 ``p`` themselves.
    """
    if temperature <= 0:
        return int(np.argmax(row))                             # first index among ties
    v = row.size
    logit = row / F32(temperature)                             # [V]
    p = np.exp(logit - logit.max())                            # [V] f32
    keep = np.ones(v, bool)
    if 0 < top_k < v:
        kth = np.partition(logit, v - top_k)[v - top_k]        # the top_k-th largest
        keep = logit >= kth                                    # ties with it are kept
    if 0 < top_p < 1:
        desc = np.sort(p[keep])[::-1]                          # kept p, largest first
        mass = np.cumsum(desc, dtype=np.float64)
        tau = desc[np.argmax(mass >= top_p * mass[-1])]        # largest tau with enough mass
        keep &= p >= tau
    running = np.cumsum(np.where(keep, p, 0), dtype=np.float64)  # [V], index order
    return int(np.argmax(keep & (running >= u * running[-1])))


def sample(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    m, v, max_out = args["M"], args["V"], args["max_out"]
    logits = _arr(args, "logits", F32, m, v)                   # [M, V]
    slot = _opt(args, "slot", I32, 1)                          # set in prefill only
    n_real = _opt(args, "n_real", I32, 1)
    temperature, top_p = (_arr(args, name, F32, -1) for name in ("temperature", "top_p"))  # [B]
    top_k, seed, tokens, positions, active, out_count, max_new = (
        _arr(args, name, I32, -1)
        for name in ("top_k", "seed", "tokens", "positions", "active", "out_count", "max_new"))  # [B]
    out_tokens = _arr(args, "out_tokens", I32, -1, max_out) if max_out > 0 else None  # [B, max_out]
    eos = set(_arr(args, "eos_ids", I32, args["n_eos"]).tolist())
    for i in range(m):
        b = int(slot[0]) if slot is not None else i
        if slot is None and not active[b]:
            continue
        c = 0 if slot is not None else int(out_count[b])
        t = _choose(logits[i], float(temperature[b]), int(top_k[b]), float(top_p[b]),
                    float(uniform(int(seed[b]), c)))
        tokens[b] = t
        if c < max_out:
            out_tokens[b, c] = t
        out_count[b] = c + 1
        positions[b] = n_real[0] if slot is not None else positions[b] + 1
        active[b] = 0 if t in eos or c + 1 >= max_new[b] else 1


def fill_synthetic(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    n, fill = args["n"], Fill(args["fill"])
    spec = SyntheticTensor("uint8" if fill is Fill.BYTES else "float16", (n,), fill, args["seed"], args["scale"])
    _arr(args, "out", U8 if fill is Fill.BYTES else F16, n)[...] = materialize(spec)


OPS: dict[str, Callable[[dict[str, Any], dict[str, str]], None]] = {
    "embedding": embedding,
    "linear": linear,
    "sparse_residual": sparse_residual,
    "rms_norm": rms_norm,
    "qk_norm": qk_norm,
    "mlp_decode": mlp_decode,
    "pack_mlp_tiles": pack_mlp_tiles,
    "attention_prefill": attention_prefill,
    "attention_decode": attention_decode,
    "take_last": take_last,
    "sample": sample,
    "fill_synthetic": fill_synthetic,
    "moe_route": moe_route,
    "moe_gather": moe_gather,
    "moe_linear": moe_linear,
    "moe_combine": moe_combine,
}
assert OPS.keys() == KERNEL_ABI.keys()
_DENSE_OPS = {"linear": linear, "moe_linear": moe_linear}   # ops the executor hands a cached dense weight


# -- the executor ------------------------------------------------------------------------------

def _host_arena(nbytes: int) -> np.ndarray:
    """The zeroed host arena, refused in one line when the machine has not the memory for it."""
    available = _available_host_memory()
    if available is not None and nbytes > available:
        raise TargetError(f"the plan's arena needs {nbytes / 2**30:.2f} GiB of host memory but this machine has "
                          f"{available / 2**30:.2f} GiB available; rebuild with a smaller --batch, --max-seq or "
                          "--kv-blocks")
    try:
        return np.zeros(nbytes, U8)
    except MemoryError:
        raise TargetError(f"the plan's arena needs {nbytes / 2**30:.2f} GiB of host memory, more than this machine "
                          "could allocate; rebuild with a smaller --batch, --max-seq or --kv-blocks") from None


def _available_host_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (Linux), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class CpuExecutor:
    """Runs a plan's graphs with numpy in one host arena (the ``runner/executor.py`` protocol).

    ``weights`` maps every weight name the plan's launches use to an array of the ABI's dtype
    (f16, or u8 for packed q4). Replays run synchronously.
    """

    def __init__(self, plan: Plan, weights: Mapping[str, np.ndarray]):
        self.plan = plan
        self._arena = _host_arena(plan.arena_bytes)
        self._buffers = {name: self._view(b) for name, b in plan.buffers.items()}
        self._weights = weights
        self._dense: dict[tuple, np.ndarray] = {}  # linear weights as f32 [NW, K], filled lazily
        self._graphs = {name: [(l, self._bind(name, l)) for l in g.launches]
                        for name, g in plan.graphs.items()}

    def _view(self, b: Buffer) -> np.ndarray:
        if b.dtype not in ("float16", "float32", "int32", "uint8"):
            raise ArtifactError(f"buffer {b.name!r} has dtype {b.dtype!r}, which grokc does not know; "
                                "rebuild the artifact with this grokc")
        if b.offset < 0 or b.offset + b.nbytes > self._arena.size:
            raise ArtifactError(f"buffer {b.name!r} at offset {b.offset} ({b.nbytes} bytes) lies outside "
                                f"the {self._arena.size}-byte arena; the plan is corrupt, rebuild it")
        return self._arena[b.offset:b.offset + b.nbytes].view(b.dtype).reshape(b.shape)

    def _bind(self, graph: str, launch: Launch) -> dict[str, Any]:
        """The launch's ``args`` for OPS: arena views, weights and scalars, resolved once."""
        where = f"launch {launch.node or launch.kernel!r} of graph {graph!r}"
        if launch.op not in OPS:
            raise ArtifactError(f"{where} names op {launch.op!r}, which this grokc cannot run; "
                                f"supported: {sorted(OPS)}")
        params = KERNEL_ABI[launch.op]
        if [a.param for a in launch.args] != [p.name for p in params]:
            raise ArtifactError(f"{where} passes {[a.param for a in launch.args]}, not the ABI's "
                                f"{[p.name for p in params]}; rebuild the artifact with this grokc")
        args: dict[str, Any] = {}
        for p, a in zip(params, launch.args):
            if p.kind is not ArgKind.PTR:
                if a.value is None:
                    raise ArtifactError(f"{where} gives scalar {p.name!r} no value; rebuild the artifact")
                args[p.name] = int(a.value) if p.kind is ArgKind.I32 else float(a.value)
            elif a.buffer is not None:
                if a.buffer not in self._buffers:
                    raise ArtifactError(f"{where} uses buffer {a.buffer!r}, which the plan lacks")
                args[p.name] = self._buffers[a.buffer]
            elif a.weight is not None:
                if a.weight not in self._weights:
                    raise ArtifactError(f"{where} uses weight {a.weight!r}, which the weights lack")
                args[p.name] = np.ascontiguousarray(self._weights[a.weight])
            elif p.optional:
                args[p.name] = None
            else:
                raise ArtifactError(f"{where} passes null for {p.name!r}, which must not be null")
        return args

    def _dense_weight(self, launch: Launch, args: dict[str, Any]) -> np.ndarray | None:
        """The cached f32 weight of a linear or moe_linear launch whose matrix comes from the weights file."""
        srcs = [launch.arg(p) for p in ("weight", "scales", "zeros")]
        if any(a.buffer is not None for a in srcs):
            return None  # an arena buffer may change between replays
        key = (launch.op, *(a.weight for a in srcs), args["N"], args["K"], args["group_size"],
               args.get("n_experts", 1), *sorted(launch.attrs.items()))
        if key not in self._dense:
            self._dense[key] = dense_weight(args, launch.attrs, launch.op)
        return self._dense[key]

    # -- Executor protocol ----------------------------------------------------------------------
    def write(self, buffer: str, value: np.ndarray, index: int | tuple[int, ...] = ()) -> None:
        self._buffers[buffer][index] = value

    def read(self, buffer: str) -> np.ndarray:
        return self._buffers[buffer].copy()

    def _launches(self, graph: str) -> list[tuple[Launch, dict[str, Any]]]:
        if graph not in self._graphs:
            raise ArtifactError(f"the plan has no graph {graph!r}; it has {sorted(self._graphs)}")
        return self._graphs[graph]

    def _run(self, launch: Launch, args: dict[str, Any]) -> None:
        if launch.op in _DENSE_OPS:
            _DENSE_OPS[launch.op](args, launch.attrs, dense=self._dense_weight(launch, args))
        else:
            OPS[launch.op](args, launch.attrs)

    def replay(self, graph: str) -> None:
        for launch, args in self._launches(graph):
            self._run(launch, args)

    def replay_timed(self, graph: str) -> list[tuple[float, float]]:
        """``replay``, returning each launch's (start from the first, duration) in seconds."""
        times, t0 = [], time.perf_counter()
        for launch, args in self._launches(graph):
            start = time.perf_counter()
            self._run(launch, args)
            times.append((start - t0, time.perf_counter() - start))
        return times

    def synchronize(self) -> None:
        pass
