"""A user's own Llama-like module in plain torch, written differently from transformers' (RMSNorm
with ``rsqrt``, rotate-half through ``chunk``, rotary angles computed in ``forward`` from the
sequence length, GQA by ``repeat_interleave``, ``scaled_dot_product_attention(is_causal=True)``,
``F.silu``), with ``from_hf`` copying a transformers Llama's weights into it: the same function, so
transformers is its reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, h: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(h)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat((-b, a), -1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, self.heads, self.kv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
        self.d = h // self.heads
        self.n1, self.n2 = RMSNorm(h, c.rms_norm_eps), RMSNorm(h, c.rms_norm_eps)
        self.q, self.k = nn.Linear(h, self.heads * self.d, bias=False), nn.Linear(h, self.kv * self.d, bias=False)
        self.v, self.o = nn.Linear(h, self.kv * self.d, bias=False), nn.Linear(self.heads * self.d, h, bias=False)
        self.gate, self.up = (nn.Linear(h, c.intermediate_size, bias=False) for _ in range(2))
        self.down = nn.Linear(c.intermediate_size, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        y = self.n1(x)
        q, k, v = (p(y).view(b, t, -1, self.d).transpose(1, 2) for p in (self.q, self.k, self.v))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(self.heads // self.kv, 1), v.repeat_interleave(self.heads // self.kv, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(a)
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class OwnLlama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        d = c.hidden_size // c.num_attention_heads
        theta = c.rope_parameters["rope_theta"]
        self.register_buffer("inv_freq", theta ** (-torch.arange(0, d, 2).float() / d), persistent=False)

    def forward(self, input_ids):
        f = torch.arange(input_ids.shape[1], dtype=torch.float32)[:, None] * self.inv_freq[None]
        angles = torch.cat((f, f), -1)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, angles.cos(), angles.sin())
        return self.head(self.norm(x))


def from_hf(hf) -> OwnLlama:
    """An ``OwnLlama`` holding the weights of the transformers ``LlamaForCausalLM`` ``hf``."""
    own, sd = OwnLlama(hf.config).eval(), hf.state_dict()
    names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "head.weight": "lm_head.weight"}
    parts = {"n1": "input_layernorm", "n2": "post_attention_layernorm", "q": "self_attn.q_proj", "k": "self_attn.k_proj",
             "v": "self_attn.v_proj", "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
             "down": "mlp.down_proj"}
    for i in range(len(own.blocks)):
        names.update({f"blocks.{i}.{a}.weight": f"model.layers.{i}.{b}.weight" for a, b in parts.items()})
    own.load_state_dict({a: sd[b] for a, b in names.items()}, strict=True)
    return own
