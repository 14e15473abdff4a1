"""The model hyper-parameters every frontend produces and every later stage reads.

Only the Llama family is described here: a decoder-only transformer with RMSNorm, grouped-query
attention with rotary embeddings, and a SwiGLU MLP, no biases.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass


class RopeType(enum.Enum):
    DEFAULT = "default"
    LINEAR = "linear"
    LLAMA3 = "llama3"
    YARN = "yarn"


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
    original_max_position_embeddings: int = 0  # llama3, yarn
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn; None means 0.1 * ln(factor) + 1

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["type"] = self.type.value
        return d

    @classmethod
    def from_json(cls, d: dict) -> "RopeConfig":
        return cls(**{**d, "type": RopeType(d["type"])})


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
    """Hyper-parameters of a Llama-family model, named as in Hugging Face's LlamaConfig."""

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

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")

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
        return d

    @classmethod
    def from_json(cls, d: dict) -> "ModelConfig":
        return cls(**{**d, "rope": RopeConfig.from_json(d["rope"]), "eos_token_ids": tuple(d["eos_token_ids"]),
                      "moe": MoeConfig(**d["moe"]) if d.get("moe") else None})
