"""Mistral (Hugging Face ``model_type`` mistral): the Llama block, with one sliding window on every
layer when ``sliding_window`` is set (Mistral-7B-v0.1: 4096; v0.2 and later: null).

GGUF files of Mistral models say ``general.architecture`` llama and carry no window key (llama.cpp's
converter writes none), so they load as ``llama.py``'s, attending over the whole context, as
llama.cpp and transformers run them.
"""

from __future__ import annotations

from typing import Any

from grokc.compiler.models.architecture import Architecture
from grokc.compiler.models.hf_keys import every_layer_window
from grokc.compiler.models.llama import check_plain_block


def _hf_config(raw: dict[str, Any], where: str) -> dict[str, Any]:
    check_plain_block(raw, where, "Mistral")
    return every_layer_window(raw, where)


ARCH = Architecture(
    name="mistral",
    hf_model_types=("mistral",),
    hf_classes=("MistralForCausalLM",),
    gguf_arch=None,
    hf_config=_hf_config,
)
