"""Canonical tensor names (llama.cpp's, as in GGUF files) and the map from Hugging Face names.

The torch model's parameters, the IR's parameters and the artifact's weights all use these
names, e.g. ``blk.3.attn_q.weight``; passes derive new names from them with suffixes
(``blk.3.attn_qkv.weight``, ``.qweight``, ``.scales``).
"""

from __future__ import annotations

import re

_HF_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_HF_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.weight")


def from_hf(name: str) -> str | None:
    """Canonical name of a Hugging Face Llama tensor, or None if it is not one grokc uses."""
    if name in _HF_GLOBAL:
        return _HF_GLOBAL[name]
    m = _LAYER_RE.fullmatch(name)
    if m and m.group(2) in _HF_LAYER:
        return f"blk.{m.group(1)}.{_HF_LAYER[m.group(2)]}.weight"
    return None


def layer(i: int, kind: str) -> str:
    """``layer(3, "attn_q")`` -> ``blk.3.attn_q.weight``."""
    return f"blk.{i}.{kind}.weight"


LM_HEAD = "output.weight"  # the LM head's name, also when it is tied to token_embd.weight

# Linears that read the same input as another: q/k/v (and their fusion attn_qkv), gate/up (ffn_gate_up).
_SAME_INPUT = {"attn_k": "attn_q", "attn_v": "attn_q", "attn_qkv": "attn_q", "ffn_up": "ffn_gate",
               "ffn_gate_up": "ffn_gate"}


def input_key(weight: str) -> str:
    """The name that keys the calibration statistics of ``weight``'s input: the canonical name of
    the first linear reading that input (``blk.3.attn_qkv.weight`` -> ``blk.3.attn_q.weight``)."""
    parts = weight.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _SAME_INPUT:
        return layer(int(parts[1]), _SAME_INPUT[parts[2]])
    return weight
