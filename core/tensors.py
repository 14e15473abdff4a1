"""The one name table of grokc's tensors (llama.cpp's ``LLM_TN``): every kind, its canonical name,
and its Hugging Face name.

A canonical name is the tensor's GGUF name: ``name(Tensor.ATTN_Q, 3)`` is ``blk.3.attn_q.weight``,
``name(Tensor.TOKEN_EMBD)`` is ``token_embd.weight``. The frontends hand the compiler weights
under these names (a GGUF file already uses them; a Hugging Face folder's names are mapped through
``hf_name``), the torch models name their parameters so, and the IR, the passes and the artifact
keep them; passes derive new names from them with suffixes (``.qweight``, ``.scales``).

Hugging Face names are templates per kind (``model.layers.{i}.self_attn.q_proj``); ``LLAMA_HF``
is the layout most families share, and an architecture (``compiler/models/``) overrides the kinds
its checkpoints name differently. Keep the kinds in step with gguf-py's ``MODEL_TENSOR`` names.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping


class Tensor(enum.Enum):
    """Every tensor kind an architecture may have; values are the GGUF base names."""

    TOKEN_EMBD = "token_embd"
    OUTPUT_NORM = "output_norm"
    OUTPUT = "output"
    ROPE_FREQS = "rope_freqs"          # llama3 rope scaling as GGUF stores it (per frequency)
    ROPE_FACTORS_LONG = "rope_factors_long"    # longrope's divisors as Phi-3 GGUFs store them
    ROPE_FACTORS_SHORT = "rope_factors_short"
    ATTN_NORM = "attn_norm"
    ATTN_Q = "attn_q"
    ATTN_K = "attn_k"
    ATTN_V = "attn_v"
    ATTN_QKV = "attn_qkv"              # q, k, v rows in one weight (passes/fuse_attention.py; Phi-3 files)
    ATTN_Q_NORM = "attn_q_norm"        # RMSNorm weight [head_dim] of every q head (Qwen3, Gemma 3)
    ATTN_K_NORM = "attn_k_norm"
    ATTN_OUTPUT = "attn_output"
    ATTN_POST_NORM = "post_attention_norm"  # RMSNorm of the attention output before the residual add (Gemma 3)
    FFN_NORM = "ffn_norm"
    FFN_GATE = "ffn_gate"
    FFN_UP = "ffn_up"
    FFN_GATE_UP = "ffn_gate_up"        # gate rows, then up rows (passes/fuse_mlp.py)
    FFN_DOWN = "ffn_down"
    FFN_POST_NORM = "post_ffw_norm"    # RMSNorm of the MLP output before the residual add (Gemma 3)
    # A mixture-of-experts FFN (compiler/models/moe.py): the router and the experts stacked on a
    # leading expert dimension, as GGUF stores them ([E, out, in]).
    FFN_GATE_INP = "ffn_gate_inp"      # router [E, H]
    FFN_GATE_EXPS = "ffn_gate_exps"    # [E, I, H]
    FFN_UP_EXPS = "ffn_up_exps"        # [E, I, H]
    FFN_DOWN_EXPS = "ffn_down_exps"    # [E, H, I]
    FFN_GATE_UP_EXPS = "ffn_gate_up_exps"  # per expert its gate rows, then its up rows (passes/fuse_moe.py)
    FFN_GATE_INP_SHEXP = "ffn_gate_inp_shexp"  # the shared expert's gate [H] (Qwen2-MoE)
    FFN_GATE_SHEXP = "ffn_gate_shexp"  # the shared expert [Is, H], [Is, H], [H, Is]
    FFN_UP_SHEXP = "ffn_up_shexp"
    FFN_DOWN_SHEXP = "ffn_down_shexp"

    @property
    def per_layer(self) -> bool:
        return self not in _GLOBAL

    @property
    def is_norm(self) -> bool:
        """An RMSNorm weight (every kind whose GGUF name ends in ``norm``)."""
        return self.value.endswith("norm")


_GLOBAL = frozenset({Tensor.TOKEN_EMBD, Tensor.OUTPUT_NORM, Tensor.OUTPUT, Tensor.ROPE_FREQS,
                     Tensor.ROPE_FACTORS_LONG, Tensor.ROPE_FACTORS_SHORT})

# The Hugging Face names of the Llama layout ({i}: the layer); kinds absent here have none.
LLAMA_HF: Mapping[Tensor, str] = {
    Tensor.TOKEN_EMBD: "model.embed_tokens",
    Tensor.OUTPUT_NORM: "model.norm",
    Tensor.OUTPUT: "lm_head",
    Tensor.ATTN_NORM: "model.layers.{i}.input_layernorm",
    Tensor.ATTN_Q: "model.layers.{i}.self_attn.q_proj",
    Tensor.ATTN_K: "model.layers.{i}.self_attn.k_proj",
    Tensor.ATTN_V: "model.layers.{i}.self_attn.v_proj",
    Tensor.ATTN_Q_NORM: "model.layers.{i}.self_attn.q_norm",
    Tensor.ATTN_K_NORM: "model.layers.{i}.self_attn.k_norm",
    Tensor.ATTN_OUTPUT: "model.layers.{i}.self_attn.o_proj",
    Tensor.FFN_NORM: "model.layers.{i}.post_attention_layernorm",
    Tensor.FFN_GATE: "model.layers.{i}.mlp.gate_proj",
    Tensor.FFN_UP: "model.layers.{i}.mlp.up_proj",
    Tensor.FFN_DOWN: "model.layers.{i}.mlp.down_proj",
}


def name(kind: Tensor, layer: int | None = None, suffix: str = "weight") -> str:
    """The canonical (GGUF) name: ``blk.<layer>.<kind>.<suffix>``, or ``<kind>.<suffix>`` for a global."""
    if kind.per_layer != (layer is not None):
        raise ValueError(f"{kind.name} is {'a per-layer' if kind.per_layer else 'a global'} tensor (layer={layer})")
    return f"blk.{layer}.{kind.value}.{suffix}" if kind.per_layer else f"{kind.value}.{suffix}"


def hf_name(kind: Tensor, layer: int | None = None, suffix: str = "weight",
            table: Mapping[Tensor, str] = LLAMA_HF) -> str:
    """The Hugging Face name of a tensor in ``table``'s layout (``model.layers.3.self_attn.q_proj.weight``)."""
    return f"{table[kind].format(i=layer)}.{suffix}"


_CANONICAL = re.compile(r"(?:blk\.(?P<layer>\d+)\.)?(?P<kind>\w+?)\.(?P<suffix>weight|bias)")
_KINDS = {t.value: t for t in Tensor}


def parse(canonical: str) -> tuple[Tensor, int | None, str] | None:
    """``(kind, layer, suffix)`` of a canonical weight or bias name, or None when it names no known kind."""
    m = _CANONICAL.fullmatch(canonical)
    if m is None or m["kind"] not in _KINDS:
        return None
    kind, layer = _KINDS[m["kind"]], None if m["layer"] is None else int(m["layer"])
    return (kind, layer, m["suffix"]) if kind.per_layer == (layer is not None) else None


LM_HEAD = name(Tensor.OUTPUT)  # the LM head's name, also when it is tied to token_embd.weight

# Linears that read the same input as another: q/k/v (and their fusion), gate/up (and theirs).
_SAME_INPUT = {Tensor.ATTN_K: Tensor.ATTN_Q, Tensor.ATTN_V: Tensor.ATTN_Q, Tensor.ATTN_QKV: Tensor.ATTN_Q,
               Tensor.FFN_UP: Tensor.FFN_GATE, Tensor.FFN_GATE_UP: Tensor.FFN_GATE}


def input_key(weight: str) -> str:
    """The name that keys the calibration statistics of ``weight``'s input: the canonical name of
    the first linear reading that input (``blk.3.attn_qkv.weight`` -> ``blk.3.attn_q.weight``)."""
    parsed = parse(weight)
    if parsed is None or parsed[0] not in _SAME_INPUT:
        return weight
    kind, layer, suffix = parsed
    return name(_SAME_INPUT[kind], layer, suffix)


def expert_key(weight: str, expert: int) -> str:
    """The name that keys the calibration statistics of expert ``expert``'s slice of the stacked
    ``weight`` (``blk.3.ffn_gate_up_exps.weight[5]``): each expert sees its own tokens."""
    return f"{weight}[{expert}]"


# What a fused weight holds, rows in order (passes/fuse_attention.py, passes/fuse_mlp.py).
FUSED_PARTS: Mapping[Tensor, tuple[Tensor, ...]] = {
    Tensor.ATTN_QKV: (Tensor.ATTN_Q, Tensor.ATTN_K, Tensor.ATTN_V),
    Tensor.FFN_GATE_UP: (Tensor.FFN_GATE, Tensor.FFN_UP),
}


def parts(weight: str) -> tuple[str, ...]:
    """The canonical names of the weights whose rows ``weight`` holds, in order: ``blk.3.attn_qkv.weight``
    -> q, k, v of layer 3; any weight that is not a fusion -> itself."""
    parsed = parse(weight)
    if parsed is None or parsed[0] not in FUSED_PARTS:
        return (weight,)
    kind, layer, suffix = parsed
    return tuple(name(p, layer, suffix) for p in FUSED_PARTS[kind])
