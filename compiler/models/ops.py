"""The composite ops grokc's torch models are written in, registered with ``torch.library``.

``torch.export`` keeps each of them as one node (they are opaque to it), so the traced graph
reads at the level the compiler lowers: an embedding, an RMSNorm (of a row, or of each head), a
rotary embedding, a causal attention. The eager implementations are the reference semantics, in
the working dtype of their inputs.
"""

from __future__ import annotations

import torch
from torch.library import custom_op


@custom_op("grokc::embedding", mutates_args=())
def embedding(tokens: torch.Tensor, table: torch.Tensor, scale: float) -> torch.Tensor:
    """``table[tokens] * scale``, the product in fp32, in the table's dtype."""
    return (table[tokens.long()].float() * scale).to(table.dtype)


@embedding.register_fake
def _(tokens, table, scale):
    return table.new_empty((tokens.shape[0], table.shape[1]))


@custom_op("grokc::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x**2) + eps) * weight`` over the last dim, computed in fp32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * y).to(x.dtype)


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@custom_op("grokc::head_rms_norm", mutates_args=())
def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm`` of each head of ``x [T, heads * D]`` on its own, ``weight [D]`` shared by the heads."""
    t, d = x.shape[0], weight.shape[0]
    return rms_norm(x.reshape(t, -1, d), weight, eps).reshape(x.shape)


@head_rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@custom_op("grokc::rope", mutates_args=())
def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, head_dim: int,
         mscale: float, short_inv_freq: torch.Tensor | None = None, short_until: int = 0) -> torch.Tensor:
    """Rotary embedding (rotate-half convention) of ``x [T, heads*head_dim]`` at ``positions [T]``;
    positions below ``short_until`` rotate by ``short_inv_freq`` when it is given (longrope)."""
    t = x.shape[0]
    pos = positions.to(torch.float64)[:, None]
    angles = pos * inv_freq.to(torch.float64)[None, :]  # [T, D/2]
    if short_inv_freq is not None:
        angles = torch.where(pos < short_until, pos * short_inv_freq.to(torch.float64)[None, :], angles)
    cos = (torch.cos(angles) * mscale).to(torch.float32)[:, None, :]
    sin = (torch.sin(angles) * mscale).to(torch.float32)[:, None, :]
    xh = x.float().reshape(t, -1, head_dim)  # [T, heads, D]
    x1, x2 = xh[..., : head_dim // 2], xh[..., head_dim // 2:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.reshape(x.shape).to(x.dtype)


@rope.register_fake
def _(x, positions, inv_freq, head_dim, mscale, short_inv_freq=None, short_until=0):
    return torch.empty_like(x)


@custom_op("grokc::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_heads: int, n_kv_heads: int,
              head_dim: int, scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """Causal grouped-query attention over the ``T`` given tokens: ``q [T, NH*D]``,
    ``k, v [T, NKV*D]`` -> ``[T, NH*D]``; with ``window`` > 0, query ``i`` sees keys ``j`` with
    ``i - window < j <= i`` only; with ``softcap`` > 0 the scaled scores ``s`` become
    ``softcap * tanh(s / softcap)`` before the softmax (Grok-1)."""
    t = q.shape[0]
    qh = q.reshape(t, n_heads, head_dim).transpose(0, 1)  # [NH, T, D]
    kh = k.reshape(t, n_kv_heads, head_dim).transpose(0, 1).repeat_interleave(n_heads // n_kv_heads, 0)
    vh = v.reshape(t, n_kv_heads, head_dim).transpose(0, 1).repeat_interleave(n_heads // n_kv_heads, 0)
    i = torch.arange(t, device=q.device)
    visible = (i[None, :] <= i[:, None]) & ((i[None, :] > i[:, None] - window) if window > 0 else True)  # [T, T]
    if softcap > 0:
        s = softcap * torch.tanh((qh.float() @ kh.float().transpose(1, 2)) * scale / softcap)   # [NH, T, T]
        p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)
        return (p @ vh.float()).to(q.dtype).transpose(0, 1).reshape(t, n_heads * head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=visible, scale=scale)
    return out.transpose(0, 1).reshape(t, n_heads * head_dim)


@attention.register_fake
def _(q, k, v, n_heads, n_kv_heads, head_dim, scale, window=0, softcap=0.0):
    return torch.empty_like(q)
