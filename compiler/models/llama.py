"""The Llama family (Llama 2/3.x, SmolLM, Mistral without a sliding window): its architecture
record and grokc's torch model of it, the rung of the correctness ladder between Hugging Face and
the plan.

The model is written in the composite ops of ``ops.py`` plus ``linear``/``embedding``/``silu``/
``add``/``mul`` so that ``torch.export`` yields a graph the compiler reads op for op. Parameter
names are the canonical ones of ``core/tensors.py`` (llama.cpp's: ``blk.3.attn_q.weight``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from grokc.compiler.models import moe, ops  # noqa: F401  (registers torch.ops.grokc.*)
from grokc.compiler.models.architecture import Architecture, TensorSpec
from grokc.core import rope as rope_math
from grokc.core.config import ModelConfig
from grokc.core.errors import UnsupportedModel
from grokc.core.tensors import Tensor


def model_buffers(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Constants the model derives from its config (not in the checkpoint)."""
    return {"rope_inv_freq": rope_math.inv_freq(cfg.rope, cfg.head_dim)[0].astype(np.float32)}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.grokc.rms_norm(x, self.weight, self.eps)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.attn_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.attn_q = nn.Linear(h, cfg.q_dim, bias=False)
        self.attn_k = nn.Linear(h, cfg.kv_dim, bias=False)
        self.attn_v = nn.Linear(h, cfg.kv_dim, bias=False)
        self.attn_output = nn.Linear(cfg.q_dim, h, bias=False)
        self.ffn_norm = RMSNorm(h, cfg.rms_norm_eps)
        if cfg.moe is not None:
            moe.add_params(self, cfg)
            return
        self.ffn_gate = nn.Linear(h, i, bias=False)
        self.ffn_up = nn.Linear(h, i, bias=False)
        self.ffn_down = nn.Linear(i, h, bias=False)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, mscale: float):
        cfg = self.cfg
        x = self.attn_norm(h)                                                          # [T, H]
        q = torch.ops.grokc.rope(self.attn_q(x), positions, inv_freq, cfg.head_dim, mscale)  # [T, NH*D]
        k = torch.ops.grokc.rope(self.attn_k(x), positions, inv_freq, cfg.head_dim, mscale)  # [T, NKV*D]
        v = self.attn_v(x)                                                             # [T, NKV*D]
        a = torch.ops.grokc.attention(q, k, v, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                      cfg.head_dim ** -0.5)
        h = h + self.attn_output(a)
        x = self.ffn_norm(h)
        if cfg.moe is not None:
            return h + moe.ffn(self, x, cfg)
        return h + self.ffn_down(F.silu(self.ffn_gate(x)) * self.ffn_up(x))


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embd = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blk = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.output_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.mscale = rope_math.inv_freq(cfg.rope, cfg.head_dim)[1]
        for name, value in model_buffers(cfg).items():
            self.register_buffer(name, torch.from_numpy(value.copy()), persistent=False)

    @staticmethod
    def constants(cfg: ModelConfig) -> dict[str, np.ndarray]:
        """The constants the model derives from its config, by name (the tracer attaches them)."""
        return model_buffers(cfg)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``tokens``, ``positions`` [T] -> logits [T, vocab] for one sequence."""
        h = self.token_embd(tokens)                                                    # [T, H]
        for block in self.blk:
            h = block(h, positions, self.rope_inv_freq, self.mscale)
        h = self.output_norm(h)
        head = self.token_embd.weight if self.output is None else self.output.weight
        return F.linear(h, head)                                                       # [T, V]


def hf_config(raw: dict, where: str) -> dict:
    """The Llama graph has no biases, SwiGLU MLPs only, and attends over the whole context."""
    for flag in ("attention_bias", "mlp_bias"):
        if raw.get(flag):
            raise UnsupportedModel(f"{where} sets {flag}=true; the Llama graph has no biases, so only bias-free "
                                   "Llama models are supported")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModel(f"{where} sets hidden_act {act!r}; only SiLU (SwiGLU) Llama MLPs are supported")
    window, max_pos = raw.get("sliding_window"), int(raw.get("max_position_embeddings", 2048))
    if raw.get("model_type") in ("mistral", "mixtral") and window is not None and window < max_pos:
        raise UnsupportedModel(f"{where} sets sliding_window {window} below max_position_embeddings {max_pos}; "
                               "sliding-window attention is not supported")
    return {}


def _linear(rows: Callable[[ModelConfig], int], cols: Callable[[ModelConfig], int]) -> Callable:
    return lambda c: (rows(c), cols(c))


_H = lambda c: c.hidden_size  # noqa: E731
_dense = lambda c: c.moe is None  # noqa: E731

ARCH = Architecture(
    name="llama",
    hf_model_types=("llama", "mistral"),
    hf_classes=("LlamaForCausalLM", "MistralForCausalLM"),
    gguf_arch="llama",
    tensors=(
        TensorSpec(Tensor.TOKEN_EMBD, lambda c: (c.vocab_size, c.hidden_size)),
        TensorSpec(Tensor.ATTN_NORM, lambda c: (c.hidden_size,)),
        TensorSpec(Tensor.ATTN_Q, _linear(lambda c: c.q_dim, _H)),
        TensorSpec(Tensor.ATTN_K, _linear(lambda c: c.kv_dim, _H)),
        TensorSpec(Tensor.ATTN_V, _linear(lambda c: c.kv_dim, _H)),
        TensorSpec(Tensor.ATTN_OUTPUT, _linear(_H, lambda c: c.q_dim)),
        TensorSpec(Tensor.FFN_NORM, lambda c: (c.hidden_size,)),
        TensorSpec(Tensor.FFN_GATE, _linear(lambda c: c.intermediate_size, _H), present=_dense),
        TensorSpec(Tensor.FFN_UP, _linear(lambda c: c.intermediate_size, _H), present=_dense),
        TensorSpec(Tensor.FFN_DOWN, _linear(_H, lambda c: c.intermediate_size), present=_dense),
        *moe.TENSORS,
        TensorSpec(Tensor.OUTPUT_NORM, lambda c: (c.hidden_size,)),
        TensorSpec(Tensor.OUTPUT, lambda c: (c.vocab_size, c.hidden_size), present=lambda c: not c.tie_word_embeddings),
    ),
    model=Llama,
    hf_config=hf_config,
    gguf_permutes_qk=True,
)
