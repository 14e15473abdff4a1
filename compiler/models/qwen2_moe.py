"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): the Llama block with many small SwiGLU experts
(``moe_intermediate_size``), top-k weights as softmax probabilities over all experts without
renormalisation unless ``norm_topk_prob``, and a shared expert every token uses
(``shared_expert_intermediate_size``) scaled by ``sigmoid(x . shared_expert_gate)``.

Hugging Face checkpoints hold one tensor per expert (``mlp.experts.<e>.gate_proj``), which the
frontend stacks (``hf_stacked``). The attention is Qwen2's (``qwen2.py``): q/k/v biases when
``qkv_bias`` (on by default and in the published checkpoints), its sliding-window rule. Not
handled, refused by ``_hf_config``: dense layers between the sparse ones (``decoder_sparse_step`` > 1,
``mlp_only_layers``).

GGUF files (``general.architecture`` qwen2moe, ``convert_hf_to_gguf.py``'s ``Qwen2MoeModel``) stack
the experts (``ffn_{gate,up,down}_exps``), name the shared expert ``ffn_*_shexp`` and its gate
``ffn_gate_inp_shexp`` [1, H], and carry ``expert_feed_forward_length`` /
``expert_shared_feed_forward_length``; their q/k rows are not permuted and the q/k/v biases are always
there. llama.cpp's qwen2moe graph does not renormalise the top-k weights; ``expert_weights_norm``,
where a file sets it, says otherwise.
"""

from __future__ import annotations

from grokc.compiler.models import moe
from grokc.compiler.models.architecture import Architecture
from grokc.compiler.models.qwen2 import check_silu, qwen_window
from grokc.core.config import MoeConfig
from grokc.core.tensors import LLAMA_HF, Tensor

_MLP = "model.layers.{i}.mlp"
ROUTED_HF = {   # the router and the experts, as Qwen2-MoE and Qwen3-MoE checkpoints name them
    Tensor.FFN_GATE_INP: f"{_MLP}.gate",
    Tensor.FFN_GATE_EXPS: f"{_MLP}.experts.{{e}}.gate_proj",
    Tensor.FFN_UP_EXPS: f"{_MLP}.experts.{{e}}.up_proj",
    Tensor.FFN_DOWN_EXPS: f"{_MLP}.experts.{{e}}.down_proj",
}
HF_NAMES = {
    **LLAMA_HF,
    **ROUTED_HF,
    Tensor.FFN_GATE_SHEXP: f"{_MLP}.shared_expert.gate_proj",
    Tensor.FFN_UP_SHEXP: f"{_MLP}.shared_expert.up_proj",
    Tensor.FFN_DOWN_SHEXP: f"{_MLP}.shared_expert.down_proj",
    Tensor.FFN_GATE_INP_SHEXP: f"{_MLP}.shared_expert_gate",
}


def _hf_config(raw: dict, where: str) -> dict:
    moe.refuse_dense_layers(raw, where)
    check_silu(raw, where)
    return {"qkv_bias": bool(raw.get("qkv_bias", True)), **qwen_window(raw, where), **moe.read_config(lambda: MoeConfig(
        int(raw["num_experts"]), int(raw["num_experts_per_tok"]), int(raw["moe_intermediate_size"]),
        norm_top_k=bool(raw.get("norm_topk_prob", False)), shared_size=int(raw["shared_expert_intermediate_size"]),
        shared_gate=True), where, "Qwen2-MoE")}


def gguf_moe_config(key, where: str, family: str, norm_top_k: bool, shared: bool) -> dict:
    """``{"moe": ...}`` of a llama.cpp Qwen-MoE file: ``norm_top_k`` is the family graph's default when
    the file has no ``expert_weights_norm``; ``shared``: a gated shared expert of
    ``expert_shared_feed_forward_length``."""
    return moe.read_config(lambda: MoeConfig(
        int(key("expert_count")), int(key("expert_used_count")), int(key("expert_feed_forward_length")),
        norm_top_k=bool(key("expert_weights_norm", norm_top_k)),
        shared_size=int(key("expert_shared_feed_forward_length")) if shared else 0, shared_gate=shared), where, family)


ARCH = Architecture(
    name="qwen2_moe",
    hf_model_types=("qwen2_moe",),
    hf_classes=("Qwen2MoeForCausalLM",),
    gguf_arch="qwen2moe",
    gguf_moe=True,
    hf_names=HF_NAMES,
    hf_config=_hf_config,
    gguf_config=lambda key, tensor, where: {"qkv_bias": True, **gguf_moe_config(key, where, "Qwen2-MoE", False, True)},
)
