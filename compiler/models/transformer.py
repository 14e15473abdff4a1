"""grokc's torch model of every family: one Llama-skeleton block builder whose variants come from
the config (llama.cpp's ``build_norm`` / ``build_attn`` / ``build_ffn`` idea), the rung of the
correctness ladder between Hugging Face and the plan.

A block is ``h += post_norm(attention(norm(h)))`` then ``h += post_norm(mlp(norm(h)))``, where the
variants are ``ModelConfig``'s: q/k/v biases (``qkv_bias``), per-head RMSNorm of q and k before
RoPE (``qk_norm``), the post norms (``post_norms``, else none), the gated MLP's activation
(``activation``) or a mixture of experts in its place (``moe``, ``moe.py``), the layer's window and RoPE (``window(layer)``, ``core/rope.py``'s
``rope_of_layer``), the softmax scale (``attn_scale``) and soft cap of the scores (``attn_softcap``,
Grok-1); the embedding is scaled by ``embedding_scale``, the logits by ``logit_scale`` (folded into the
final norm's weight by ``parameters``). Families differ only in these fields and in how their files name the tensors
(``architecture.py``).

``TENSORS`` lists the model's tensors with the config conditions under which each is present
(``Architecture.tensors`` defaults to it).

The model is written in the composite ops of ``ops.py`` plus ``linear``/``silu``/``gelu``/``add``/
``mul`` so that ``torch.export`` yields a graph the compiler reads op for op. Parameter names are
the canonical ones of ``core/tensors.py`` (llama.cpp's: ``blk.3.attn_q.weight``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from grokc.compiler.models import moe, ops  # noqa: F401  (registers torch.ops.grokc.*)
from grokc.core import rope as rope_math
from grokc.core.config import Activation, ModelConfig
from grokc.core.tensors import Tensor


@dataclass(frozen=True)
class TensorSpec:
    kind: Tensor
    shape: Callable[[ModelConfig], tuple[int, ...]]
    present: Callable[[ModelConfig], bool] = lambda cfg: True   # e.g. the LM head only when untied
    suffix: str = "weight"                                      # "bias" for biases


_SHORT = "_short"  # suffix of a longrope's short-factor frequencies (constants, read by the torch model only)


def constants(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Constants the model derives from its config (not in the checkpoint), by parameter name: the
    frequencies of each RoPE (``core/rope.py``), and a longrope's short-factor ones."""
    out = {}
    for name, rope in rope_math.ropes(cfg).items():
        out[name] = rope_math.inv_freq(rope, cfg.head_dim)[0].astype(np.float32)
        short = rope_math.short_inv_freq(rope, cfg.head_dim)
        if short is not None:
            out[name + _SHORT] = short[0].astype(np.float32)
    return out


OUTPUT_NORM = "output_norm.weight"


def parameters(cfg: ModelConfig, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's parameter values from canonically named ``weights``: the weights as they are, but
    for the LM head's multiplier (``logit_scale``, Grok-1's output multiplier), folded into the final
    norm's weight: ``head(rms(h) * (s * w)) = s * head(rms(h) * w)``, so no graph has a scaling op.
    ``compiler/trace.py`` and ``compiler/quality.reference_model`` attach these; ``unfold`` inverts it."""
    if cfg.logit_scale == 1.0 or OUTPUT_NORM not in weights:
        return dict(weights)
    return {**weights, OUTPUT_NORM: (np.asarray(weights[OUTPUT_NORM], np.float32) * np.float32(cfg.logit_scale))}


def unfold(cfg: ModelConfig, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical weights from stored parameters: ``parameters``' fold of ``logit_scale`` undone."""
    if cfg.logit_scale == 1.0 or OUTPUT_NORM not in params:
        return dict(params)
    return {**params, OUTPUT_NORM: np.asarray(params[OUTPUT_NORM], np.float32) / np.float32(cfg.logit_scale)}


class RMSNorm(nn.Module):
    """RMSNorm of each row (``head=False``) or of each ``dim``-wide head of a row (``head=True``)."""

    def __init__(self, dim: int, eps: float, head: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.head = eps, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = torch.ops.grokc.head_rms_norm if self.head else torch.ops.grokc.rms_norm
        return norm(x, self.weight, self.eps)


class Embedding(nn.Module):
    def __init__(self, vocab: int, dim: int, scale: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim))
        self.scale = scale

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.ops.grokc.embedding(tokens, self.weight, self.scale)


_ACT = {Activation.SILU: F.silu, Activation.GELU_TANH: lambda x: F.gelu(x, approximate="tanh")}


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.window = cfg, cfg.window(layer)
        h, i, eps = cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps
        self.attn_norm = RMSNorm(h, eps)
        self.attn_q = nn.Linear(h, cfg.q_dim, bias=cfg.qkv_bias)
        self.attn_k = nn.Linear(h, cfg.kv_dim, bias=cfg.qkv_bias)
        self.attn_v = nn.Linear(h, cfg.kv_dim, bias=cfg.qkv_bias)
        if cfg.qk_norm:
            self.attn_q_norm = RMSNorm(cfg.head_dim, eps, head=True)
            self.attn_k_norm = RMSNorm(cfg.head_dim, eps, head=True)
        self.attn_output = nn.Linear(cfg.q_dim, h, bias=False)
        self.ffn_norm = RMSNorm(h, eps)
        if cfg.moe is not None:
            moe.add_params(self, cfg)
        else:
            self.ffn_gate = nn.Linear(h, i, bias=False)
            self.ffn_up = nn.Linear(h, i, bias=False)
            self.ffn_down = nn.Linear(i, h, bias=False)
        if cfg.post_norms:
            self.post_attention_norm = RMSNorm(h, eps)
            self.post_ffw_norm = RMSNorm(h, eps)

    # The block in the stages calibration runs one at a time over all its windows (``compiler/calibrate.py``
    # quantizes the linears each stage's output feeds before the next stage); ``forward`` composes them.

    def attention_mix(self, x: torch.Tensor, positions: torch.Tensor, rope: tuple) -> torch.Tensor:
        """The attention's values mixed by head, ``[T, NH*D]`` (``attn_output``'s input), of the normed ``x [T, H]``."""
        cfg = self.cfg
        q, k, v = self.attn_q(x), self.attn_k(x), self.attn_v(x)                       # [T, NH*D], [T, NKV*D] x 2
        if cfg.qk_norm:
            q, k = self.attn_q_norm(q), self.attn_k_norm(k)
        q = torch.ops.grokc.rope(q, positions, rope[0], cfg.head_dim, *rope[1:])
        k = torch.ops.grokc.rope(k, positions, rope[0], cfg.head_dim, *rope[1:])
        return torch.ops.grokc.attention(q, k, v, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attn_scale,
                                         self.window, cfg.attn_softcap)                # [T, NH*D]

    def attention_out(self, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """``h [T, H]`` plus the attention's output projection of ``a`` (post-normed when the family has post norms)."""
        o = self.attn_output(a)
        return h + (self.post_attention_norm(o) if self.cfg.post_norms else o)

    def ffn_mix(self, x: torch.Tensor) -> torch.Tensor:
        """The gated MLP's hidden activations ``[T, I]`` (``ffn_down``'s input) of the normed ``x [T, H]``."""
        return _ACT[self.cfg.activation](self.ffn_gate(x)) * self.ffn_up(x)

    def ffn_out(self, h: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """``h [T, H]`` plus the MLP's output ``m`` (through ``ffn_down`` first when dense)."""
        if self.cfg.moe is None:
            m = self.ffn_down(m)
        return h + (self.post_ffw_norm(m) if self.cfg.post_norms else m)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, rope: tuple) -> torch.Tensor:
        """``h [T, H]`` at ``positions [T]``; ``rope``: the rope op's arguments after ``head_dim``."""
        h = self.attention_out(h, self.attention_mix(self.attn_norm(h), positions, rope))
        x = self.ffn_norm(h)
        return self.ffn_out(h, moe.ffn(self, x, self.cfg) if self.cfg.moe is not None else self.ffn_mix(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embd = Embedding(cfg.vocab_size, cfg.hidden_size, cfg.embedding_scale)
        self.blk = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.output_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        for name, value in constants(cfg).items():
            self.register_buffer(name, torch.from_numpy(value.copy()), persistent=False)
        self._rope_scalars = {}   # frequency parameter -> (mscale, short_until)
        for name, rope in rope_math.ropes(cfg).items():
            short = rope_math.short_inv_freq(rope, cfg.head_dim)
            self._rope_scalars[name] = (rope_math.inv_freq(rope, cfg.head_dim)[1], 0 if short is None else short[1])

    @staticmethod
    def constants(cfg: ModelConfig) -> dict[str, np.ndarray]:
        """The constants the model derives from its config, by name (the tracer attaches them)."""
        return constants(cfg)

    def rope_args(self, layer: int) -> tuple:
        """The rope op's arguments after ``head_dim`` for ``layer``: frequencies, mscale (, longrope's
        short-factor frequencies and the position they end at)."""
        name = rope_math.rope_of_layer(self.cfg, layer)
        mscale, short_until = self._rope_scalars[name]
        if not short_until:
            return getattr(self, name), mscale
        return getattr(self, name), mscale, getattr(self, name + _SHORT), short_until

    def forward_block(self, layer: int, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.blk[layer](h, positions, self.rope_args(layer))

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``tokens``, ``positions`` [T] -> logits [T, vocab] for one sequence."""
        h = self.token_embd(tokens)                                                    # [T, H]
        for layer in range(len(self.blk)):
            h = self.forward_block(layer, h, positions)
        h = self.output_norm(h)
        head = self.token_embd.weight if self.output is None else self.output.weight
        return F.linear(h, head)                                                       # [T, V]


def _linear(rows, cols):
    return lambda c: (rows(c), cols(c))


_H = lambda c: c.hidden_size  # noqa: E731
_Q = lambda c: c.q_dim  # noqa: E731
_KV = lambda c: c.kv_dim  # noqa: E731
_I = lambda c: c.intermediate_size  # noqa: E731


def _vector(size):
    return lambda c: (size(c),)


_dense = lambda c: c.moe is None  # noqa: E731
_routed = lambda c: c.moe is not None  # noqa: E731
_shared = lambda c: c.moe is not None and c.moe.shared_size > 0  # noqa: E731
_E = lambda c: c.moe.n_experts  # noqa: E731
_EI = lambda c: c.moe.expert_size  # noqa: E731
_S = lambda c: c.moe.shared_size  # noqa: E731


# Every tensor of the model above, in order; the config's variants say which are present.
TENSORS = (
    TensorSpec(Tensor.TOKEN_EMBD, lambda c: (c.vocab_size, c.hidden_size)),
    TensorSpec(Tensor.ATTN_NORM, _vector(_H)),
    TensorSpec(Tensor.ATTN_Q, _linear(_Q, _H)),
    TensorSpec(Tensor.ATTN_Q, _vector(_Q), present=lambda c: c.qkv_bias, suffix="bias"),
    TensorSpec(Tensor.ATTN_K, _linear(_KV, _H)),
    TensorSpec(Tensor.ATTN_K, _vector(_KV), present=lambda c: c.qkv_bias, suffix="bias"),
    TensorSpec(Tensor.ATTN_V, _linear(_KV, _H)),
    TensorSpec(Tensor.ATTN_V, _vector(_KV), present=lambda c: c.qkv_bias, suffix="bias"),
    TensorSpec(Tensor.ATTN_Q_NORM, lambda c: (c.head_dim,), present=lambda c: c.qk_norm),
    TensorSpec(Tensor.ATTN_K_NORM, lambda c: (c.head_dim,), present=lambda c: c.qk_norm),
    TensorSpec(Tensor.ATTN_OUTPUT, _linear(_H, _Q)),
    TensorSpec(Tensor.ATTN_POST_NORM, _vector(_H), present=lambda c: c.post_norms),
    TensorSpec(Tensor.FFN_NORM, _vector(_H)),
    TensorSpec(Tensor.FFN_GATE, _linear(_I, _H), present=_dense),
    TensorSpec(Tensor.FFN_UP, _linear(_I, _H), present=_dense),
    TensorSpec(Tensor.FFN_DOWN, _linear(_H, _I), present=_dense),
    # A mixture of experts in place of the MLP (moe.py): the router, the experts stacked as GGUF
    # stores them ([E, out, in]), the shared expert and its gate.
    TensorSpec(Tensor.FFN_GATE_INP, _linear(_E, _H), present=_routed),
    TensorSpec(Tensor.FFN_GATE_EXPS, lambda c: (_E(c), _EI(c), _H(c)), present=_routed),
    TensorSpec(Tensor.FFN_UP_EXPS, lambda c: (_E(c), _EI(c), _H(c)), present=_routed),
    TensorSpec(Tensor.FFN_DOWN_EXPS, lambda c: (_E(c), _H(c), _EI(c)), present=_routed),
    TensorSpec(Tensor.FFN_GATE_SHEXP, _linear(_S, _H), present=_shared),
    TensorSpec(Tensor.FFN_UP_SHEXP, _linear(_S, _H), present=_shared),
    TensorSpec(Tensor.FFN_DOWN_SHEXP, _linear(_H, _S), present=_shared),
    TensorSpec(Tensor.FFN_GATE_INP_SHEXP, lambda c: (1, c.hidden_size), present=lambda c: _shared(c) and c.moe.shared_gate),
    TensorSpec(Tensor.FFN_POST_NORM, _vector(_H), present=lambda c: c.post_norms),
    TensorSpec(Tensor.OUTPUT_NORM, _vector(_H)),
    TensorSpec(Tensor.OUTPUT, lambda c: (c.vocab_size, c.hidden_size), present=lambda c: not c.tie_word_embeddings),
)
