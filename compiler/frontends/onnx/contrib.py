"""Rules for onnxruntime's contrib ops, the ones onnxruntime-genai's model builder writes.

- ``MatMulNBits(x, B, scales[, zero_points][, g_idx absent, bias])`` -> ``LINEAR`` (with the bias):
  the blocks dequantized exactly as onnxruntime does (``dequantize_blocks``); 4-bit blocks of a size
  grokc's int4 kernels take (``quant.carried.carriable``) also keep their grid, so the quantize pass
  stores the same codes; others (8 bits, blocks of 16) are re-quantized by the recipe, with a note;
- ``GatherBlockQuantized(data, tokens, scales[, zero_points])`` -> ``EMBEDDING`` of the dequantized table;
- ``SkipSimplifiedLayerNormalization(x, skip, w)`` -> ``ADD`` then ``RMS_NORM`` (output 0: the norm,
  output 3: the sum, the next residual);
- ``GroupQueryAttention`` with rotary folded in -> the packed q/k/v projection (and its bias) split
  into three ``LINEAR``s, a ``ROPE`` on q and on k, ``ATTENTION``: rotate-half
  (``rotary_interleaved=0``), no window or softcap, lengths from the mask (``checks.check_lengths``),
  cos/sin caches that rotate position ``p`` by ``p * inv_freq`` (``checks.rope_freqs``).
"""

from __future__ import annotations

import numpy as np

from grokc.compiler.frontends.graph.checks import check_lengths, rope_freqs
from grokc.compiler.frontends.graph.convert import Conversion, Rule
from grokc.compiler.frontends.graph.kinds import HEADS, TOKENS, Act, Past, Tokens
from grokc.compiler.frontends.graph.pattern import Anything, Const, Match, Op, Side, Var
from grokc.compiler.frontends.graph.rules_attention import emit_attention
from grokc.compiler.frontends.graph.rules_linear import bias_fits, emit_embedding, emit_linear
from grokc.compiler.frontends.graph.rules_norm import emit_norm
from grokc.compiler.frontends.graph.rules_rope import emit_rope
from grokc.core.ir import OpKind
from grokc.core.meta import CarriedInt4
from grokc.quant import carried

X = Var("x", Act)


def unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """u8 ``[..., n]`` -> ``[..., n * 8 / bits]`` codes, element ``j`` of a byte at bit ``bits * j``."""
    per, mask = 8 // bits, (1 << bits) - 1
    p = np.asarray(packed, np.uint8)
    return np.stack([(p >> (bits * j)) & mask for j in range(per)], -1).reshape(*p.shape[:-1], -1)


def dequantize_blocks(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, k: int, n: int, bits: int,
                      block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """MatMulNBits' weight as onnxruntime computes it: ``(W f32 [N, K], scales f32 [N, nb], zeros f32
    [N, nb] | None)`` with ``W[n, k] = (code - zero) * scale`` per block of ``block_size`` along K
    (zero 2^(bits-1) when there are no zero points; a last block's padding dropped)."""
    nb = -(-k // block_size)
    q = unpack_bits(np.asarray(b).reshape(n, nb, block_size * bits // 8), bits).astype(np.float32)
    s = np.asarray(scales, np.float32).reshape(n, nb)
    if zero_points is None:
        zeros = None
    elif zero_points.dtype == np.uint8:       # packed like B, each row padded to whole bytes
        zeros = unpack_bits(np.asarray(zero_points).reshape(n, -1), bits)[:, :nb].astype(np.float32)
    else:                                     # unpacked, in the dtype of A
        zeros = np.asarray(zero_points, np.float32).reshape(n, nb)
    z = np.float32(1 << (bits - 1)) if zeros is None else zeros[..., None]
    w = ((q - z) * s[..., None]).reshape(n, nb * block_size)[:, :k]
    return np.ascontiguousarray(w), s, zeros


def _nbits_check(m: Match, cv: Conversion) -> bool:
    root, x = m.nodes["root"], cv.act(m.values["x"])
    if len(root.inputs) > 4 and root.inputs[4]:
        raise cv.refuse(root, "has a g_idx input (act-order); grokc reads MatMulNBits blocks in order")
    bias = _nbits_bias(root)
    if bias is not None and not bias_fits(cv, bias, root.attrs.get("N", 0)):
        raise cv.refuse(root, "has a bias input that is not a constant vector of its N outputs")
    return x.view == TOKENS and root.attrs.get("K") == x.channels


def _nbits_bias(root) -> str | None:
    return root.inputs[5] if len(root.inputs) > 5 and root.inputs[5] else None


def _nbits(m: Match, cv: Conversion) -> None:
    root, a = m.nodes["root"], m.nodes["root"].attrs
    k, n, bits, bs = a["K"], a["N"], a.get("bits", 4), a["block_size"]
    zp = cv.graph.const(root.inputs[3]) if len(root.inputs) > 3 and root.inputs[3] else None
    w, scales, zeros = dequantize_blocks(cv.graph.const(m.values["b"]), cv.graph.const(m.values["scales"]), zp, k, n,
                                         bits, bs)
    grid = None
    if bits == 4 and carried.carriable(bs, k):
        grid = CarriedInt4(scales, zeros, carried.group_size(bs, k), "MatMulNBits")
    else:
        cv.notes.append(f"{root.describe()}: {bits}-bit blocks of {bs} are re-quantized by the recipe (grokc keeps "
                        f"4-bit blocks of a multiple of {carried.FAST_BLOCK}, or covering K)")
    cv.kinds[root.outputs[0]] = emit_linear(cv, m.values["x"], w, m.values["b"], root, grid, _nbits_bias(root))


def _gbq_check(m: Match, cv: Conversion) -> bool:
    a, data = m.nodes["root"].attrs, cv.graph.const(m.values["data"])
    ok = a.get("bits", 4) == 4 and a.get("gather_axis", 0) == 0 and a.get("quantize_axis", 1) in (1, -1)
    if not ok or data.dtype != np.uint8 or data.ndim != 2:
        raise cv.refuse(m.nodes["root"], "is a GatherBlockQuantized other than 4-bit u8 codes [vocab, hidden / 2] "
                                         "gathered by row, quantized along the row")
    return True


def _gbq(m: Match, cv: Conversion) -> None:
    root = m.nodes["root"]
    data = cv.graph.const(m.values["data"])
    v, h = data.shape[0], data.shape[1] * 2
    bs = root.attrs.get("block_size", 128)
    zp = cv.graph.const(root.inputs[3]) if len(root.inputs) > 3 and root.inputs[3] else None
    table, _, _ = dequantize_blocks(data, cv.graph.const(m.values["scales"]), zp, h, v, 4, bs)
    emit_embedding(cv, table, m.values["data"], m.values["ids"], root)


def _skip_check(m: Match, cv: Conversion) -> bool:
    root, x, skip = m.nodes["root"], cv.act(m.values["x"]), cv.act(m.values["skip"])
    if len(root.inputs) > 3 and root.inputs[3]:
        raise cv.refuse(root, "adds a bias inside the norm; grokc's decoders have RMSNorms without one")
    return x.view == skip.view == TOKENS and x.channels == skip.channels and \
        cv.graph.const(m.values["w"]).shape == (x.channels,)


def _skip(m: Match, cv: Conversion) -> None:
    root, x, skip = m.nodes["root"], cv.act(m.values["x"]), cv.act(m.values["skip"])
    total = x.but(tensor=cv.ir.add(OpKind.ADD, {"a": x.tensor, "b": skip.tensor}, x.channels, root, suffix="/add"))
    cv.kinds[root.outputs[0]] = emit_norm(cv, total, m.values["w"], float(root.attrs.get("epsilon", 1e-5)), root)
    if len(root.outputs) > 3 and root.outputs[3]:
        cv.kinds[root.outputs[3]] = total


GQA = Op("GroupQueryAttention", X, Anything("k"), Anything("v"), Anything("past_k"), Anything("past_v"),
         Side("seqlens"), Side("total"), Const("cos"), Const("sin"), name="root")


def _gqa_check(m: Match, cv: Conversion) -> bool:
    root, a = m.nodes["root"], m.nodes["root"].attrs
    if not a.get("do_rotary", 0) or a.get("rotary_interleaved", 0):
        raise cv.refuse(root, "does not apply the rotate-half rotary embedding itself (do_rotary=1, "
                              "rotary_interleaved=0); grokc reads GroupQueryAttention with rotary folded in")
    if a.get("local_window_size", -1) != -1 or a.get("softcap", 0) or a.get("smooth_softmax", 0) or \
            a.get("qk_output", 0):
        raise cv.refuse(root, "uses a local window, softcap, smooth softmax or scores output; grokc compiles plain "
                              "causal attention")
    packed = not m.values["k"] and not m.values["v"]
    past = [m.values["past_k"], m.values["past_v"]]
    if not packed and not all(isinstance(cv.kind(m.values[r]), Act) for r in "kv"):
        return False
    if any(p and not isinstance(cv.kind(p), Past) for p in past) or any(i for i in root.inputs[9:]):
        raise cv.refuse(root, "takes position ids, an attention bias or head sinks; grokc reads GroupQueryAttention "
                              "of a Llama-family decoder")
    check_lengths(cv, root, m.values["seqlens"], m.values["total"])
    return True


def _gqa(m: Match, cv: Conversion) -> None:
    root, a = m.nodes["root"], m.nodes["root"].attrs
    nh, nkv = a["num_heads"], a["kv_num_heads"]
    q = cv.act(m.values["x"])
    if not m.values["k"]:
        d = q.channels // (nh + 2 * nkv)
        tensors = cv.ir.split_linear(q.tensor, [nh * d, nkv * d, nkv * d], root)
    else:
        d = q.channels // nh
        tensors = [q.tensor, cv.act(m.values["k"]).tensor, cv.act(m.values["v"]).tensor]
    freqs = rope_freqs(cv, root, cv.graph.const(m.values["cos"]), cv.graph.const(m.values["sin"]), d, duplicated=False)
    present_k, present_v = (o or None for o in (*root.outputs[1:3], "", "")[:2])
    qh = Act(tensors[0], HEADS, nh * d, nh, d)
    kh = Act(tensors[1], HEADS, nkv * d, nkv, d, present=present_k)
    vh = Act(tensors[2], HEADS, nkv * d, nkv, d, present=present_v)
    qr, kr = emit_rope(cv, qh, freqs, root, "/q_rope"), emit_rope(cv, kh, freqs, root, "/k_rope")
    out = emit_attention(cv, root, qr, kr, vh, a.get("scale") or d ** -0.5, None, causal=True, suffix="/attention")
    cv.kinds[root.outputs[0]] = out.but(view=TOKENS, heads=0, head_dim=0)


RULES = [
    Rule("MatMulNBits", Op("MatMulNBits", X, Const("b"), Const("scales"), name="root"), _nbits_check, _nbits),
    Rule("GatherBlockQuantized", Op("GatherBlockQuantized", Const("data"), Var("ids", Tokens), Const("scales"),
                                    name="root"), _gbq_check, _gbq),
    Rule("SkipSimplifiedLayerNormalization", Op("SkipSimplifiedLayerNormalization", X, Var("skip", Act), Const("w"),
                                                name="root"), _skip_check, _skip),
    Rule("GroupQueryAttention", GQA, _gqa_check, _gqa),
]
