"""Phi-3 (mini/medium, 4k and 128k): the Llama block, stored with q/k/v fused (``qkv_proj``) and
gate/up fused (``gate_up_proj``, gate rows first), with plain RoPE (4k) or longrope (128k: short
and long factors, switched at ``original_max_position_embeddings``, an attention factor on cos and
sin; ``core/rope.py`` says how grokc switches), and a sliding window on every layer when
``sliding_window`` is set (Phi-3-mini-4k: 2047).

GGUF files (``general.architecture`` phi3) store the same fused tensors (``attn_qkv``; ``ffn_up``
holds gate and up), the longrope factors as ``rope_factors_{long,short}.weight`` with
``rope.scaling.original_context_length`` and ``rope.scaling.attn_factor``, and a SentencePiece
vocabulary read the Phi-3 way. Their ``attention.sliding_window`` is ignored, as llama.cpp and
transformers' GGUF loader ignore it: a Phi-3 GGUF attends over the whole context.
"""

from __future__ import annotations

import math
from typing import Any

from grokc.compiler.models.architecture import Architecture, SentencePiece, Split
from grokc.compiler.models.hf_keys import window_fields
from grokc.compiler.models.qwen2 import check_silu
from grokc.core.config import RopeConfig, RopeType
from grokc.core.errors import UnsupportedModel
from grokc.core.tensors import Tensor


def _hf_config(raw: dict[str, Any], where: str) -> dict[str, Any]:
    check_silu(raw, where)
    window = raw.get("sliding_window")
    return window_fields(window, tuple(range(int(raw["num_hidden_layers"]))) if window else (), raw, where)


def _gguf_config(key, tensor, where: str) -> dict[str, Any]:
    long, short = tensor(Tensor.ROPE_FACTORS_LONG), tensor(Tensor.ROPE_FACTORS_SHORT)
    if long is None and short is None:
        return {}
    if long is None or short is None or long.shape != short.shape:
        raise UnsupportedModel(f"{where} has one of rope_factors_long / rope_factors_short without the other; "
                               "re-export the file")
    original = int(key("rope.scaling.original_context_length"))
    factor = int(key("context_length")) / original
    attention = key("rope.scaling.attn_factor", None)
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    rope = RopeConfig(theta=float(key("rope.freq_base", 10000.0)), type=RopeType.LONGROPE, factor=factor,
                      original_max_position_embeddings=original, attention_factor=float(attention),
                      short_factor=tuple(float(f) for f in short.reshape(-1)),
                      long_factor=tuple(float(f) for f in long.reshape(-1)))
    return {"rope": rope}


ARCH = Architecture(
    name="phi3",
    hf_model_types=("phi3",),
    hf_classes=("Phi3ForCausalLM",),
    gguf_arch="phi3",
    splits=(Split("attn_qkv", "model.layers.{i}.self_attn.qkv_proj", (Tensor.ATTN_Q, Tensor.ATTN_K, Tensor.ATTN_V)),
            Split("ffn_up", "model.layers.{i}.mlp.gate_up_proj", (Tensor.FFN_GATE, Tensor.FFN_UP))),
    hf_config=_hf_config,
    gguf_config=_gguf_config,
    config_tensors=(Tensor.ROPE_FACTORS_LONG, Tensor.ROPE_FACTORS_SHORT),
    gguf_sentencepiece=SentencePiece.PHI3,
)
