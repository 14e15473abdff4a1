"""A tiny random Llama, in memory, for fast compiler tests: config, weights (canonical names), tokenizer."""

from __future__ import annotations

import json

import numpy as np

from grokc.compiler import models
from grokc.compiler.frontends import LoadedModel, weight_shapes
from grokc.core.config import ModelConfig, RopeConfig


def tiny_config(**overrides) -> ModelConfig:
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=16, rms_norm_eps=1e-5, rope=RopeConfig(theta=10000.0), max_position_embeddings=512,
                tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,))
    return ModelConfig(**{**base, **overrides})


def tiny_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random canonically named weights: linears ~ N(0, 1/fan_in), norms ~ 1 + N(0, 0.1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("norm.weight"):
            a = 1 + 0.1 * rng.standard_normal(shape)
        elif name == "token_embd.weight":
            a = rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[1])
        out[name] = a.astype(np.float32)
    return out


def hf_named(cfg: ModelConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``weights`` under their Hugging Face names (the architecture's name table), for transformers."""
    hf_of = {c: h for h, c in models.get(cfg.architecture).hf_to_canonical(cfg).items()}
    return {hf_of[name]: a for name, a in weights.items()}


def tiny_tokenizer_json(vocab_size: int) -> str:
    """A word-level tokenizer over the words t0 .. t{vocab-1} (enough for the runner to load)."""
    vocab = {f"t{i}": i for i in range(vocab_size)}
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
    })


def tiny_loaded(cfg: ModelConfig | None = None, seed: int = 0) -> LoadedModel:
    cfg = cfg or tiny_config()
    return LoadedModel(config=cfg, weights=tiny_weights(cfg, seed), tokenizer_json=tiny_tokenizer_json(cfg.vocab_size),
                       chat_template=None, source_sha256=f"tiny-seed-{seed}", source_format="memory")


def hf_config_dict(cfg: ModelConfig) -> dict:
    """The Hugging Face LlamaConfig kwargs of ``cfg`` (for a transformers reference model)."""
    rope = cfg.rope
    fields = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
              "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor")}
    params = {"rope_type": rope.type.value, "rope_theta": rope.theta}
    params.update({f: getattr(rope, f) for f in fields.get(rope.type.value, ()) if getattr(rope, f) is not None})
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
                rope_parameters=params, max_position_embeddings=cfg.max_position_embeddings,
                tie_word_embeddings=cfg.tie_word_embeddings, attention_bias=False, mlp_bias=False)
