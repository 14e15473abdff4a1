"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (an RMSNorm over each q and k head
before RoPE, an explicit ``head_dim``, optional q/k/v biases) with many small SwiGLU experts in place
of the MLP (``moe_intermediate_size``), top-k softmax weights renormalised over the chosen ones when
``norm_topk_prob`` (set in the published models), and no shared expert.

Hugging Face checkpoints name the router and the experts as Qwen2-MoE's do (``qwen2_moe.ROUTED_HF``,
one tensor per expert, stacked by the frontend). The expert count is ``num_experts`` (the published configs) or ``num_local_experts`` (what
transformers 5 saves, its ``attribute_map`` alias). ``head_dim`` defaults to hidden / heads as in
``Qwen3MoeAttention`` (the published configs set it); ``use_sliding_window`` puts ``sliding_window``
on every layer, as ``Qwen3MoeConfig`` does. Refused: dense layers between the sparse ones
(``decoder_sparse_step`` > 1, ``mlp_only_layers``), which transformers builds as plain MLPs.

GGUF files (``general.architecture`` qwen3moe, ``convert_hf_to_gguf.py``'s ``Qwen3MoeModel``) stack
the experts (``ffn_{gate,up,down}_exps``) and carry ``attention.key_length``,
``blk.N.attn_{q,k}_norm`` and ``expert_feed_forward_length``; their q/k rows are not permuted.
llama.cpp's qwen3moe graph renormalises the top-k weights; ``expert_weights_norm``, where a file sets
it, says otherwise.
"""

from __future__ import annotations

from typing import Any

from grokc.compiler.models import moe
from grokc.compiler.models.architecture import Architecture
from grokc.compiler.models.hf_keys import every_layer_window
from grokc.compiler.models.qwen2 import check_silu
from grokc.compiler.models.qwen2_moe import ROUTED_HF, gguf_moe_config
from grokc.core.config import MoeConfig
from grokc.core.tensors import LLAMA_HF


def _hf_config(raw: dict[str, Any], where: str) -> dict[str, Any]:
    moe.refuse_dense_layers(raw, where)
    check_silu(raw, where)
    window = raw.get("sliding_window") if raw.get("use_sliding_window") else None
    return {"qk_norm": True, "qkv_bias": bool(raw.get("attention_bias", False)),
            "head_dim": int(raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]),
            **every_layer_window({**raw, "sliding_window": window}, where),
            **moe.read_config(lambda: MoeConfig(int(raw.get("num_experts") or raw["num_local_experts"]),
                                                int(raw["num_experts_per_tok"]),
                                                int(raw["moe_intermediate_size"]),
                                                norm_top_k=bool(raw.get("norm_topk_prob", False))),
                              where, "Qwen3-MoE")}


ARCH = Architecture(
    name="qwen3_moe",
    hf_model_types=("qwen3_moe",),
    hf_classes=("Qwen3MoeForCausalLM",),
    gguf_arch="qwen3moe",
    gguf_moe=True,
    hf_names={**LLAMA_HF, **ROUTED_HF},
    hf_config=_hf_config,
    gguf_config=lambda key, tensor, where: {"qk_norm": True, **gguf_moe_config(key, where, "Qwen3-MoE", True, False)},
)
