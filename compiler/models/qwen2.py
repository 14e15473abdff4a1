"""Qwen2 / Qwen2.5: the Llama block with biases on q, k and v (not o), tied embeddings in the
small sizes, and an optional sliding window.

Config keys: the biases are hard-coded (``Qwen2Attention``: q/k/v ``bias=True``); ``use_sliding_window``
with ``sliding_window`` and ``max_window_layers`` (layers from ``max_window_layers`` on are local),
or an explicit ``layer_types``; released Qwen2.5 models leave the window off. GGUF files
(``general.architecture`` qwen2) carry the biases as ``blk.N.attn_{q,k,v}.bias`` and no window keys,
and their q/k rows are not permuted.
"""

from __future__ import annotations

from typing import Any

from grokc.compiler.models.architecture import Architecture
from grokc.compiler.models.hf_keys import sliding_layers, window_fields
from grokc.core.errors import UnsupportedModel


def qwen_window(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """Qwen2/Qwen3's sliding window: ``Qwen2Config.__post_init__``'s rule (the window only with
    ``use_sliding_window``, on layers ``>= max_window_layers``) unless ``layer_types`` says."""
    window = raw.get("sliding_window") if raw.get("use_sliding_window") else None
    n = int(raw["num_hidden_layers"])
    first = int(raw.get("max_window_layers", n))
    layers = sliding_layers(raw, n, [window is not None and i >= first for i in range(n)], where)
    return window_fields(window, layers, raw, where)


def check_silu(raw: dict[str, Any], where: str) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModel(f"{where} sets hidden_act {act!r}; only SiLU (SwiGLU) MLPs are supported")


def _hf_config(raw: dict[str, Any], where: str) -> dict[str, Any]:
    check_silu(raw, where)
    return {"qkv_bias": True, **qwen_window(raw, where)}


ARCH = Architecture(
    name="qwen2",
    hf_model_types=("qwen2",),
    hf_classes=("Qwen2ForCausalLM",),
    gguf_arch="qwen2",
    hf_config=_hf_config,
    gguf_config=lambda key, tensor, where: {"qkv_bias": True},
)
