"""runner/cpu.py against independent references: torch float64 for the math, a slow bit-by-bit int4
unpack written from int4.py's docstring, SDPA for attention, hand-crafted expectations for sampling.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from grokc.abi import rng
from grokc.abi.ops import KERNEL_ABI
from grokc.abi.ops import KV_BLOCK_SIZE as S
from grokc.artifacts.plan import Arg, Buffer, BufferKind, GraphPlan, Launch, Plan
from grokc.core.errors import ArtifactError
from grokc.runner.cpu import OPS, CpuExecutor

F16, F32, I32 = np.float16, np.float32, np.int32


def t64(a) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


# -- int4 reference ----------------------------------------------------------------------------

def ref_unpack(packed: np.ndarray) -> np.ndarray:
    """Codes [N, K], one bit operation at a time: a word is 4 little-endian bytes and its nibble j
    (bits 4j..4j+3) holds code e[ORDER[j]] of the word's 8 consecutive codes."""
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    n, half = packed.shape
    codes = np.zeros((n, 2 * half), np.int64)
    for r in range(n):
        for w in range(half // 4):
            word = sum(int(packed[r, 4 * w + m]) << (8 * m) for m in range(4))
            for j in range(8):
                codes[r, 8 * w + order[j]] = (word >> (4 * j)) & 0xF
    return codes


def test_ref_unpack_reads_the_documented_nibble_order():
    # codes 0..7 of one word: nibbles (low to high) hold e0 e2 e4 e6 e1 e3 e5 e7 = 0 2 4 6 1 3 5 7
    word = sum(c << (4 * j) for j, c in enumerate([0, 2, 4, 6, 1, 3, 5, 7]))
    packed = np.frombuffer(word.to_bytes(4, "little"), np.uint8).reshape(1, 4)
    assert ref_unpack(packed).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]


# -- linear ------------------------------------------------------------------------------------

WEIGHTS = {  # id: (weight_format, group_size, K, zeros given)
    "f16": ("f16", 0, 64, False),
    "q4-channel-sym": ("q4", 0, 64, False),
    "q4-g32": ("q4", 32, 64, True),
    "q4-g32-K80": ("q4", 32, 80, True),   # last group has 16 columns
    "q4-g48-K80-sym": ("q4", 48, 80, False),
    "q8-channel-sym": ("q8", 0, 64, False),
    "q8-channel-zeros-K48": ("q8", 0, 48, True),
    "q8-g32-K80": ("q8", 32, 80, True),   # groups: the ABI allows them (only the LM head is q8, per channel)
}
# q8: one code per byte, code 128 is zero unless zeros are given (abi/int8.py); numpy reads it here.
_Q = {"q4": dict(symmetric=8.0, zeros=(5, 11), scales=(0.01, 0.05)),
      "q8": dict(symmetric=128.0, zeros=(100, 156), scales=(0.0006, 0.003))}


@pytest.mark.parametrize("residual,out_dtype", [("none", "f16"), ("none", "f32"), ("separate", "f16"),
                                                ("separate", "f32"), ("alias", "f16")])  # alias: both f16
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("act", ["none", "silu_mul"])
@pytest.mark.parametrize("weight", list(WEIGHTS))
def test_linear(weight, act, norm, residual, out_dtype):
    fmt, gs, k, with_zeros = WEIGHTS[weight]
    gen = np.random.default_rng(0)
    m, n, eps = 5, 24, 1e-5
    nw = 2 * n if act == "silu_mul" else n
    x = gen.standard_normal((m, k)).astype(F16)
    args = dict(x=x, scales=None, zeros=None, norm=None, residual=None, addend=None, bias=None, M=m, N=n, K=k,
                group_size=gs, eps=eps)
    if fmt == "f16":
        args["weight"] = (0.1 * gen.standard_normal((nw, k))).astype(F16)
        w_ref = t64(args["weight"])
    else:
        q = _Q[fmt]
        groups = math.ceil(k / (gs or k))
        args["weight"] = gen.integers(0, 256, (nw, k // 2 if fmt == "q4" else k), dtype=np.uint8)
        args["scales"] = gen.uniform(*q["scales"], (nw, groups)).astype(F16)
        zero = np.full((nw, groups), q["symmetric"])
        if with_zeros:
            args["zeros"] = gen.uniform(*q["zeros"], (nw, groups)).astype(F16)
            zero = args["zeros"].astype(np.float64)
        col_group = np.arange(k) // (gs or k)
        scale = args["scales"].astype(np.float64)
        codes = ref_unpack(args["weight"]) if fmt == "q4" else args["weight"].astype(np.float64)
        w_ref = t64((codes - zero[:, col_group]) * scale[:, col_group])
    xr = t64(x)
    if norm:
        args["norm"] = (1 + 0.2 * gen.standard_normal(k)).astype(F16)
        xr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + eps) * t64(args["norm"])
    y = xr @ w_ref.T
    if act == "silu_mul":
        y = F.silu(y[:, :n]) * y[:, n:]
    out = np.full((m, n), 7, F16 if out_dtype == "f16" else F32)
    if residual != "none":
        res = gen.standard_normal((m, n)).astype(F16)
        y = y + t64(res)
        args["residual"] = res
        if residual == "alias":
            out = res
    args["out"] = out
    OPS["linear"](args, {"weight_format": fmt, "act": act, "out_dtype": out_dtype})
    tol = 2e-3 if out_dtype == "f16" else 1e-5
    np.testing.assert_allclose(out.astype(np.float64), y.numpy(), rtol=tol, atol=tol)


def test_linear_rejects_unknown_variant_and_wrong_dtype():
    x, w, out = np.ones((1, 8), F16), np.ones((4, 8), F16), np.zeros((1, 4), F16)
    args = dict(out=out, x=x, weight=w, scales=None, zeros=None, norm=None, residual=None, addend=None, bias=None,
                M=1, N=4, K=8, group_size=0, eps=1e-5)
    with pytest.raises(ArtifactError, match="weight_format"):
        OPS["linear"](args, {"weight_format": "q3"})
    with pytest.raises(ArtifactError, match="'x'"):
        OPS["linear"]({**args, "x": x.astype(F32)}, {})


# -- sparse_residual and the linear's addend ----------------------------------------------------

def ref_csr(rowptr, cols, vals, nw: int, k: int) -> np.ndarray:
    """The CSR as a dense float64 ``[NW, K]``, one entry at a time."""
    dense = np.zeros((nw, k))
    for r in range(nw):
        for e in range(int(rowptr[r]), int(rowptr[r + 1])):
            dense[r, int(cols[e])] += float(vals[e])
    return dense


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("act", ["none", "silu_mul"])
def test_sparse_residual_then_linear_equals_the_corrected_dense_weight(act, norm, m):
    """sparse_residual's product as the linear's addend gives prologue(x) @ (Wq + S)^T, S the CSR."""
    gen = np.random.default_rng(3)
    n, k, eps = 12, 32, 1e-5
    nw = 2 * n if act == "silu_mul" else n
    x = gen.standard_normal((m, k)).astype(F16)
    packed = gen.integers(0, 256, (nw, k // 2), dtype=np.uint8)
    scales = gen.uniform(0.01, 0.05, (nw, 1)).astype(F16)
    wq = (ref_unpack(packed) - 8.0) * scales.astype(np.float64)          # [NW, K]
    mask = gen.random((nw, k)) < 0.1
    mask[0] = False                                                      # an empty row
    mask[nw - 1] = True                                                  # a full row
    rows, cols = np.nonzero(mask)
    rowptr = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(I32)
    vals = (0.2 * gen.standard_normal(rows.size)).astype(F16)
    g = (1 + 0.2 * gen.standard_normal(k)).astype(F16) if norm else None
    res = gen.standard_normal((m, n)).astype(F16)

    xr = t64(x)
    if norm:
        xr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + eps) * t64(g)
    s_ref = ref_csr(rowptr, cols, vals, nw, k)
    delta_ref = xr @ t64(s_ref).T                                        # [M, NW]
    y = xr @ t64(wq + s_ref).T
    if act == "silu_mul":
        y = F.silu(y[:, :n]) * y[:, n:]
    y = y + t64(res)

    delta = np.full((m, nw), np.nan, F32)
    OPS["sparse_residual"](dict(out=delta, x=x, norm=g, rowptr=rowptr, cols=cols.astype(I32), vals=vals,
                                M=m, NW=nw, K=k, eps=eps), {})
    np.testing.assert_allclose(delta, delta_ref.numpy(), rtol=1e-5, atol=1e-6)
    assert np.all(delta[:, 0] == 0)
    out = np.full((m, n), np.nan, F32)
    OPS["linear"](dict(out=out, x=x, weight=packed, scales=scales, zeros=None, norm=g, residual=res, addend=delta, bias=None,
                       M=m, N=n, K=k, group_size=0, eps=eps), {"weight_format": "q4", "act": act, "out_dtype": "f32"})
    np.testing.assert_allclose(out, y.numpy(), rtol=1e-5, atol=1e-5)


def test_sparse_residual_rejects_a_malformed_csr():
    base = dict(out=np.zeros((1, 2), F32), x=np.ones((1, 8), F16), norm=None, cols=np.array([1, 9], I32),
                vals=np.ones(2, F16), M=1, NW=2, K=8, eps=0.0)
    with pytest.raises(ArtifactError, match="column"):
        OPS["sparse_residual"]({**base, "rowptr": np.array([0, 1, 2], I32)}, {})
    with pytest.raises(ArtifactError, match="rowptr"):
        OPS["sparse_residual"]({**base, "rowptr": np.array([0, 2, 1], I32)}, {})


# -- embedding, take_last ----------------------------------------------------------------------

def test_embedding_rows_and_out_of_range_tokens():
    table = np.random.default_rng(1).standard_normal((10, 8)).astype(F16)
    tokens = np.array([3, -1, 9, 10, 0, 4], I32)   # the last one is past n
    out = np.full((7, 8), 5, F16)
    OPS["embedding"](dict(out=out, tokens=tokens, table=table, scales=None, zeros=None, n=5, hidden=8, vocab=10,
                          group_size=0, scale=1.0), {})
    want = [table[3], np.zeros(8), table[9], np.zeros(8), table[0], np.full(8, 5), np.full(8, 5)]
    np.testing.assert_array_equal(out, np.array(want, F16))


def quantized_table(fmt: str, vocab: int, hidden: int, gs: int, asym: bool, seed: int):
    """Random (stored table, scales, zeros, codes [V, H]) of a q8/q4 embedding; integer-valued zero-points as
    the quantizer makes them, so (code - zero) * scale is exact in f32 and the only rounding is to f16."""
    gen = np.random.default_rng(seed)
    groups = -(-hidden // (gs or hidden))
    scales = gen.uniform(0.01, 0.2, (vocab, groups)).astype(F16)
    if fmt == "q4":
        packed = gen.integers(0, 256, (vocab, hidden // 2), dtype=np.uint8)
        codes = ref_unpack(packed)
        zeros = gen.integers(0, 16, (vocab, groups)).astype(F16) if asym else None
        return packed, scales, zeros, codes
    codes = gen.integers(0, 256, (vocab, hidden), dtype=np.uint8)
    zeros = gen.integers(0, 256, (vocab, groups)).astype(F16) if asym else None
    return codes, scales, zeros, codes.astype(np.int64)


@pytest.mark.parametrize("fmt", ["q4", "q8"])
@pytest.mark.parametrize("gs,asym", [(0, False), (0, True), (16, True), (32, False)])   # 32: a short last group
def test_quantized_embedding_rows_match_reference(fmt, gs, asym):
    vocab, hidden, n = 12, 48, 6
    table, scales, zeros, codes = quantized_table(fmt, vocab, hidden, gs, asym, seed=gs + asym)
    tokens = np.array([3, -1, 11, 12, 0, 3, 7], I32)   # -1 and 12 out of range; the last one is past n
    out = np.full((7, hidden), 5, F16)
    OPS["embedding"](dict(out=out, tokens=tokens, table=table, scales=scales, zeros=zeros, n=n, hidden=hidden,
                          vocab=vocab, group_size=gs, scale=1.0), {"weight_format": fmt})
    group = np.arange(hidden) // (gs or hidden)                       # column -> group
    midpoint = 8 if fmt == "q4" else 128
    for i, t in enumerate(tokens[:n]):
        if not 0 <= t < vocab:
            want = np.zeros(hidden)
        else:
            zero = np.full(hidden, midpoint, np.float64) if zeros is None else zeros[t, group].astype(np.float64)
            want = (codes[t] - zero) * scales[t, group].astype(np.float64)
        np.testing.assert_array_equal(out[i], want.astype(F16), err_msg=f"row {i}")
    np.testing.assert_array_equal(out[n], np.full(hidden, 5, F16))   # rows past n untouched


def test_quantized_embedding_refuses_a_group_size_off_the_8_grid():
    table, scales, zeros, _ = quantized_table("q4", 4, 48, 0, False, seed=0)
    args = dict(out=np.zeros((1, 48), F16), tokens=np.array([1], I32), table=table,
                scales=np.ones((4, 4), F16), zeros=None, n=1, hidden=48, vocab=4, group_size=12, scale=1.0)
    with pytest.raises(ArtifactError, match="group_size"):
        OPS["embedding"](args, {"weight_format": "q4"})
    with pytest.raises(ArtifactError, match="weight_format"):
        OPS["embedding"]({**args, "group_size": 0, "scales": scales}, {"weight_format": "q2"})


def test_take_last():
    x = np.arange(48, dtype=F16).reshape(6, 8)
    out = np.zeros((1, 8), F16)
    OPS["take_last"](dict(out=out, x=x, n_real=np.array([4], I32), hidden=8), {})
    np.testing.assert_array_equal(out[0], x[3])


# -- attention ---------------------------------------------------------------------------------

NH, NKV, D, MB = 4, 2, 16, 4
THETA = 10000.0
QKV = (NH + 2 * NKV) * D


def rope_ref(pos, mscale: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float64 [T, D/2] from theta, analytically."""
    inv = THETA ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    angle = np.outer(np.asarray(pos, np.float64), inv)
    return mscale * np.cos(angle), mscale * np.sin(angle)


def rope_args(table_len: int, mscale: float) -> dict:
    cos, sin = rope_ref(np.arange(table_len), mscale)
    return dict(rope_table=np.stack([cos, sin], -1).astype(F32).reshape(table_len, D // 2, 2),
                inv_freq=(THETA ** (-np.arange(0, D, 2, dtype=np.float64) / D)).astype(F32),
                n_heads=NH, n_kv_heads=NKV, head_dim=D, table_len=table_len, max_blocks=MB, window=0,
                scale=1 / math.sqrt(D), mscale=mscale, softcap=0.0)


def rotate_ref(x: torch.Tensor, pos, mscale: float) -> torch.Tensor:
    """Rotate-half RoPE of float64 [T, heads, D], then rounded to f16 as the spec says."""
    cos, sin = (t64(a)[:, None, :] for a in rope_ref(pos, mscale))
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).half().double()


def sdpa_ref(q, k, v, causal: bool) -> np.ndarray:
    """[T, NH*D] from q [T, NH, D] and k, v [S, NKV, D] (float64), GQA by repeat_interleave."""
    q, k, v = (a.transpose(0, 1)[None] for a in (q, k, v))  # [1, heads, T, D]
    k, v = (a.repeat_interleave(NH // NKV, dim=1) for a in (k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1 / math.sqrt(D))
    return o[0].transpose(0, 1).reshape(q.shape[2], NH * D).numpy()


def split_ref(qkv_rows: np.ndarray) -> tuple[torch.Tensor, ...]:
    x = t64(qkv_rows).reshape(-1, NH + 2 * NKV, D)
    return x[:, :NH], x[:, NH:NH + NKV], x[:, NH + NKV:]


def caches(nb: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """KV pools full of stale random content, so untouched entries can be checked."""
    gen = np.random.default_rng(seed)
    return tuple(gen.standard_normal((nb, NKV, S, D)).astype(F16) for _ in range(2))


def check_cache(got, old, written: dict, exact: bool):
    """``written`` maps (block, row) -> expected [NKV, D]; everything else must equal ``old``."""
    mask = np.zeros(old.shape, bool)
    for (blk, row), want in written.items():
        mask[blk, :, row] = True
        if exact:
            np.testing.assert_array_equal(got[blk, :, row], want)
        else:  # rotated k: our f32 rotation and the f64 one may round to neighbouring f16 values
            np.testing.assert_allclose(got[blk, :, row].astype(np.float64), want, rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(got[~mask], old[~mask])


@pytest.mark.parametrize("table_len,mscale", [(64, 1.0), (20, 1.25), (0, 1.0)],
                         ids=["table", "fallback-past-20", "no-table"])
def test_attention_prefill(table_len, mscale):
    L, t_real, slot, nb = 48, 37, 1, 10
    gen = np.random.default_rng(2)
    qkv = gen.standard_normal((L, QKV)).astype(F16)
    block_table = np.array([[0, 1, 3, 4], [7, 2, 9, 5], [6, 8, -1, -1]], I32)  # slot 1: scattered
    k_cache, v_cache = caches(nb, 3)
    k_old, v_old = k_cache.copy(), v_cache.copy()
    out = np.ones((L, NH * D), F16)
    OPS["attention_prefill"](dict(out=out, qkv=qkv, k_cache=k_cache, v_cache=v_cache,
                                  block_table=block_table, slot=np.array([slot], I32),
                                  n_real=np.array([t_real], I32), L=L, **rope_args(table_len, mscale)), {})
    pos = np.arange(t_real)
    q, k, v = split_ref(qkv[:t_real])
    q, k = rotate_ref(q, pos, mscale), rotate_ref(k, pos, mscale)
    np.testing.assert_allclose(out[:t_real].astype(np.float64), sdpa_ref(q, k, v, causal=True),
                               rtol=2e-3, atol=2e-3)
    assert not out[t_real:].any()
    where = {t: (block_table[slot, t // S], t % S) for t in range(t_real)}
    check_cache(k_cache, k_old, {where[t]: k[t].numpy() for t in pos}, exact=False)
    check_cache(v_cache, v_old, {where[t]: qkv[t, (NH + NKV) * D:].reshape(NKV, D) for t in pos}, exact=True)


def test_attention_decode():
    nb, table_len, mscale = 12, 20, 1.25
    gen = np.random.default_rng(4)
    positions = np.array([5, 999, 40], I32)     # slot 1 is inactive, its position is junk
    active = np.array([1, 0, 1], I32)
    block_table = np.array([[3, 8, 1, 6], [4, 9, 0, 2], [11, 7, 10, 5]], I32)
    qkv = gen.standard_normal((3, QKV)).astype(F16)
    k_cache, v_cache = caches(nb, 5)
    k_old, v_old = k_cache.copy(), v_cache.copy()
    out = np.ones((3, NH * D), F16)
    OPS["attention_decode"](dict(out=out, qkv=qkv, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                 positions=positions, active=active, B=3,
                                 **rope_args(table_len, mscale)), {})
    k_written, v_written = {}, {}
    for b in (0, 2):
        p = int(positions[b])
        q, k_new, v_new = split_ref(qkv[b:b + 1])
        q, k_new = rotate_ref(q, [p], mscale), rotate_ref(k_new, [p], mscale)
        where = [(block_table[b, t // S], t % S) for t in range(p)]   # the earlier positions
        keys = torch.cat([t64(np.array([k_old[blk, :, row] for blk, row in where])), k_new])
        values = torch.cat([t64(np.array([v_old[blk, :, row] for blk, row in where])), v_new])
        np.testing.assert_allclose(out[b].astype(np.float64), sdpa_ref(q, keys, values, causal=False)[0],
                                   rtol=2e-3, atol=2e-3)
        cell = (block_table[b, p // S], p % S)
        k_written[cell], v_written[cell] = k_new[0].numpy(), qkv[b, (NH + NKV) * D:].reshape(NKV, D)
    assert not out[1].any()
    check_cache(k_cache, k_old, k_written, exact=False)
    check_cache(v_cache, v_old, v_written, exact=True)


def test_decode_after_prefill_equals_longer_prefill():
    L, T, nb, table_len = 32, 21, 8, 16   # position T is past the table
    gen = np.random.default_rng(6)
    qkv = gen.standard_normal((L, QKV)).astype(F16)
    block_table = np.array([[5, 1, 6, 2], [0, 3, 4, 7]], I32)
    rope = rope_args(table_len, 1.0)

    def prefill(n_real):
        k_cache, v_cache = caches(nb, 7)
        out = np.zeros((L, NH * D), F16)
        OPS["attention_prefill"](dict(out=out, qkv=qkv, k_cache=k_cache, v_cache=v_cache,
                                      block_table=block_table, slot=np.array([0], I32),
                                      n_real=np.array([n_real], I32), L=L, **rope), {})
        return out, k_cache, v_cache

    out_long, k_long, v_long = prefill(T + 1)
    _, k_cache, v_cache = prefill(T)             # row T is padding here
    out = np.zeros((2, NH * D), F16)
    OPS["attention_decode"](dict(out=out, qkv=np.stack([qkv[T], qkv[0]]), k_cache=k_cache, v_cache=v_cache,
                                 block_table=block_table, positions=np.array([T, 3], I32),
                                 active=np.array([1, 0], I32), B=2, **rope), {})
    np.testing.assert_allclose(out[0].astype(np.float64), out_long[T].astype(np.float64),
                               rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(k_cache, k_long)
    np.testing.assert_array_equal(v_cache, v_long)


# -- sample ------------------------------------------------------------------------------------

def sample_args(logits, *, b=None, max_out=4, eos=(), slot=None, n_real=None, **state) -> dict:
    """args for OPS["sample"]: B slots of default state, overridden per name by ``state``."""
    logits = np.asarray(logits, F32).reshape(-1, np.shape(logits)[-1])
    b = b or logits.shape[0]
    base = dict(temperature=np.zeros(b, F32), top_k=np.zeros(b, I32), top_p=np.ones(b, F32),
                seed=np.arange(b, dtype=I32), tokens=np.zeros(b, I32), positions=np.zeros(b, I32),
                active=np.ones(b, I32), out_tokens=np.full((b, max_out), -1, I32),
                out_count=np.zeros(b, I32), max_new=np.full(b, 100, I32))
    for name, value in state.items():
        base[name] = np.broadcast_to(np.asarray(value, base[name].dtype), base[name].shape).copy()
    return dict(logits=logits, M=logits.shape[0], V=logits.shape[1],
                slot=None if slot is None else np.array([slot], I32),
                n_real=None if n_real is None else np.array([n_real], I32),
                eos_ids=np.array(eos, I32), n_eos=len(eos), max_out=max_out, **base)


def test_greedy_is_argmax_with_lowest_index_on_ties():
    logits = np.random.default_rng(8).integers(0, 4, (64, 12)).astype(F32)  # many ties
    args = sample_args(logits)
    OPS["sample"](args, {})
    assert args["tokens"].tolist() == [row.tolist().index(max(row)) for row in logits]


def test_top_k_1_is_greedy():
    logits = np.random.default_rng(9).standard_normal((64, 50)).astype(F32)
    args = sample_args(logits, temperature=0.8, top_k=1)
    OPS["sample"](args, {})
    assert args["tokens"].tolist() == logits.argmax(1).tolist()


def ref_distribution(logits, temperature, top_k, top_p) -> np.ndarray:
    """The renormalised top-k/top-p distribution in float64, straight from the ABI's wording."""
    logit = t64(logits) / temperature
    prob = torch.softmax(logit, 0)
    keep = torch.ones_like(prob, dtype=torch.bool)
    if 0 < top_k < len(prob):
        keep = logit >= torch.sort(logit, descending=True).values[top_k - 1]
    if 0 < top_p < 1:
        kept_mass = prob[keep].sum()
        tau = max(t for t in prob[keep].tolist() if prob[keep & (prob >= t)].sum() >= top_p * kept_mass)
        keep &= prob >= tau
    dist = torch.where(keep, prob, 0)
    return (dist / dist.sum()).numpy()


CRAFTED = np.log(np.array([0.25, 0.05, 0.15, 0.02, 0.2, 0.08, 0.12, 0.03, 0.06, 0.04]))
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88}


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.0, 0, 0.65),
                                                     (1.3, 6, 0.8), (2.0, 20, 0.95)])
def test_sampling_follows_the_renormalised_distribution(temperature, top_k, top_p):
    """Over 4000 seeds, (a) every draw is the inverse-CDF pick of u = uniform(seed, 0) in the
    reference distribution, except where u lies within 1e-5 of a CDF step (f32 vs f64 masses), and
    (b) the counts pass a chi-square test at the 0.999 quantile (dof = kept tokens - 1). The seeds
    are fixed, so the test is deterministic; (b) guards the hash's uniformity, (a) the walk."""
    n = 4000
    logits = np.tile(CRAFTED.astype(F32), (n, 1))
    args = sample_args(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                       seed=np.arange(n) * 2654435761 % 2**31)
    OPS["sample"](args, {})
    dist = ref_distribution(CRAFTED.astype(F32), temperature, top_k, top_p)
    cdf = np.cumsum(dist)
    u = np.array([float(rng.uniform(int(s), 0)) for s in args["seed"]])
    want = np.searchsorted(cdf, u)          # first index whose cumulative mass reaches u
    near_step = np.abs(u[:, None] - cdf[None, :]).min(1) < 1e-5
    assert ((args["tokens"] == want) | near_step).all()
    counts = np.bincount(args["tokens"], minlength=len(dist))
    kept = dist > 0
    assert not counts[~kept].any()
    expected = n * dist[kept]
    chi2 = ((counts[kept] - expected) ** 2 / expected).sum()
    assert chi2 < CHI2_999[kept.sum() - 1]


@pytest.mark.parametrize("probs,top_k,top_p,kept", [
    ([0.4, 0.3, 0.2, 0.1], 0, 0.3, {0}),
    ([0.4, 0.3, 0.2, 0.1], 0, 0.65, {0, 1}),
    ([0.4, 0.3, 0.2, 0.1], 0, 0.75, {0, 1, 2}),
    ([0.2, 0.3, 0.2, 0.3], 0, 0.5, {1, 3}),         # the tied pair is enough
    ([0.2, 0.3, 0.2, 0.3], 0, 0.7, {0, 1, 2, 3}),   # tau = 0.2 keeps both of its ties
    ([0.4, 0.3, 0.2, 0.1], 3, 0.8, {0, 1, 2}),      # 0.8 of the top-3 mass 0.9 is 0.72
    ([0.4, 0.3, 0.2, 0.1], 3, 0.7, {0, 1}),         # 0.7 * 0.9 = 0.63 <= 0.7
    ([0.1, 0.4, 0.2, 0.2, 0.1], 2, 1.0, {1, 2, 3}), # top-k ties with the 2nd largest are kept
])
def test_kept_sets(probs, top_k, top_p, kept):
    n = 2000
    args = sample_args(np.tile(np.log(probs), (n, 1)), temperature=1.0, top_k=top_k, top_p=top_p)
    OPS["sample"](args, {})
    assert set(args["tokens"].tolist()) == kept


def test_decode_state_updates():
    logits = np.full((5, 6), -1.0, F32)
    logits[[0, 1, 2, 3, 4], [2, 0, 5, 1, 3]] = 1.0           # greedy picks
    args = sample_args(logits, max_out=3, eos=(4, 5, 2), active=[1, 0, 1, 1, 1],
                       out_count=[1, 0, 0, 2, 3], positions=[7, 3, 0, 9, 20], max_new=[10, 10, 10, 3, 10])
    args["n_eos"] = 2                                         # eos_ids holds 4, 5; the 2 is past n_eos
    before = {k: v.copy() for k, v in args.items() if isinstance(v, np.ndarray)}
    OPS["sample"](args, {})
    assert args["tokens"].tolist() == [2, 0, 5, 1, 3]
    assert args["out_count"].tolist() == [2, 0, 1, 3, 4]
    assert args["positions"].tolist() == [8, 3, 1, 10, 21]
    assert args["active"].tolist() == [1, 0, 0, 0, 1]         # slot 2: eos; slot 3: max_new reached
    assert args["out_tokens"].tolist() == [[-1, 2, -1], [-1] * 3, [5, -1, -1], [-1, -1, 1], [-1] * 3]
    for name in ("temperature", "top_k", "top_p", "seed", "max_new", "logits"):
        np.testing.assert_array_equal(args[name], before[name])
    assert args["tokens"][1] == before["tokens"][1]            # the inactive slot is untouched


@pytest.mark.parametrize("max_new,active_after", [(4, 1), (1, 0)])
def test_prefill_state_updates(max_new, active_after):
    logits = np.zeros((1, 6), F32)
    logits[0, 3] = 1.0
    args = sample_args(logits, b=4, slot=2, n_real=7, active=0, out_count=9, positions=[1, 2, 3, 4],
                       max_new=max_new)
    OPS["sample"](args, {})
    assert args["tokens"].tolist() == [0, 0, 3, 0]
    assert args["out_tokens"][2].tolist() == [3, -1, -1, -1]   # c = 0 in prefill, whatever out_count was
    assert args["out_count"].tolist() == [9, 9, 1, 9]
    assert args["positions"].tolist() == [1, 2, 7, 4]
    assert args["active"].tolist() == [0, 0, active_after, 0]


def test_same_seed_and_count_give_the_same_token():
    logits = np.tile(CRAFTED.astype(F32), (6, 1))
    args = sample_args(logits, temperature=1.0, seed=[11, 11, 11, 12, 12, 12], out_count=[3, 3, 4, 3, 3, 4])
    OPS["sample"](args, {})
    again = sample_args(logits, temperature=1.0, seed=[11, 11, 11, 12, 12, 12], out_count=[3, 3, 4, 3, 3, 4])
    OPS["sample"](again, {})
    t = args["tokens"]
    assert t[0] == t[1] and t[3] == t[4]
    np.testing.assert_array_equal(t, again["tokens"])
    counts = [c for c in range(64)]                       # over counts, one seed draws many tokens
    draws = sample_args(np.tile(CRAFTED.astype(F32), (64, 1)), temperature=1.0, seed=11, out_count=counts)
    OPS["sample"](draws, {})
    assert len(set(draws["tokens"].tolist())) > 3


# -- executor ----------------------------------------------------------------------------------

def _args(op: str, **given) -> tuple[Arg, ...]:
    """Args in ABI order: ``name="buf:x"`` / ``"w:name"`` / a number / None (null)."""
    out = []
    for p in KERNEL_ABI[op]:
        v = given[p.name]
        if isinstance(v, str):
            kind, ref = v.split(":")
            out.append(Arg(p.name, buffer=ref) if kind == "buf" else Arg(p.name, weight=ref))
        else:
            out.append(Arg(p.name, value=v))
    return tuple(out)


def tiny_plan(op: str = "embedding") -> tuple[Plan, dict[str, np.ndarray]]:
    gen = np.random.default_rng(10)
    weights = {"emb": gen.standard_normal((10, 16)).astype(F16),
               "w": gen.integers(0, 256, (8, 8), dtype=np.uint8),
               "s": gen.uniform(0.02, 0.05, (8, 1)).astype(F16),
               "g": (1 + 0.1 * gen.standard_normal(16)).astype(F16)}
    buffers = {b.name: b for b in [
        Buffer("io.prompt", BufferKind.IO, "int32", (4,), 0),
        Buffer("x", BufferKind.SCRATCH, "float16", (4, 16), 256),
        Buffer("x_bytes", BufferKind.SCRATCH, "uint8", (128,), 256),   # aliases x
        Buffer("y", BufferKind.IO, "float32", (4, 8), 768),
    ]}
    launches = (
        Launch(op, "k_emb", (1, 1, 1), (32, 1, 1), 0, node="embed",
               args=_args("embedding", out="buf:x", tokens="buf:io.prompt", table="w:emb", scales=None,
                          zeros=None, n=4, hidden=16, vocab=10, group_size=0, scale=1.0)),
        Launch("linear", "k_lin", (1, 1, 1), (32, 1, 1), 0, node="head",
               attrs={"weight_format": "q4", "act": "none", "out_dtype": "f32"},
               args=_args("linear", out="buf:y", x="buf:x", weight="w:w", scales="w:s", zeros=None,
                          norm="w:g", residual=None, addend=None, bias=None, M=4, N=8, K=16, group_size=0, eps=1e-5)),
    )
    return Plan("cpu", 1024, buffers, {"g": GraphPlan("g", 4, launches, "y")}), weights


def test_executor_replays_a_tiny_plan():
    plan, weights = tiny_plan()
    plan.validate()
    ex = CpuExecutor(plan, weights)
    ex.write("io.prompt", np.array([1, 11, 3, 0]))   # 11 is out of range: a zero row
    ex.replay("g")
    ex.synchronize()
    x = ex.read("x")
    emb = weights["emb"]
    np.testing.assert_array_equal(x, np.stack([emb[1], np.zeros(16), emb[3], emb[0]]))
    np.testing.assert_array_equal(ex.read("x_bytes").view(F16).reshape(4, 16), x)  # x sits at offset 256
    xr = t64(x)
    xr = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-5) * t64(weights["g"])
    w = t64((ref_unpack(weights["w"]) - 8) * weights["s"].astype(np.float64))
    y = ex.read("y")
    np.testing.assert_allclose(y, (xr @ w.T).numpy(), rtol=1e-5, atol=1e-5)

    y[...] = 0                                       # read gives a copy
    assert ex.read("y").any()
    first = ex.read("y")
    ex.write("io.prompt", 7, index=1)                # one element
    ex.replay("g")                                   # second replay: the q4 weight comes from the cache
    np.testing.assert_array_equal(ex.read("x")[1], weights["emb"][7])
    np.testing.assert_array_equal(ex.read("y")[[0, 2, 3]], first[[0, 2, 3]])
    assert not np.array_equal(ex.read("y")[1], first[1])


def test_executor_second_replay_matches_first():
    plan, weights = tiny_plan()
    ex = CpuExecutor(plan, weights)
    ex.write("io.prompt", np.array([2, 5, 9, 1]))
    ex.replay("g")
    first = ex.read("y")
    ex.write("y", np.zeros((4, 8)))
    ex.replay("g")
    np.testing.assert_array_equal(ex.read("y"), first)


def test_executor_errors_are_artifact_errors():
    plan, weights = tiny_plan(op="conv2d")
    with pytest.raises(ArtifactError, match="conv2d"):
        CpuExecutor(plan, weights)
    plan, weights = tiny_plan()
    with pytest.raises(ArtifactError, match="'g'"):
        CpuExecutor(plan, {k: v for k, v in weights.items() if k != "g"})
    with pytest.raises(ArtifactError, match="decode"):
        CpuExecutor(plan, weights).replay("decode")


# -- the families' ops: windows, norms, biases, GeGLU, the embedding scale ---------------------

def sdpa_window_ref(q, k, v, window: int) -> np.ndarray:
    """Causal SDPA (float64) where query t sees keys t - window < j <= t."""
    t = q.shape[0]
    i = torch.arange(t)
    mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
    q, k, v = (a.transpose(0, 1)[None] for a in (q, k, v))
    k, v = (a.repeat_interleave(NH // NKV, dim=1) for a in (k, v))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / math.sqrt(D))
    return o[0].transpose(0, 1).reshape(t, NH * D).numpy()


def prefill_then_decode(qkv: np.ndarray, rope: dict, t_real: int = 37) -> tuple[np.ndarray, ...]:
    """The ops' prefill of rows ``0..t_real-1`` of ``qkv [L + 1, QKV]`` (bucket L), then their decode
    of row L at position t_real: (prefill out [t_real, NH*D], decode out [NH*D], and q, k, v [t_real + 1,
    heads, D] of those rows as the reference sees them, q and k rotated)."""
    L, nb = qkv.shape[0] - 1, 8
    block_table = np.array([[5, 1, 6, 2], [0, 3, 4, 7]], I32)
    k_cache, v_cache = caches(nb, 8)
    out = np.zeros((L, NH * D), F16)
    OPS["attention_prefill"](dict(out=out, qkv=qkv[:L], k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                  slot=np.array([0], I32), n_real=np.array([t_real], I32), L=L, **rope), {})
    step = np.zeros((2, NH * D), F16)
    OPS["attention_decode"](dict(out=step, qkv=np.stack([qkv[L], qkv[L]]), k_cache=k_cache, v_cache=v_cache,
                                 block_table=block_table, positions=np.array([t_real, 0], I32),
                                 active=np.array([1, 0], I32), B=2, **rope), {})
    pos = np.arange(t_real + 1)
    q, k, v = split_ref(np.concatenate([qkv[:t_real], qkv[L:]]))
    return out[:t_real], step[0], rotate_ref(q, pos, 1.0), rotate_ref(k, pos, 1.0), v


@pytest.mark.parametrize("window", [1, 5, 16, 100])
def test_attention_windows_in_prefill_and_decode(window):
    """A local layer: prefill of 37 tokens, then decode of token 37, both against SDPA over the window."""
    qkv = np.random.default_rng(window).standard_normal((49, QKV)).astype(F16)
    out, step, q, k, v = prefill_then_decode(qkv, {**rope_args(64, 1.0), "window": window})
    want = sdpa_window_ref(q, k, v, window)
    np.testing.assert_allclose(out.astype(np.float64), want[:-1], rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(step.astype(np.float64), want[-1], rtol=2e-3, atol=2e-3)


def capped_attention_ref(q, k, v, cap: float) -> np.ndarray:
    """Causal attention (float64) whose scaled scores s are capped to cap * tanh(s / cap) before the
    softmax (Grok-1's attention), written out: scores, cap, mask, softmax, weighted values."""
    t, g = q.shape[0], NH // NKV
    k, v = (a.repeat_interleave(g, dim=1) for a in (k, v))                       # [T, NH, D]
    s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)                        # [NH, T, T]
    s = cap * torch.tanh(s / cap)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(s, -1), v).reshape(t, NH * D).numpy()


def test_attention_softcap_in_prefill_and_decode():
    """Grok-1's capped scores: prefill of 37 tokens, then decode of token 37, against the written-out
    reference; the cap (1.5, where the scores spread over about +-4) changes the output far beyond
    the tolerance."""
    qkv = (1.5 * np.random.default_rng(12).standard_normal((49, QKV))).astype(F16)
    out, step, q, k, v = prefill_then_decode(qkv, {**rope_args(64, 1.0), "softcap": 1.5})
    want = capped_attention_ref(q, k, v, 1.5)
    assert np.abs(want - sdpa_ref(q, k, v, causal=True)).max() > 0.1    # the cap matters here
    np.testing.assert_allclose(out.astype(np.float64), want[:-1], rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(step.astype(np.float64), want[-1], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm(residual):
    gen = np.random.default_rng(9)
    x = (3 * gen.standard_normal((5, 40))).astype(F16)
    w = (1 + 0.3 * gen.standard_normal(40)).astype(F16)
    r = gen.standard_normal((5, 40)).astype(F16) if residual else None
    out = np.full((5, 40), np.nan, F16)
    OPS["rms_norm"](dict(out=out, x=x, weight=w, residual=r, M=5, hidden=40, eps=1e-6), {})
    xt = t64(x)
    want = xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + 1e-6) * t64(w) + (t64(r) if residual else 0)
    np.testing.assert_allclose(out.astype(np.float64), want.numpy(), rtol=1e-3, atol=1e-3)


def test_qk_norm():
    m, nh, nkv, d = 3, 4, 2, 32
    gen = np.random.default_rng(10)
    qkv = (2 * gen.standard_normal((m, (nh + 2 * nkv) * d))).astype(F16)
    qn, kn = (1 + 0.3 * gen.standard_normal(d)).astype(F16), gen.standard_normal(d).astype(F16)
    out = np.full_like(qkv, np.nan)
    OPS["qk_norm"](dict(out=out, qkv=qkv, q_norm=qn, k_norm=kn, M=m, n_heads=nh, n_kv_heads=nkv, head_dim=d,
                        eps=1e-6), {})
    heads = t64(qkv).reshape(m, nh + 2 * nkv, d)
    normed = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + 1e-6)
    w = torch.cat([t64(qn)[None].expand(nh, d), t64(kn)[None].expand(nkv, d), torch.ones(nkv, d)])
    want = torch.cat([normed[:, :nh + nkv], heads[:, nh + nkv:]], 1) * w
    np.testing.assert_allclose(out.reshape(m, -1, d).astype(np.float64), want.numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(out[:, (nh + nkv) * d:], qkv[:, (nh + nkv) * d:])   # v copied as it is


@pytest.mark.parametrize("act", ["none", "gelu_tanh_mul", "silu_mul"])
def test_linear_bias_and_gelu(act):
    m, n, k = 3, 8, 16
    gen = np.random.default_rng(11)
    nw = n if act == "none" else 2 * n
    x, w = gen.standard_normal((m, k)).astype(F16), gen.standard_normal((nw, k)).astype(F16)
    bias = gen.standard_normal(nw).astype(F16)
    out = np.full((m, n), np.nan, F32)
    OPS["linear"](dict(out=out, x=x, weight=w, scales=None, zeros=None, norm=None, residual=None, addend=None,
                       bias=bias, M=m, N=n, K=k, group_size=0, eps=0.0),
                  {"weight_format": "f16", "act": act, "out_dtype": "f32"})
    y = t64(x) @ t64(w).T + t64(bias)
    if act != "none":
        gate = F.gelu(y[:, :n], approximate="tanh") if act == "gelu_tanh_mul" else F.silu(y[:, :n])
        y = gate * y[:, n:]
    np.testing.assert_allclose(out, y.numpy(), rtol=1e-5, atol=1e-5)


def test_embedding_scale():
    gen = np.random.default_rng(12)
    table = gen.standard_normal((10, 8)).astype(F16)
    tokens = np.array([3, -1, 9], I32)
    out = np.full((3, 8), np.nan, F16)
    scale = float(np.float32(math.sqrt(640)))
    OPS["embedding"](dict(out=out, tokens=tokens, table=table, scales=None, zeros=None, n=3, hidden=8, vocab=10,
                          group_size=0, scale=scale), {})
    np.testing.assert_array_equal(out[0], (table[3].astype(np.float64) * scale).astype(F16))
    assert not out[1].any()
