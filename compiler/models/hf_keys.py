"""How Hugging Face ``config.json`` files spell what several families share: the RoPE parameters
and which layers attend over a sliding window. The family hooks (``hf_config``) and the Hugging
Face frontend read them through these functions, so each key is interpreted in one place.
"""

from __future__ import annotations

import math
from typing import Any

from grokc.core.config import RopeConfig, RopeType
from grokc.core.errors import UnsupportedModel

_ROPE_TYPES = {"default": RopeType.DEFAULT, "linear": RopeType.LINEAR, "llama3": RopeType.LLAMA3, "yarn": RopeType.YARN,
               "longrope": RopeType.LONGROPE, "su": RopeType.LONGROPE}   # "su": Phi-3's older name of longrope
_FIELDS = (("factor", float), ("low_freq_factor", float), ("high_freq_factor", float),
           ("original_max_position_embeddings", int), ("beta_fast", float), ("beta_slow", float),
           ("attention_factor", float))


def rope_params(raw: dict[str, Any]) -> dict[str, Any]:
    """The rope parameters of a config: transformers >= 5 writes ``rope_parameters`` (theta
    included), older versions ``rope_theta`` and ``rope_scaling``; the newer wins key by key."""
    return {**(raw.get("rope_scaling") or {}), **(raw.get("rope_parameters") or {})}


def rope_from_hf(params: dict[str, Any], raw: dict[str, Any], where: str, theta: float | None = None) -> RopeConfig:
    """``RopeConfig`` of one set of rope parameters (``rope_params``, or one layer type's entry of a
    nested one); ``theta`` is the base when ``params`` names none (else ``raw``'s ``rope_theta``, else
    10000). Refuses partial rotary embeddings and unknown scaling types."""
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedModel(f"{where} sets partial_rotary_factor {partial}; only full-width rotary embeddings are supported")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in _ROPE_TYPES:
        raise UnsupportedModel(f"{where} uses rope_type {kind!r}; supported: {', '.join(_ROPE_TYPES)}")
    base = next((t for t in (params.get("rope_theta"), theta, raw.get("rope_theta")) if t is not None), 10000.0)
    fields: dict[str, Any] = {"theta": float(base), "type": _ROPE_TYPES[kind]}
    for key, cast in _FIELDS:
        if params.get(key) is not None:
            fields[key] = cast(params[key])
    if fields["type"] is RopeType.LONGROPE:
        fields.update(_longrope(params, raw, where))
    return RopeConfig(**fields)


def _longrope(params: dict[str, Any], raw: dict[str, Any], where: str) -> dict[str, Any]:
    """longrope's fields as transformers' ``_compute_longrope_parameters`` derives them: the
    top-level ``original_max_position_embeddings`` first, ``factor`` = max positions / that when
    unset, ``attention_factor`` = sqrt(1 + ln(factor) / ln(original)) (1 when factor <= 1)."""
    original = raw.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
    short, long = params.get("short_factor"), params.get("long_factor")
    if not original or not short or not long:
        raise UnsupportedModel(f"{where} uses longrope without original_max_position_embeddings, short_factor "
                               "and long_factor; re-export the config")
    factor = params.get("factor") or int(raw.get("max_position_embeddings", original)) / int(original)
    attention = params.get("attention_factor") or (
        1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(int(original))))
    return {"original_max_position_embeddings": int(original), "factor": float(factor),
            "attention_factor": float(attention), "short_factor": tuple(float(f) for f in short),
            "long_factor": tuple(float(f) for f in long)}


def sliding_layers(raw: dict[str, Any], num_layers: int, default: list[bool], where: str) -> tuple[int, ...]:
    """The layers of a config that attend over ``sliding_window`` keys: those ``layer_types`` marks
    ``sliding_attention`` when the config lists them (transformers >= 4.54 writes it), else those
    ``default`` marks."""
    types = raw.get("layer_types")
    if types is None:
        return tuple(i for i, s in enumerate(default) if s)
    if len(types) != num_layers or any(t not in ("full_attention", "sliding_attention") for t in types):
        raise UnsupportedModel(f"{where} has layer_types {types}; expected {num_layers} entries of "
                               "'full_attention' / 'sliding_attention'")
    return tuple(i for i, t in enumerate(types) if t == "sliding_attention")


def window_fields(window: int | None, layers: tuple[int, ...], raw: dict[str, Any], where: str) -> dict[str, Any]:
    """``ModelConfig``'s ``sliding_window`` / ``local_layers`` for ``layers`` attending over ``window``
    keys; none when no layer does or the window spans the whole context (it then hides nothing)."""
    if not layers:
        return {}
    if not window:
        raise UnsupportedModel(f"{where} marks layers {list(layers)} sliding_attention but sets no sliding_window; "
                               "re-export the config")
    if int(window) >= int(raw.get("max_position_embeddings", 2048)):
        return {}
    return {"sliding_window": int(window), "local_layers": layers}


def every_layer_window(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """Mistral's ``sliding_window``: every layer attends over it (or none, when it is null)."""
    window = raw.get("sliding_window")
    return window_fields(window, tuple(range(int(raw["num_hidden_layers"]))) if window else (), raw, where)
