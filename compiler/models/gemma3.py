"""Gemma 3 (text): the Llama block with norms before and after the attention and the MLP (all
RMSNorms scale by ``1 + w``), RMSNorm of each q and k head before RoPE, GeGLU with tanh-GELU,
embeddings times sqrt(hidden), the softmax scaled by ``query_pre_attn_scalar ** -0.5``, and local
layers (a sliding window, RoPE base 10000) between global ones (RoPE base ``rope_theta``, any
scaling): layers ``i`` with ``(i + 1) % 6 != 0`` are local.

Config keys (``Gemma3TextConfig``): ``head_dim`` (256), ``query_pre_attn_scalar`` (256),
``sliding_window`` (4096), ``layer_types``, else ``sliding_window_pattern`` (6), the RoPE as nested
``rope_parameters`` (``full_attention`` / ``sliding_attention``) or as ``rope_theta`` (1e6) +
``rope_scaling`` + ``rope_local_base_freq`` (1e4); ``hidden_activation`` must be
``gelu_pytorch_tanh``; ``final_logit_softcapping`` and bidirectional attention are refused
(``attn_logit_softcapping`` is inert in transformers' Gemma 3 and ignored). Hugging Face norm
weights are ``w``: the frontend stores ``1 + w``, as GGUF files do (``hf_norm_shift``). Its
residual stream passes the f16 range, so the build stores it times ``2**-RESIDUAL_SHIFT``
(``residual_shift``: ``passes/scale_residual.py``, exact: the logits are unchanged).

GGUF (``general.architecture`` gemma3) lacks the pattern, the local base and the query scalar;
they are taken as llama.cpp takes them: pattern 6, base 10000, ``query_pre_attn_scalar`` =
``key_length`` (``embedding_length / head_count`` for the 62-layer 27B). Its SentencePiece
vocabulary is read the Gemma way.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from grokc.compiler.models.architecture import Architecture, SentencePiece
from grokc.compiler.models.hf_keys import rope_from_hf, rope_params, sliding_layers, window_fields
from grokc.core.config import Activation, RopeConfig
from grokc.core.errors import UnsupportedModel
from grokc.core.tensors import LLAMA_HF, Tensor

PATTERN = 6            # every sixth layer is global (llama.cpp's set_swa_pattern(6))
LOCAL_BASE = 10000.0   # the local layers' RoPE base (rope_local_base_freq)
_27B_LAYERS = 62       # llama.cpp's LLM_TYPE_27B, whose query scalar is hidden / heads
# The residual stream is stored times 2**-4 (passes/scale_residual.py): on Gemma-3-270M (fp32, from
# its GGUF) it reaches about 1.04e5 in the last layers, past f16's 65504 (q/k/v, the o and down
# projections and the MLP's activations stay below 700); 1/16 keeps it near 6.5e3 with 10x to spare.
RESIDUAL_SHIFT = 4


def _shared(hidden: int, scalar: float) -> dict[str, Any]:
    """The fields every Gemma 3 has, whichever file it came from."""
    return {"qk_norm": True, "post_norms": True, "activation": Activation.GELU_TANH,
            "embedding_scale": float(np.float32(math.sqrt(hidden))),   # transformers: f32 sqrt(hidden)
            "attention_scale": float(scalar) ** -0.5}


def _pattern_layers(n: int, pattern: int) -> list[bool]:
    return [bool((i + 1) % pattern) for i in range(n)]


def _hf_config(raw: dict[str, Any], where: str) -> dict[str, Any]:
    act = raw.get("hidden_activation", raw.get("hidden_act", "gelu_pytorch_tanh"))
    if act != "gelu_pytorch_tanh":
        raise UnsupportedModel(f"{where} sets hidden_activation {act!r}; only gelu_pytorch_tanh (GeGLU) is supported")
    for flag in ("final_logit_softcapping", "use_bidirectional_attention", "attention_bias"):
        if raw.get(flag):
            raise UnsupportedModel(f"{where} sets {flag}={raw[flag]!r}, which grokc's Gemma 3 graph does not have")
    n = int(raw["num_hidden_layers"])
    pattern = int(raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", PATTERN)))
    local = sliding_layers(raw, n, _pattern_layers(n, pattern), where)
    params = rope_params(raw)
    if isinstance(params.get("full_attention"), dict):
        rope = rope_from_hf(params["full_attention"], raw, where, theta=1e6)
        rope_local = rope_from_hf(params.get("sliding_attention", {}), raw, where, theta=LOCAL_BASE)
    else:
        rope = rope_from_hf(params, raw, where, theta=float(raw.get("rope_theta", 1e6)))
        rope_local = RopeConfig(theta=float(raw.get("rope_local_base_freq", LOCAL_BASE)))
    window = window_fields(raw.get("sliding_window", 4096), local, raw, where)
    return {**_shared(int(raw["hidden_size"]), raw.get("query_pre_attn_scalar", 256)),
            "head_dim": int(raw.get("head_dim", 256)), "tie_word_embeddings": bool(raw.get("tie_word_embeddings", True)),
            "rope": rope, **window, **({"rope_local": rope_local} if window else {})}


def _gguf_config(key, tensor, where: str) -> dict[str, Any]:
    if key("final_logit_softcapping", None):
        raise UnsupportedModel(f"{where} sets gemma3.final_logit_softcapping, which grokc's Gemma 3 graph does not have")
    n, hidden, heads = int(key("block_count")), int(key("embedding_length")), int(key("attention.head_count"))
    scalar = hidden / heads if n == _27B_LAYERS else int(key("attention.key_length", hidden // heads))
    local = tuple(i for i, s in enumerate(_pattern_layers(n, PATTERN)) if s)
    window = window_fields(key("attention.sliding_window", 0), local,
                           {"max_position_embeddings": key("context_length")}, where)
    return {**_shared(hidden, scalar), **window, **({"rope_local": RopeConfig(theta=LOCAL_BASE)} if window else {})}


ARCH = Architecture(
    name="gemma3",
    hf_model_types=("gemma3_text",),
    hf_classes=("Gemma3ForCausalLM",),
    gguf_arch="gemma3",
    hf_names={**LLAMA_HF,
              Tensor.ATTN_POST_NORM: "model.layers.{i}.post_attention_layernorm",
              Tensor.FFN_NORM: "model.layers.{i}.pre_feedforward_layernorm",
              Tensor.FFN_POST_NORM: "model.layers.{i}.post_feedforward_layernorm"},
    hf_config=_hf_config,
    gguf_config=_gguf_config,
    hf_norm_shift=1.0,
    gguf_sentencepiece=SentencePiece.GEMMA,
    residual_shift=RESIDUAL_SHIFT,
)
