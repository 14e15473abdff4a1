"""The Grok-1 shape (xAI's 314B mixture of experts), for ``--synthetic-weights`` builds: the shared
block with a mixture of 8 GELU experts (2 per token, the softmax probabilities of the chosen two as
their weights, not renormalised), an RMSNorm before and after both the attention and the experts
(``post_norms``), attention scores capped at ``max_attn_value * tanh(s / max_attn_value)`` (30) after
the ``attn_output_multiplier`` scale, token embeddings times ``embedding_multiplier_scale`` (78.38)
and logits times ``output_multiplier_scale`` (0.577), tied embeddings, RoPE on the whole head.

The config keys are those of the published Grok-1 config.json (``Grok1ModelForCausalLM``,
``model_type`` grok-1): ``num_experts`` (or ``num_local_experts``), ``num_experts_per_tok``,
``intermediate_size`` (each expert's), ``attn_output_multiplier``, ``max_attn_value``,
``embedding_multiplier_scale``, ``output_multiplier_scale``; where one is missing, Grok-1's own
value. There is no transformers class to check a checkpoint's names against, so only the config
is read (``hf_weights`` off: a folder's weights are refused); Grok-2's additions (a residual MoE,
final or router logit caps) are refused.
"""

from __future__ import annotations

from typing import Any

from grokc.compiler.models import moe
from grokc.compiler.models.architecture import Architecture
from grokc.core.config import Activation, MoeConfig
from grokc.core.errors import UnsupportedModel

EMBEDDING_MULTIPLIER = 78.38367176906169
OUTPUT_MULTIPLIER = 0.5773502691896257
MAX_ATTN_VALUE = 30.0
_GROK2 = ("residual_moe", "final_logit_softcapping", "router_logit_softcapping", "attn_temperature_len")


def _hf_config(raw: dict[str, Any], where: str) -> dict[str, Any]:
    for key in _GROK2:
        if raw.get(key):
            raise UnsupportedModel(f"{where} sets {key}={raw[key]!r} (Grok-2); grokc's Grok-1 graph does not have it")
    head_dim = int(raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"])
    return {"post_norms": True, "activation": Activation.GELU_TANH, "head_dim": head_dim,
            "tie_word_embeddings": bool(raw.get("tie_word_embeddings", True)),
            "attention_scale": float(raw.get("attn_output_multiplier") or head_dim ** -0.5),
            "attn_softcap": float(raw.get("max_attn_value") or MAX_ATTN_VALUE),
            "embedding_scale": float(raw.get("embedding_multiplier_scale") or EMBEDDING_MULTIPLIER),
            "logit_scale": float(raw.get("output_multiplier_scale") or OUTPUT_MULTIPLIER),
            **moe.read_config(lambda: MoeConfig(int(raw.get("num_experts") or raw["num_local_experts"]),
                                                int(raw["num_experts_per_tok"]), int(raw["intermediate_size"]),
                                                norm_top_k=False), where, "Grok-1")}


ARCH = Architecture(
    name="grok1",
    hf_model_types=("grok-1",),
    hf_classes=("Grok1ModelForCausalLM", "Grok1ForCausalLM"),
    gguf_arch=None,
    hf_config=_hf_config,
    hf_weights=False,
)
