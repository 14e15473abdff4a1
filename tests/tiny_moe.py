"""Tiny random mixture-of-experts models, in memory, and their transformers twins.

``moe_config(family)`` is a grokc config of 2 layers; ``moe_weights`` draws its weights (linears
and experts ~ N(0, 0.08^2 * 64 / fan_in), norms 1 + N(0, 0.1), so routing is not a coin toss);
``moe_loaded`` wraps them with a byte-level tokenizer (prose becomes varied ids, for calibration);
``hf_model(cfg, weights)`` is transformers' fp32 model of the same family with the same weights,
loaded through its own checkpoint format (one tensor per expert) from a state dict written by
``hf_state_dict``.
"""

from __future__ import annotations

import numpy as np
import torch
from calib_tiny import byte_tokenizer_json
from tiny_llama import hf_config_dict, tiny_config

from grokc.compiler import models
from grokc.compiler.frontends import LoadedModel
from grokc.core.config import ModelConfig, MoeConfig

FAMILIES = {  # grokc architecture, MoeConfig, transformers classes
    "mixtral": ("mixtral", MoeConfig(4, 2, 96), "MixtralConfig", "MixtralForCausalLM"),
    # many small experts, top-k weights not renormalised, a gated shared expert
    "qwen2_moe": ("qwen2_moe", MoeConfig(8, 3, 32, norm_top_k=False, shared_size=48, shared_gate=True),
                  "Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    # Qwen3's attention (q/k norms, head_dim 32 where hidden / heads is 16), weights renormalised, no shared expert
    "qwen3_moe": ("qwen3_moe", MoeConfig(8, 3, 32, norm_top_k=True), "Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
}


def moe_config(family: str = "mixtral", **overrides) -> ModelConfig:
    arch, moe, _, _ = FAMILIES[family]
    # Qwen2-MoE with its attention biases (qkv_bias, on in the published checkpoints)
    qwen3 = {"qk_norm": True, "head_dim": 32} if arch == "qwen3_moe" else {}
    return tiny_config(architecture=arch, moe=moe, intermediate_size=moe.expert_size,
                       **{"qkv_bias": arch == "qwen2_moe", **qwen3, **overrides})


def moe_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in models.get(cfg.architecture).weight_shapes(cfg).items():
        if name.endswith("norm.weight"):
            a = 1 + 0.1 * rng.standard_normal(shape)
        elif name == "token_embd.weight":
            a = rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) * (0.64 / np.sqrt(shape[-1]))
        out[name] = a.astype(np.float32)
    return out


def moe_loaded(cfg: ModelConfig | None = None, seed: int = 0) -> LoadedModel:
    cfg = cfg or moe_config()
    return LoadedModel(config=cfg, weights=moe_weights(cfg, seed), tokenizer_json=byte_tokenizer_json(),
                       chat_template=None, source_sha256=f"tiny-moe-{seed}", source_format="memory")


def hf_state_dict(cfg: ModelConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``weights`` under the family's Hugging Face checkpoint names (one tensor per expert)."""
    arch = models.get(cfg.architecture)
    out = {hf: weights[c] for hf, c in arch.hf_to_canonical(cfg).items()}
    for canonical, names in arch.hf_stacked(cfg).items():
        out.update({hf: np.ascontiguousarray(weights[canonical][e]) for e, hf in enumerate(names)})
    return out


def hf_kwargs(cfg: ModelConfig) -> dict:
    d = {k: v for k, v in hf_config_dict(cfg).items() if k not in ("attention_bias", "mlp_bias")}
    moe = cfg.moe
    if cfg.architecture == "mixtral":
        return {**d, "num_local_experts": moe.n_experts, "num_experts_per_tok": moe.top_k,
                "sliding_window": cfg.sliding_window or None}
    qwen = {**d, "num_experts": moe.n_experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.expert_size,
            "norm_topk_prob": moe.norm_top_k, "decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": False}
    if cfg.architecture == "qwen3_moe":
        return {**qwen, "attention_bias": cfg.qkv_bias}
    return {**qwen, "shared_expert_intermediate_size": moe.shared_size, "qkv_bias": cfg.qkv_bias}


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """The largest error of ``got`` as a fraction of ``want``'s RMS."""
    return float(np.abs(got - want).max() / np.sqrt((want ** 2).mean()))


def prefill_logits(runner, tokens: list[int]) -> np.ndarray:
    """The last token's logits of ``runner``'s prefill of ``tokens`` (its slot released after)."""
    from grokc.runner import SamplingParams

    slot = runner.engine.add(tokens, SamplingParams(max_new_tokens=2))
    got = runner.executor.read(runner.plan.graphs[f"prefill_{runner.engine.bucket_for(len(tokens))}"].logits)[0]
    runner.engine.release(slot)
    return got


def hf_model(cfg: ModelConfig, weights: dict[str, np.ndarray], folder) -> torch.nn.Module:
    """transformers' fp32 model of ``cfg`` saved to ``folder`` with ``weights`` and loaded back."""
    import transformers
    from safetensors.numpy import save_file

    family = next(f for f, spec in FAMILIES.items() if spec[0] == cfg.architecture)
    _, _, config_class, model_class = FAMILIES[family]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**hf_kwargs(cfg)))
    model.save_pretrained(folder)
    save_file(hf_state_dict(cfg, weights), str(folder / "model.safetensors"))
    return getattr(transformers, model_class).from_pretrained(folder, dtype=torch.float32).eval()
