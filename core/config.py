"""The model hyper-parameters every frontend produces and every later stage reads.

A decoder-only transformer with RMSNorm, grouped-query attention with rotary embeddings and a
gated MLP: the Llama skeleton. The fields after ``architecture`` are the variants the families of
``compiler/models/`` set (their defaults are Llama's): q/k/v biases, per-head q/k norms, norms
after the attention and the MLP, the MLP's activation, an embedding scale, a softmax scale, local
(sliding-window) layers with a RoPE of their own.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass


class RopeType(enum.Enum):
    DEFAULT = "default"
    LINEAR = "linear"
    LLAMA3 = "llama3"
    YARN = "yarn"
    LONGROPE = "longrope"


class Activation(enum.Enum):
    """The gated MLP's activation: ``down(act(gate(x)) * up(x))``."""

    SILU = "silu"              # SwiGLU
    GELU_TANH = "gelu_tanh"    # GeGLU with the tanh approximation of GELU (gelu_pytorch_tanh)


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding: base frequency plus optional context-extension scaling.

    The fields after ``type`` are read only by the scaling types that use them (Hugging Face's
    ``rope_scaling`` / ``rope_parameters`` keys of the same names).
    """

    theta: float = 10000.0
    type: RopeType = RopeType.DEFAULT
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 0  # llama3, yarn, longrope
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn (None means 0.1 * ln(factor) + 1), longrope (always set)
    short_factor: tuple[float, ...] = ()  # longrope: divisors of the frequencies below original_max_position_embeddings
    long_factor: tuple[float, ...] = ()   # longrope: divisors from there on

    def __post_init__(self) -> None:
        if not isinstance(self.type, RopeType):
            raise ValueError(f"rope type {self.type!r} is not one of {', '.join(t.value for t in RopeType)}")
        _number("rope theta", self.theta, above=1.0)
        for name in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow"):
            _number(f"rope {name}", getattr(self, name), above=0.0)
        if self.attention_factor is not None:
            _number("rope attention_factor", self.attention_factor, above=0.0)
        _integer("rope original_max_position_embeddings", self.original_max_position_embeddings, low=0)
        if self.type in (RopeType.LLAMA3, RopeType.YARN) and self.original_max_position_embeddings < 1:
            raise ValueError(f"{self.type.value} rope scaling needs original_max_position_embeddings of 1 or more")
        if self.type is RopeType.LLAMA3 and not self.low_freq_factor < self.high_freq_factor:
            raise ValueError(f"llama3 rope scaling needs low_freq_factor ({self.low_freq_factor}) below "
                             f"high_freq_factor ({self.high_freq_factor})")

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["type"] = self.type.value
        d["short_factor"], d["long_factor"] = list(self.short_factor), list(self.long_factor)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "RopeConfig":
        return cls(**{**d, "type": RopeType(d["type"]), "short_factor": tuple(d.get("short_factor", ())),
                      "long_factor": tuple(d.get("long_factor", ()))})


@dataclass(frozen=True)
class MoeConfig:
    """A mixture-of-experts FFN in place of every layer's MLP (Mixtral, Qwen-MoE, Grok-1).

    Each token's router logits (``x @ router^T``) pick its ``top_k`` experts; each expert is a gated
    MLP of ``expert_size`` (the family's activation) and the token's FFN output is the sum of the
    chosen experts' outputs weighted by their softmax probabilities over all ``n_experts``,
    renormalised to sum to 1 over the chosen ones when ``norm_top_k``. ``shared_size`` > 0 adds a
    shared expert every token uses, of that intermediate size, scaled by ``sigmoid(x . w)`` when
    ``shared_gate`` (Qwen2-MoE), else by 1.
    """

    n_experts: int
    top_k: int
    expert_size: int
    norm_top_k: bool = True
    shared_size: int = 0
    shared_gate: bool = False

    def __post_init__(self) -> None:
        if self.n_experts < 2 or not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"a mixture of experts needs at least 2 experts and 1 <= top_k <= n_experts "
                             f"(got {self.n_experts} experts, top_k {self.top_k})")
        if self.expert_size < 1 or self.shared_size < 0 or (self.shared_gate and not self.shared_size):
            raise ValueError(f"expert size {self.expert_size} must be positive, shared size {self.shared_size} "
                             "non-negative, and a shared gate needs a shared expert")


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a model, named as in Hugging Face's LlamaConfig where it has the field."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "llama"
    moe: MoeConfig | None = None           # set: every layer's MLP is a mixture of experts
    # The family's variants of the Llama block (compiler/models/transformer.py reads them).
    qkv_bias: bool = False                 # q, k and v projections add a bias (Qwen2)
    qk_norm: bool = False                  # each q and k head is RMS-normalised before RoPE (Qwen3, Gemma 3)
    post_norms: bool = False               # attention and MLP outputs are RMS-normalised before the residual add
    activation: Activation = Activation.SILU
    embedding_scale: float = 1.0           # token embeddings are multiplied by this (Gemma 3: sqrt(hidden))
    attention_scale: float | None = None   # softmax scale; None: head_dim ** -0.5
    attn_softcap: float = 0.0              # scaled scores s become c * tanh(s / c) before the softmax (Grok-1: 30); 0: none
    logit_scale: float = 1.0               # the LM head's logits are multiplied by it (Grok-1's output multiplier)
    sliding_window: int = 0                # keys a query of a local layer sees, itself included; 0: no local layers
    local_layers: tuple[int, ...] = ()     # layers attending over the last sliding_window positions only
    rope_local: RopeConfig | None = None   # the local layers' own RoPE (Gemma 3); None: ``rope``

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "max_position_embeddings"):
            _integer(name, getattr(self, name), low=1)
        _number("rms_norm_eps", self.rms_norm_eps, above=0.0)
        if not isinstance(self.rope, RopeConfig) or not isinstance(self.tie_word_embeddings, bool) \
                or not isinstance(self.architecture, str) or not isinstance(self.eos_token_ids, tuple):
            raise ValueError("rope, tie_word_embeddings, architecture or eos_token_ids has the wrong type")
        for token in (*([] if self.bos_token_id is None else [self.bos_token_id]), *self.eos_token_ids):
            _integer("a bos/eos token id", token, low=0)
            if token >= self.vocab_size:
                raise ValueError(f"token id {token} (bos/eos) is outside the vocabulary of {self.vocab_size}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        _number("logit_scale", self.logit_scale, above=0.0)
        if not isinstance(self.attn_softcap, (int, float)) or not 0 <= self.attn_softcap < math.inf:
            raise ValueError(f"attn_softcap is {self.attn_softcap!r}; it must be 0 (none) or a finite positive cap")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        if bool(self.sliding_window > 0) != bool(self.local_layers):
            raise ValueError(f"sliding_window ({self.sliding_window}) and local_layers ({list(self.local_layers)}) "
                             "must be set together")
        if any(not 0 <= i < self.num_layers for i in self.local_layers):
            raise ValueError(f"local_layers {list(self.local_layers)} name layers outside 0..{self.num_layers - 1}")
        if self.rope_local is not None and not self.local_layers:
            raise ValueError("rope_local is set but no layer is local")

    @property
    def attn_scale(self) -> float:
        """The softmax scale of every attention layer."""
        return self.head_dim ** -0.5 if self.attention_scale is None else self.attention_scale

    def window(self, layer: int) -> int:
        """Keys a query of ``layer`` sees (itself included), or 0 for the whole context."""
        return self.sliding_window if layer in self.local_layers else 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["rope"] = self.rope.to_json()
        d["eos_token_ids"] = list(self.eos_token_ids)
        d["activation"] = self.activation.value
        d["local_layers"] = list(self.local_layers)
        d["rope_local"] = None if self.rope_local is None else self.rope_local.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict) -> "ModelConfig":
        local = d.get("rope_local")
        return cls(**{**d, "rope": RopeConfig.from_json(d["rope"]), "eos_token_ids": tuple(d["eos_token_ids"]),
                      "activation": Activation(d.get("activation", Activation.SILU.value)),
                      "local_layers": tuple(d.get("local_layers", ())),
                      "rope_local": None if local is None else RopeConfig.from_json(local),
                      "moe": MoeConfig(**d["moe"]) if d.get("moe") else None})


MAX_SIZE = 1 << 24   # any one dimension (vocabulary, hidden, layers, ...): far above any real model


def _integer(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_SIZE:
        raise ValueError(f"{name} is {value!r}; it must be an integer in [{low}, {MAX_SIZE}]")


def _number(name: str, value: object, above: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= above:
        raise ValueError(f"{name} is {value!r}; it must be a finite number above {above:g}")
