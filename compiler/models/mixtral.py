"""Mixtral: the Llama block with a mixture of SwiGLU experts in place of its MLP (8 experts, 2 per
token, weights renormalised over the chosen two). llama.cpp stores it as ``llama`` with
``llama.expert_count`` set and the experts stacked (``blk.<i>.ffn_gate_exps.weight``);
Hugging Face checkpoints hold one tensor per expert (``block_sparse_moe.experts.<e>.w1``: gate,
``w3``: up, ``w2``: down), which the frontend stacks (``hf_stacked``). ``sliding_window``, when set
below the context, is Mistral's: one window on every layer.
"""

from __future__ import annotations

from grokc.compiler.models import moe
from grokc.compiler.models.architecture import Architecture
from grokc.compiler.models.hf_keys import every_layer_window
from grokc.compiler.models.llama import check_plain_block
from grokc.core.config import MoeConfig
from grokc.core.tensors import LLAMA_HF, Tensor

_MOE = "model.layers.{i}.block_sparse_moe"
HF_NAMES = {
    **LLAMA_HF,
    Tensor.FFN_GATE_INP: f"{_MOE}.gate",
    Tensor.FFN_GATE_EXPS: f"{_MOE}.experts.{{e}}.w1",
    Tensor.FFN_UP_EXPS: f"{_MOE}.experts.{{e}}.w3",
    Tensor.FFN_DOWN_EXPS: f"{_MOE}.experts.{{e}}.w2",
}


def _hf_config(raw: dict, where: str) -> dict:
    check_plain_block(raw, where, "Mixtral")
    return {**every_layer_window(raw, where),
            **moe.read_config(lambda: MoeConfig(int(raw["num_local_experts"]), int(raw["num_experts_per_tok"]),
                                                int(raw["intermediate_size"])), where, "Mixtral")}


def _gguf_config(key, tensor, where: str) -> dict:
    return moe.read_config(lambda: MoeConfig(int(key("expert_count")), int(key("expert_used_count")),
                                             int(key("feed_forward_length"))), where, "Mixtral")


ARCH = Architecture(
    name="mixtral",
    hf_model_types=("mixtral",),
    hf_classes=("MixtralForCausalLM",),
    gguf_arch="llama",
    gguf_moe=True,
    hf_names=HF_NAMES,
    hf_config=_hf_config,
    gguf_config=_gguf_config,
    config_tensors=(Tensor.ROPE_FREQS,),
    gguf_permutes_qk=True,
)
