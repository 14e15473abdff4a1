"""The Llama family (Llama 2/3.x, SmolLM, and every GGUF of ``general.architecture`` llama,
Mistral's included): the shared block with no variant, q/k rows permuted in GGUF files.

Config keys beyond the shared ones: ``attention_bias`` / ``mlp_bias`` and ``hidden_act`` are
refused unless they describe the plain block. Mistral checkpoints (``model_type`` mistral) are
``mistral.py``'s.
"""

from __future__ import annotations

from grokc.compiler.models.architecture import Architecture
from grokc.core.errors import UnsupportedModel
from grokc.core.tensors import Tensor


def check_plain_block(raw: dict, where: str, family: str) -> None:
    """Refuse biases and activations other than SiLU: the plain Llama block (Mistral's too)."""
    for flag in ("attention_bias", "mlp_bias"):
        if raw.get(flag):
            raise UnsupportedModel(f"{where} sets {flag}=true; the {family} graph has no biases, so only bias-free "
                                   f"{family} models are supported")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModel(f"{where} sets hidden_act {act!r}; only SiLU (SwiGLU) {family} MLPs are supported")


def _hf_config(raw: dict, where: str) -> dict:
    check_plain_block(raw, where, "Llama")
    return {}


ARCH = Architecture(
    name="llama",
    hf_model_types=("llama",),
    hf_classes=("LlamaForCausalLM",),
    gguf_arch="llama",
    hf_config=_hf_config,
    config_tensors=(Tensor.ROPE_FREQS,),
    gguf_permutes_qk=True,
)
