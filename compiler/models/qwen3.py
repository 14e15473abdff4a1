"""Qwen3 (dense): the Llama block with an RMSNorm over each q and k head before RoPE, an explicit
``head_dim`` (Qwen3-0.6B: 128 with hidden 1024 and 16 heads), and optional q/k/v biases.

Config keys: ``head_dim`` (``Qwen3Config``'s default 128 when absent), ``attention_bias``, and the
sliding-window keys of Qwen2 (``qwen2.qwen_window``). GGUF files (``general.architecture`` qwen3)
carry ``attention.key_length`` for the head size and ``blk.N.attn_{q,k}_norm``; their q/k rows are
not permuted.
"""

from __future__ import annotations

from typing import Any

from grokc.compiler.models.architecture import Architecture
from grokc.compiler.models.qwen2 import check_silu, qwen_window


def _hf_config(raw: dict[str, Any], where: str) -> dict[str, Any]:
    check_silu(raw, where)
    return {"qk_norm": True, "qkv_bias": bool(raw.get("attention_bias", False)), "head_dim": int(raw.get("head_dim", 128)),
            **qwen_window(raw, where)}


ARCH = Architecture(
    name="qwen3",
    hf_model_types=("qwen3",),
    hf_classes=("Qwen3ForCausalLM",),
    gguf_arch="qwen3",
    hf_config=_hf_config,
    gguf_config=lambda key, tensor, where: {"qk_norm": True},
)
