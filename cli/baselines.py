"""The PyTorch baselines ``grokc bench`` measures beside the artifact: same shapes, fp16, same GPU.

A gpt-fast-style decoder (static KV cache ``[B, NKV, max_seq, D]`` per layer, one token per slot
per step, attention over the cache with a position mask, fused qkv and gate/up weights) run
three ways: eager, eager captured in a CUDA graph, and ``torch.compile`` (mode
``reduce-overhead``, which replays CUDA graphs), and a prompt's prefill eager and compiled; a
mixture of experts as gpt-fast's mixtral-moe decodes it (the chosen experts' weights gathered per row). Weights are random: speed does not depend on
their values, only on their shapes and dtype, which match the artifact's model in fp16.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
from torch.nn import functional as F

from grokc.core.config import ModelConfig
from grokc.core.rope import table as rope_table


class TorchDecoder(torch.nn.Module):
    def __init__(self, cfg: ModelConfig, batch: int, max_seq: int, device: str = "cuda"):
        super().__init__()
        self.cfg, self.batch, self.max_seq = cfg, batch, max_seq
        f16 = dict(dtype=torch.float16, device=device)
        h, i, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_dim, cfg.kv_dim

        def w(*shape):
            return torch.randn(*shape, **f16) * shape[-1] ** -0.5

        self.embed = w(cfg.vocab_size, h)
        self.head = self.embed if cfg.tie_word_embeddings else w(cfg.vocab_size, h)
        moe = cfg.moe
        ffn = (lambda: dict(w13=w(2 * i, h), w2=w(h, i))) if moe is None else (lambda: dict(
            router=w(moe.n_experts, h), w13=w(moe.n_experts, 2 * moe.expert_size, h),
            w2=w(moe.n_experts, h, moe.expert_size)))
        self.layers = [dict(attn_norm=torch.ones(h, **f16), wqkv=w(q + 2 * kv, h), wo=w(h, q),
                            ffn_norm=torch.ones(h, **f16), **ffn()) for _ in range(cfg.num_layers)]
        self.final_norm = torch.ones(h, **f16)
        cache = (batch, cfg.num_kv_heads, max_seq, cfg.head_dim)
        self.k_cache = [torch.zeros(cache, **f16) for _ in range(cfg.num_layers)]
        self.v_cache = [torch.zeros(cache, **f16) for _ in range(cfg.num_layers)]
        cs = torch.from_numpy(rope_table(cfg.rope, cfg.head_dim, max_seq)).to(device)  # [S, D/2, 2]
        self.cos, self.sin = cs[..., 0], cs[..., 1]

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)).half() * w

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]              # [B, 1, D/2]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).half()

    @staticmethod
    def _mlp(x: torch.Tensor, layer: dict) -> torch.Tensor:
        gate, up = (x @ layer["w13"].T).chunk(2, -1)
        return (F.silu(gate) * up) @ layer["w2"].T

    def _experts(self, x: torch.Tensor, layer: dict) -> torch.Tensor:
        """gpt-fast's mixtral-moe decode: each row's top-k experts' weights gathered, then batched products
        (the shared expert of Qwen2-MoE left out)."""
        moe = self.cfg.moe
        probs = torch.softmax((x @ layer["router"].T).float(), -1)
        weights, ids = torch.topk(probs, moe.top_k, -1)                           # [B, k]
        if moe.norm_top_k:
            weights = weights / weights.sum(-1, keepdim=True)
        gate, up = torch.einsum("bh,bkih->bki", x, layer["w13"][ids]).chunk(2, -1)  # [B, k, I] each
        y = torch.einsum("bki,bkhi->bkh", F.silu(gate) * up, layer["w2"][ids])      # [B, k, H]
        return torch.einsum("bkh,bk->bh", y, weights.half())

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One decode step: ``tokens``, ``pos`` [B] -> logits [B, vocab] (f32)."""
        c = self.cfg
        b, nh, nkv, d = tokens.shape[0], c.num_heads, c.num_kv_heads, c.head_dim
        x = self.embed[tokens]                                                    # [B, H]
        mask = torch.arange(self.max_seq, device=tokens.device)[None] <= pos[:, None]  # [B, S]
        rows = torch.arange(b, device=tokens.device)
        for layer, (kc, vc) in zip(self.layers, zip(self.k_cache, self.v_cache)):
            qkv = self._norm(x, layer["attn_norm"]) @ layer["wqkv"].T           # [B, (NH+2NKV)*D]
            q, k, v = qkv.split([nh * d, nkv * d, nkv * d], -1)
            q = self._rope(q.view(b, nh, d), pos)
            k = self._rope(k.view(b, nkv, d), pos)
            kc[rows, :, pos] = k
            vc[rows, :, pos] = v.view(b, nkv, d)
            o = F.scaled_dot_product_attention(q[:, :, None], kc, vc, attn_mask=mask[:, None, None],
                                               enable_gqa=True)                  # [B, NH, 1, D]
            x = x + o.reshape(b, nh * d) @ layer["wo"].T
            xn = self._norm(x, layer["ffn_norm"])
            x = x + (self._mlp(xn, layer) if c.moe is None else self._experts(xn, layer))
        return (self._norm(x, self.final_norm) @ self.head.T).float()

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """One prompt into slot 0: ``tokens`` [L] -> its last token's logits [1, vocab] (f32), cache
        rows 0..L-1 written, attention causal over the prompt (dense FFNs only)."""
        c = self.cfg
        n, nh, nkv, d = tokens.shape[0], c.num_heads, c.num_kv_heads, c.head_dim
        pos = torch.arange(n, device=tokens.device)
        x = self.embed[tokens]                                                    # [L, H]
        for layer, kc, vc in zip(self.layers, self.k_cache, self.v_cache):
            qkv = self._norm(x, layer["attn_norm"]) @ layer["wqkv"].T
            q, k, v = qkv.split([nh * d, nkv * d, nkv * d], -1)
            q = self._rope(q.view(n, nh, d), pos).transpose(0, 1)                # [NH, L, D]
            k = self._rope(k.view(n, nkv, d), pos).transpose(0, 1)
            v = v.view(n, nkv, d).transpose(0, 1)
            kc[0, :, :n], vc[0, :, :n] = k, v
            o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)
            x = x + o[0].transpose(0, 1).reshape(n, nh * d) @ layer["wo"].T
            x = x + self._mlp(self._norm(x, layer["ffn_norm"]), layer)
        return (self._norm(x[-1:], self.final_norm) @ self.head.T).float()


def time_steps(step: Callable[[], object], steps: int, warmup: int = 3) -> float:
    """Milliseconds per call of ``step`` (GPU-synchronized wall clock over ``steps`` calls)."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / steps


def decode_baselines(cfg: ModelConfig, batch: int, max_seq: int, context: int, steps: int) -> dict:
    """ms per decode step of the three PyTorch variants at ``batch`` slots, ``context`` cached tokens."""
    out = _time_decoders(cfg, batch, max_seq, context, steps)
    torch.cuda.empty_cache()   # the models and graphs died with _time_decoders' frame
    return out


def _time_decoders(cfg: ModelConfig, batch: int, max_seq: int, context: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = TorchDecoder(cfg, batch, max_seq)
    tokens = torch.randint(0, cfg.vocab_size, (batch,), device="cuda")
    pos = torch.full((batch,), context, device="cuda", dtype=torch.long)
    out = {}
    with torch.no_grad():
        out["eager_fp16"] = time_steps(lambda: model(tokens, pos), steps)
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model(tokens, pos)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(graph):
            model(tokens, pos)
        out["eager_cudagraph_fp16"] = time_steps(graph.replay, steps)
        compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):
            compiled(tokens, pos)
        out["compile_cudagraph_fp16"] = time_steps(lambda: compiled(tokens, pos), steps)
    return out


def prefill_baselines(cfg: ModelConfig, max_seq: int, length: int, steps: int) -> dict:
    """ms to prefill one ``length``-token prompt (its first token's logits), eager and ``torch.compile``
    (default mode: a prompt is one call, so there are no launches for CUDA graphs to save)."""
    out = _time_prefill(cfg, max_seq, length, steps)
    torch.cuda.empty_cache()   # the model died with _time_prefill's frame
    return out


def _time_prefill(cfg: ModelConfig, max_seq: int, length: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = TorchDecoder(cfg, 1, max_seq)
    tokens = torch.randint(0, cfg.vocab_size, (length,), device="cuda")
    out = {}
    with torch.no_grad():
        out["eager_fp16"] = time_steps(lambda: model.prefill(tokens), steps)
        compiled = torch.compile(model.prefill, fullgraph=True)
        out["compile_fp16"] = time_steps(lambda: compiled(tokens), steps)
    return out


def copy_bandwidth_gbps(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth, counting bytes read plus written (the HBM roofline)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_steps(lambda: dst.copy_(src), 20)
    return 2 * (nbytes // 2) / (ms * 1e-3) / 1e9
