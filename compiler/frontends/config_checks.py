"""Checking a model's configuration as its file writes it, before any of it becomes a ``ModelConfig``.

The frontends turn config values into numbers with ``int()`` and ``float()``, which would take
``"64"`` or truncate ``64.7`` without a word, and divide by head counts before ``ModelConfig``
checks them. These checks run first and refuse, with one ``UnsupportedModel`` line naming the key:

- ``check_hf_config``: every key of a Hugging Face ``config.json`` (and ``generation_config.json``)
  that grokc reads is of its type (integers are not strings, floats or booleans; numbers are
  finite), the sizes are at least 1, and ``hidden_size`` divides by ``num_attention_heads`` when
  there is no ``head_dim``;
- ``check_hf_index``: ``model.safetensors.index.json`` maps tensor names to plain file names in the
  folder;
- ``check_gguf_metadata``: the same for the ``<arch>.*`` and ``tokenizer.ggml.*`` keys of a GGUF;
- ``check_tokenizer``: ``tokenizer.json`` loads with the ``tokenizers`` library (as the runner will
  load it) and its ids fit the model's vocabulary.

Ranges and consistency beyond these (head counts dividing, token ids inside the vocabulary, RoPE
parameters) are ``ModelConfig``'s own checks (``core/config.py``); each family's extra keys are its
``hf_config`` / ``gguf_config`` hook's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from grokc.core.errors import UnsupportedModel

INT, NUMBER, BOOL, STR, LIST, DICT = "an integer", "a number", "true or false", "a string", "a list", "an object"
HF_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
HF_KEYS: dict[str, tuple[str, ...]] = {   # key -> the kinds its value may have (None is always allowed)
    **{k: (INT,) for k in (*HF_SIZES, "num_key_value_heads", "head_dim", "max_position_embeddings", "bos_token_id")},
    "eos_token_id": (INT, LIST), "rms_norm_eps": (NUMBER,), "rope_theta": (NUMBER,),
    "partial_rotary_factor": (NUMBER,), "tie_word_embeddings": (BOOL,), "model_type": (STR,),
    "architectures": (LIST,), "rope_scaling": (DICT,), "rope_parameters": (DICT,), "quantization_config": (DICT,),
}
ROPE_KEYS: dict[str, tuple[str, ...]] = {
    "rope_type": (STR,), "type": (STR,), "original_max_position_embeddings": (INT,),
    **{k: (NUMBER,) for k in ("rope_theta", "factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                              "attention_factor", "partial_rotary_factor")},
}
GGUF_KEYS: dict[str, tuple[str, ...]] = {   # after the "<arch>." prefix
    **{k: (INT,) for k in ("embedding_length", "block_count", "feed_forward_length", "attention.head_count",
                           "context_length", "rope.dimension_count", "attention.key_length",
                           "attention.value_length", "vocab_size", "expert_count",
                           "rope.scaling.original_context_length")},
    "attention.head_count_kv": (INT, LIST),
    **{k: (NUMBER,) for k in ("attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.scaling.factor",
                              "rope.scale_linear", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
                              "rope.scaling.attn_factor", "rope.scaling.yarn_log_multiplier")},
    "rope.scaling.type": (STR,),
}
GGUF_TOKENIZER_KEYS: dict[str, tuple[str, ...]] = {
    **{f"tokenizer.ggml.{k}_token_id": (INT,) for k in ("bos", "eos", "eot", "eom", "unknown", "padding")},
    "tokenizer.ggml.model": (STR,), "tokenizer.ggml.pre": (STR,), "tokenizer.ggml.tokens": (LIST,),
    "tokenizer.ggml.merges": (LIST,), "tokenizer.ggml.token_type": (LIST,), "tokenizer.chat_template": (STR,),
    "general.architecture": (STR,),
}
_PLAIN_FILE = re.compile(r"[^/\\\0]+")
_MERGE = re.compile(r"[^ ]+ [^ ]+")


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT
    if isinstance(value, float):
        return NUMBER if math.isfinite(value) else None
    return {str: STR, list: LIST, dict: DICT}.get(type(value))


def _check_keys(raw: Mapping[str, Any], kinds: Mapping[str, tuple[str, ...]], where: str, prefix: str = "") -> None:
    for key, allowed in kinds.items():
        value = raw.get(prefix + key)
        if value is None:
            continue
        kind = _kind(value)
        if kind not in allowed and not (kind == INT and NUMBER in allowed):
            raise UnsupportedModel(f"{where} has {prefix + key} = {_short(value)}, which is not "
                                   f"{' or '.join(allowed)}; fix the file or re-export the model")
        if kind == LIST and INT in allowed and not all(_kind(v) == INT for v in value):
            raise UnsupportedModel(f"{where} has {prefix + key} = {_short(value)}, which is not a list of integers; "
                                   "fix the file or re-export the model")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_hf_config(raw: Mapping[str, Any], generation: Mapping[str, Any] | None, where: str) -> None:
    """Refuse a ``config.json`` dict whose keys grokc reads are of the wrong type or out of range."""
    _check_keys(raw, HF_KEYS, where)
    for name in ("rope_scaling", "rope_parameters"):
        if isinstance(raw.get(name), dict):
            _check_keys(raw[name], ROPE_KEYS, where, prefix="")
    if isinstance(raw.get("architectures"), list) and not all(isinstance(c, str) for c in raw["architectures"]):
        raise UnsupportedModel(f"{where} has architectures {_short(raw['architectures'])}, not a list of class names")
    if generation:
        _check_keys(generation, {"eos_token_id": (INT, LIST)}, where.replace("config.json", "generation_config.json"))
    for key in (*HF_SIZES, "num_key_value_heads", "head_dim"):
        if raw.get(key) is not None and raw[key] < 1:
            raise UnsupportedModel(f"{where} has {key} = {raw[key]}; it must be at least 1")
    if raw.get("head_dim") is None and raw.get("hidden_size") and raw.get("num_attention_heads") \
            and raw["hidden_size"] % raw["num_attention_heads"]:
        raise UnsupportedModel(f"{where} has hidden_size {raw['hidden_size']}, which num_attention_heads "
                               f"{raw['num_attention_heads']} does not divide, and no head_dim; fix the config")


def check_hf_index(index: Mapping[str, Any], where: str) -> None:
    """Refuse a ``model.safetensors.index.json`` whose ``weight_map`` is not tensor name -> file name."""
    weight_map = index.get("weight_map", {})
    if not isinstance(weight_map, dict) or not all(
            isinstance(f, str) and _PLAIN_FILE.fullmatch(f) and f not in (".", "..") for f in weight_map.values()):
        raise UnsupportedModel(f"{where} has a weight_map that is not tensor name -> file name in the folder; "
                               "re-download the model")


def check_gguf_metadata(metadata: Mapping[str, Any], prefix: str, where: str) -> None:
    """Refuse GGUF metadata whose ``<prefix>.*`` or tokenizer keys are of the wrong type or out of range."""
    _check_keys(metadata, GGUF_KEYS, where, prefix=f"{prefix}.")
    _check_keys(metadata, GGUF_TOKENIZER_KEYS, where)
    for key in ("embedding_length", "block_count", "feed_forward_length", "attention.head_count", "context_length",
                "attention.key_length"):
        value = metadata.get(f"{prefix}.{key}")
        if value is not None and value < 1:
            raise UnsupportedModel(f"{where} has {prefix}.{key} = {value}; it must be at least 1")
    kv = metadata.get(f"{prefix}.attention.head_count_kv")
    if isinstance(kv, list) and (not kv or min(kv) < 1) or isinstance(kv, int) and kv < 1:
        raise UnsupportedModel(f"{where} has {prefix}.attention.head_count_kv = {_short(kv)}; it must be at least 1")
    hidden, heads = metadata.get(f"{prefix}.embedding_length"), metadata.get(f"{prefix}.attention.head_count")
    if metadata.get(f"{prefix}.attention.key_length") is None and hidden and heads and hidden % heads:
        raise UnsupportedModel(f"{where} has embedding_length {hidden}, which attention.head_count {heads} does not "
                               "divide, and no attention.key_length; re-export the file")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is not None and not all(isinstance(t, str) for t in tokens):
        raise UnsupportedModel(f"{where} has tokenizer.ggml.tokens that are not all strings; re-export the file")
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is not None and not all(isinstance(m, str) and _MERGE.fullmatch(m) for m in merges):
        raise UnsupportedModel(f"{where} has tokenizer.ggml.merges that are not all pairs 'left right'; re-export the file")
    types = metadata.get("tokenizer.ggml.token_type")
    if types is not None and not all(_kind(t) == INT for t in types):
        raise UnsupportedModel(f"{where} has tokenizer.ggml.token_type values that are not integers; re-export the file")


def check_tokenizer(tokenizer_json: str, vocab_size: int, where: str) -> None:
    """Refuse a ``tokenizer.json`` the ``tokenizers`` library cannot load, or whose ids pass the vocabulary."""
    from tokenizers import Tokenizer

    try:
        size = Tokenizer.from_str(tokenizer_json).get_vocab_size(with_added_tokens=True)
    except Exception as exc:  # the library raises its own exception type on any bad input
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise UnsupportedModel(f"{where}: the tokenizer cannot be loaded by the tokenizers library ({detail}); "
                               "fix or re-export tokenizer.json") from None
    if size > vocab_size:
        raise UnsupportedModel(f"{where}: the tokenizer has {size} tokens but the model's vocabulary {vocab_size}; "
                               "ids past the vocabulary would have no embedding, so use the model's own tokenizer")
