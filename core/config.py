"""The model hyper-parameters every frontend produces and every later stage reads.

Only the Llama family is described here: a decoder-only transformer with RMSNorm, grouped-query
attention with rotary embeddings, and a SwiGLU MLP, no biases.
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
        return d

    @classmethod
    def from_json(cls, d: dict) -> "RopeConfig":
        return cls(**{**d, "type": RopeType(d["type"])})


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
        return cls(**{**d, "rope": RopeConfig.from_json(d["rope"]), "eos_token_ids": tuple(d["eos_token_ids"])})


MAX_SIZE = 1 << 24   # any one dimension (vocabulary, hidden, layers, ...): far above any real model


def _integer(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_SIZE:
        raise ValueError(f"{name} is {value!r}; it must be an integer in [{low}, {MAX_SIZE}]")


def _number(name: str, value: object, above: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= above:
        raise ValueError(f"{name} is {value!r}; it must be a finite number above {above:g}")
