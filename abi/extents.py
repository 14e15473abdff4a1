"""The memory each launch touches: for every pointer parameter of an op, its dtype, how many elements
the launch reads or writes through it, and whether it writes.

This is ``abi/ops.py``'s shapes as numbers, so a plan can be checked before anything runs: a
kernel reads exactly ``elements`` items of ``dtype`` from the pointer (or more, never: the CPU
executor reads the same through ``runner/cpu.py``'s ``_arr``). Where an index comes from data the
engine writes (the slot, the KV block ids), the extent covers what the engine may write: ``batch``
slots and ``kv_blocks`` blocks, from the manifest's shapes. ``rows`` is the graph's token count,
the rows ``take_last`` may pick from.

``extents`` raises ``ValueError`` naming the scalar or attribute that makes no sense (a negative
size, kv heads that do not divide the heads, an unknown variant).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from grokc.abi import mlp_tiles
from grokc.abi.ops import KERNEL_VARIANTS, KV_BLOCK_SIZE

F16, F32, I32, U8 = "float16", "float32", "int32", "uint8"
_DTYPE = {"f16": F16, "f32": F32}


@dataclass(frozen=True)
class Extent:
    dtype: str        # numpy dtype name
    elements: int     # items of dtype the launch touches from the pointer's start
    written: bool = False


def extents(op: str, scalars: Mapping[str, int | float], attrs: Mapping[str, str], *, batch: int = 1,
            kv_blocks: int = 1, rows: int = 1) -> dict[str, Extent]:
    """Pointer parameter -> ``Extent`` of one launch of ``op`` (see the module docstring)."""
    for key, allowed in KERNEL_VARIANTS.get(op, {}).items():   # other attrs only label the kernel
        if attrs.get(key, allowed[0]) not in allowed:
            raise ValueError(f"{op} has variant {key}={attrs[key]!r}; known: {', '.join(allowed)}")
    sizes = {k: v for k, v in scalars.items() if isinstance(v, int)}
    negative = [k for k, v in sizes.items() if v < 0 and k not in ("seed",)]
    if negative:
        raise ValueError(f"{op} has {negative[0]}={sizes[negative[0]]}, a negative size")
    return _OPS[op](scalars, {**{k: v[0] for k, v in KERNEL_VARIANTS.get(op, {}).items()}, **attrs},
                    max(batch, 1), max(kv_blocks, 1), max(rows, 1))


def _groups(n: int, group_size: int) -> int:
    if group_size < 0 or group_size % 8:
        raise ValueError(f"group_size={group_size} must be 0 or a multiple of 8")
    return -(-n // (group_size or n)) if n else 0


def _codes(fmt: str, rows: int, cols: int) -> Extent:
    """The weight of a linear or an embedding table: f16, or u8 codes (one a byte for q8, two for q4)."""
    if fmt == "f16":
        return Extent(F16, rows * cols)
    if fmt == "q4" and cols % 2:
        raise ValueError(f"q4 codes need an even row length, not {cols}")
    return Extent(U8, rows * cols // (2 if fmt == "q4" else 1))


def _embedding(s, a, batch, kv_blocks, rows):
    n, hidden, vocab = s["n"], s["hidden"], s["vocab"]
    g = _groups(hidden, s["group_size"])
    return {"out": Extent(F16, n * hidden, True), "tokens": Extent(I32, n),
            "table": _codes(a["weight_format"], vocab, hidden),
            "scales": Extent(F16, vocab * g), "zeros": Extent(F16, vocab * g)}


def _linear(s, a, batch, kv_blocks, rows):
    m, n, k = s["M"], s["N"], s["K"]
    nw = n if a["act"] == "none" else 2 * n   # a gated act reads gate and up rows
    g = _groups(k, s["group_size"])
    return {"out": Extent(_DTYPE[a["out_dtype"]], m * n, True), "x": Extent(_DTYPE[a["x_dtype"]], m * k),
            "weight": _codes(a["weight_format"], nw, k), "scales": Extent(F16, nw * g), "zeros": Extent(F16, nw * g),
            "norm": Extent(F16, k), "residual": Extent(_DTYPE[a["residual_dtype"]], m * n),
            "addend": Extent(F32, m * nw), "bias": Extent(F16, nw)}


def _rms_norm(s, a, batch, kv_blocks, rows):
    m, h = s["M"], s["hidden"]
    return {"out": Extent(F16, m * h, True), "x": Extent(F16, m * h), "weight": Extent(F16, h),
            "residual": Extent(F16, m * h)}


def _qk_norm(s, a, batch, kv_blocks, rows):
    m, nh, nkv, d = s["M"], s["n_heads"], s["n_kv_heads"], s["head_dim"]
    qkv = m * (nh + 2 * nkv) * d
    return {"out": Extent(F16, qkv, True), "qkv": Extent(F16, qkv), "q_norm": Extent(F16, d), "k_norm": Extent(F16, d)}


def _tiles(part: mlp_tiles.Part, hidden: int, inter: int) -> int:
    return math.prod(mlp_tiles.shape(part, hidden, inter)) // 2


def _mlp_decode(s, a, batch, kv_blocks, rows):
    h, i = s["hidden"], s["inter"]
    return {"acc": Extent(F32, h, True), "clear": Extent(F32, h, True), "x": Extent(F16, h), "norm": Extent(F16, h),
            "gate_up_tiles": Extent(U8, _tiles(mlp_tiles.Part.GATE_UP, h, i)),
            "gate_up_scales": Extent(F16, 2 * i), "gate_up_zeros": Extent(F16, 2 * i),
            "down_tiles": Extent(U8, _tiles(mlp_tiles.Part.DOWN, h, i)),
            "down_scales": Extent(F16, h), "down_zeros": Extent(F16, h)}


def _pack_mlp_tiles(s, a, batch, kv_blocks, rows):
    if s["part"] not in tuple(mlp_tiles.Part):
        raise ValueError(f"pack_mlp_tiles has part={s['part']}; known: {[int(p) for p in mlp_tiles.Part]}")
    size = _tiles(mlp_tiles.Part(s["part"]), s["hidden"], s["inter"])
    return {"out": Extent(U8, size, True), "weight": Extent(U8, size)}


def _sparse_residual(s, a, batch, kv_blocks, rows):
    m, nw, k = s["M"], s["NW"], s["K"]   # cols and vals hold nnz = rowptr[NW] entries: data, checked apart
    return {"out": Extent(F32, m * nw, True), "x": Extent(F16, m * k), "norm": Extent(F16, k),
            "rowptr": Extent(I32, nw + 1), "cols": Extent(I32, 0), "vals": Extent(F16, 0)}


def _attention(s, a, batch, kv_blocks, rows, prefill: bool):
    nh, nkv, d, mb = s["n_heads"], s["n_kv_heads"], s["head_dim"], s["max_blocks"]
    if nkv < 1 or nh % nkv or d < 2 or d % 2:
        raise ValueError(f"attention with n_heads={nh}, n_kv_heads={nkv}, head_dim={d}: the heads must be a "
                         "multiple of the kv heads and head_dim even")
    t = s["L"] if prefill else s["B"]
    if prefill and t > mb * KV_BLOCK_SIZE:
        raise ValueError(f"attention_prefill of L={t} tokens does not fit max_blocks={mb} blocks of {KV_BLOCK_SIZE}")
    cache = Extent(F16, kv_blocks * nkv * KV_BLOCK_SIZE * d, True)
    out = {"out": Extent(F16, t * nh * d, True), "qkv": Extent(F16, t * (nh + 2 * nkv) * d),
           "rope_table": Extent(F32, s["table_len"] * d), "inv_freq": Extent(F32, d // 2),
           "k_cache": cache, "v_cache": cache, "block_table": Extent(I32, max(batch, 1 if prefill else t) * mb)}
    if prefill:
        return {**out, "slot": Extent(I32, 1), "n_real": Extent(I32, 1)}
    return {**out, "positions": Extent(I32, t), "active": Extent(I32, t)}


def _take_last(s, a, batch, kv_blocks, rows):
    return {"out": Extent(F16, s["hidden"], True), "x": Extent(F16, rows * s["hidden"]), "n_real": Extent(I32, 1)}


def _sample(s, a, batch, kv_blocks, rows):
    m, v = s["M"], s["V"]
    b = max(batch, m)   # prefill: the row of slot[0] < batch; decode: rows 0..M-1
    per_slot = {name: Extent(I32, b, name in ("tokens", "positions", "active", "out_count"))
                for name in ("top_k", "seed", "tokens", "positions", "active", "out_count", "max_new")}
    return {"logits": Extent(F32, m * v), "slot": Extent(I32, 1), "n_real": Extent(I32, 1),
            "temperature": Extent(F32, b), "top_p": Extent(F32, b), **per_slot,
            "out_tokens": Extent(I32, b * s["max_out"], True), "eos_ids": Extent(I32, s["n_eos"])}


def _fill_synthetic(s, a, batch, kv_blocks, rows):
    if s["fill"] not in range(4):
        raise ValueError(f"fill_synthetic has fill={s['fill']}; known: 0..3")
    return {"out": Extent(U8 if s["fill"] == 0 else F16, s["n"], True)}


def _moe_route(s, a, batch, kv_blocks, rows):
    t, e, c = s["T"], s["n_experts"], s["n_shared"]
    slots, stacked = s["top_k"] + c, e + c
    return {"weights": Extent(F32, t * slots, True), "slot_rows": Extent(I32, t * slots, True),
            "row_token": Extent(I32, t * slots, True), "offsets": Extent(I32, stacked + 1, True),
            "active": Extent(I32, stacked + 1, True), "logits": Extent(F32, t * (e + (s["shared_gate"] != 0))),
            "n_real": Extent(I32, 1)}


def _moe_gather(s, a, batch, kv_blocks, rows):
    t, r, h = s["T"], s["R"], s["hidden"]
    return {"out": Extent(F16, r * h, True), "x": Extent(F16, t * h), "norm": Extent(F16, h),
            "row_token": Extent(I32, r), "offsets": Extent(I32, s["n_experts"] + 1)}


def _moe_linear(s, a, batch, kv_blocks, rows):
    r, n, k, ne = s["R"], s["N"], s["K"], s["n_experts"]
    nw = ne * (n if a["act"] == "none" else 2 * n)   # every expert's rows, one after the other
    g = _groups(k, s["group_size"])
    return {"out": Extent(_DTYPE[a["out_dtype"]], r * n, True), "x": Extent(F16, r * k),
            "weight": _codes(a["weight_format"], nw, k), "scales": Extent(F16, nw * g), "zeros": Extent(F16, nw * g),
            "offsets": Extent(I32, ne + 1), "active": Extent(I32, ne + 1)}


def _moe_combine(s, a, batch, kv_blocks, rows):
    t, h, slots = s["T"], s["hidden"], s["S"]   # slot_rows name rows below t * slots
    return {"out": Extent(F16, t * h, True), "y": Extent(F32, t * slots * h), "weights": Extent(F32, t * slots),
            "slot_rows": Extent(I32, t * slots), "residual": Extent(F16, t * h)}


_OPS = {
    "embedding": _embedding,
    "linear": _linear,
    "rms_norm": _rms_norm,
    "qk_norm": _qk_norm,
    "mlp_decode": _mlp_decode,
    "pack_mlp_tiles": _pack_mlp_tiles,
    "sparse_residual": _sparse_residual,
    "attention_prefill": lambda *x: _attention(*x, prefill=True),
    "attention_decode": lambda *x: _attention(*x, prefill=False),
    "take_last": _take_last,
    "sample": _sample,
    "fill_synthetic": _fill_synthetic,
    "moe_route": _moe_route,
    "moe_gather": _moe_gather,
    "moe_linear": _moe_linear,
    "moe_combine": _moe_combine,
}
