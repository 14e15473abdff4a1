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
