"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): the Llama block with many small SwiGLU experts
(``moe_intermediate_size``), top-k weights as softmax probabilities over all experts without
renormalisation unless ``norm_topk_prob``, and a shared expert every token uses
(``shared_expert_intermediate_size``) scaled by ``sigmoid(x . shared_expert_gate)``.

Hugging Face checkpoints hold one tensor per expert (``mlp.experts.<e>.gate_proj``), which the
frontend stacks (``hf_stacked``). The attention is Qwen2's (``qwen2.py``): q/k/v biases when
``qkv_bias`` (on by default and in the published checkpoints), its sliding-window rule. Not
handled, refused by ``_hf_config``: dense layers between the sparse ones (``decoder_sparse_step`` > 1,
``mlp_only_layers``). No GGUF form yet (llama.cpp's ``qwen2moe``).
"""

from __future__ import annotations

from grokc.compiler.models import moe
from grokc.compiler.models.architecture import Architecture
from grokc.compiler.models.qwen2 import check_silu, qwen_window
from grokc.core.config import MoeConfig
from grokc.core.errors import UnsupportedModel
from grokc.core.tensors import LLAMA_HF, Tensor

_MLP = "model.layers.{i}.mlp"
HF_NAMES = {
    **LLAMA_HF,
    Tensor.FFN_GATE_INP: f"{_MLP}.gate",
    Tensor.FFN_GATE_EXPS: f"{_MLP}.experts.{{e}}.gate_proj",
    Tensor.FFN_UP_EXPS: f"{_MLP}.experts.{{e}}.up_proj",
    Tensor.FFN_DOWN_EXPS: f"{_MLP}.experts.{{e}}.down_proj",
    Tensor.FFN_GATE_SHEXP: f"{_MLP}.shared_expert.gate_proj",
    Tensor.FFN_UP_SHEXP: f"{_MLP}.shared_expert.up_proj",
    Tensor.FFN_DOWN_SHEXP: f"{_MLP}.shared_expert.down_proj",
    Tensor.FFN_GATE_INP_SHEXP: f"{_MLP}.shared_expert_gate",
}


def _hf_config(raw: dict, where: str) -> dict:
    if int(raw.get("decoder_sparse_step", 1)) != 1 or raw.get("mlp_only_layers"):
        raise UnsupportedModel(f"{where} mixes dense and sparse layers (decoder_sparse_step "
                               f"{raw.get('decoder_sparse_step', 1)}, mlp_only_layers {raw.get('mlp_only_layers')}); "
                               "only models whose every layer is a mixture of experts are supported")
    check_silu(raw, where)
    return {"qkv_bias": bool(raw.get("qkv_bias", True)), **qwen_window(raw, where), **moe.read_config(lambda: MoeConfig(
        int(raw["num_experts"]), int(raw["num_experts_per_tok"]), int(raw["moe_intermediate_size"]),
        norm_top_k=bool(raw.get("norm_topk_prob", False)), shared_size=int(raw["shared_expert_intermediate_size"]),
        shared_gate=True), where, "Qwen2-MoE")}


ARCH = Architecture(
    name="qwen2_moe",
    hf_model_types=("qwen2_moe",),
    hf_classes=("Qwen2MoeForCausalLM",),
    gguf_arch=None,
    hf_names=HF_NAMES,
    hf_config=_hf_config,
)
