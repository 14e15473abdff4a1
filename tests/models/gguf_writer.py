"""An F32 GGUF of a Hugging Face folder, written the way llama.cpp's ``convert_hf_to_gguf.py`` does it
(its ``conversion/{llama,qwen,gemma,phi}.py``), for the family tests: grokc's GGUF frontend must read
back what the converter would have written.

    HF model_type   general.architecture   what the converter does to the tensors
    llama, mistral  llama                  q/k rows permuted (LlamaModel.permute); no window key
    qwen2           qwen2                  none (q/k/v biases as attn_{q,k,v}.bias)
    qwen3           qwen3                  none (q_norm/k_norm -> attn_{q,k}_norm)
    gemma3_text     gemma3                 every ``*norm.weight`` stored as 1 + w (Gemma3Model.norm_shift);
                                           lm_head dropped (tied)
    phi3            phi3                   none: qkv_proj -> attn_qkv, gate_up_proj -> ffn_up;
                                           longrope factors -> rope_factors_{long,short}.weight

Metadata as each converter writes it (``key_length`` only when the config has ``head_dim``; Gemma 3
no ``query_pre_attn_scalar``, pattern or local base; Phi-3 ``rope.scaling.original_context_length``,
``attention.sliding_window`` (0 for none) and, for longrope, ``rope.scaling.attn_factor``). The
tokenizer: a byte-level BPE ``tokenizer.json`` (tokens and types here, then merges, special ids,
add_bos and the chat template through ``gguf.SpecialVocab``, as ``_set_vocab_gpt2`` does).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

ARCH = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "mistral": gguf.MODEL_ARCH.LLAMA,  # llama.cpp registers MistralForCausalLM under LlamaModel
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
    "gemma3_text": gguf.MODEL_ARCH.GEMMA3,
    "phi3": gguf.MODEL_ARCH.PHI3,
}
PRE = {"qwen2": "qwen2", "qwen3": "qwen2"}   # tokenizer.ggml.pre llama.cpp picks for these tokenizers


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF rotate-half rows -> GGML interleaved-pair rows, per head."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope(cfg: dict) -> dict:
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    return rp.get("full_attention", rp)


def _metadata(w: gguf.GGUFWriter, cfg: dict, model_type: str, name: str) -> None:
    n_head = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    rp = _rope(cfg)
    w.add_name(name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(cfg.get("num_key_value_heads") or n_head)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if cfg.get("head_dim") is not None:  # TextModel.set_gguf_parameters
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if model_type in ("llama", "mistral"):  # LlamaModel.set_gguf_parameters
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(head_dim)
    if model_type == "gemma3_text":  # Gemma3Model.set_gguf_parameters
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])
    if model_type == "phi3":  # Phi3MiniModel.set_gguf_parameters / generate_extra_tensors
        orig = cfg.get("original_max_position_embeddings", rp.get("original_max_position_embeddings"))
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_rope_dimension_count(int(rp.get("partial_rotary_factor", 1.0) * cfg["hidden_size"]) // n_head)
        w.add_sliding_window(cfg.get("sliding_window") or 0)
        if rp.get("long_factor"):
            scale = cfg["max_position_embeddings"] / orig
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)


def _tokenizer(w: gguf.GGUFWriter, model_dir: Path, model_type: str, vocab_size: int) -> None:
    tj = json.loads((model_dir / "tokenizer.json").read_text())
    assert tj["model"]["type"] == "BPE", "only byte-level BPE tokenizers are written"
    vocab = dict(tj["model"]["vocab"])
    added = {t["id"]: t for t in tj["added_tokens"]}
    for t in added.values():
        vocab[t["content"]] = t["id"]
    rev = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(vocab_size):  # get_vocab_base: the table padded to the model's vocab_size
        if i not in rev:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(rev[i])
            types.append(gguf.TokenType.CONTROL if i in added and added[i]["special"] else
                         gguf.TokenType.USER_DEFINED if i in added else gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(PRE.get(model_type, "default"))
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=len(tokens)).add_to_gguf(w)


def write_gguf(model_dir: str | Path, out: str | Path) -> Path:
    """Write ``model_dir`` (config.json, model.safetensors, tokenizer.json) as the GGUF ``out``."""
    model_dir, out = Path(model_dir), Path(out)
    cfg = json.loads((model_dir / "config.json").read_text())
    model_type = cfg["model_type"]
    arch = ARCH[model_type]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    names = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    w = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[arch])
    _metadata(w, cfg, model_type, f"tiny {model_dir.parent.name}")   # not "mistral": transformers would try that arch
    _tokenizer(w, model_dir, model_type, cfg["vocab_size"])
    tensors = load_file(model_dir / "model.safetensors")
    for hf in sorted(tensors):
        data = tensors[hf].astype(np.float32)
        if model_type == "gemma3_text" and hf == "lm_head.weight":
            continue
        if model_type in ("llama", "mistral"):
            if hf.endswith(("q_proj.weight", "q_proj.bias")):
                data = permute(data, n_head, n_head)
            elif hf.endswith(("k_proj.weight", "k_proj.bias")):
                data = permute(data, n_head, n_kv)
        if model_type == "gemma3_text" and hf.endswith("norm.weight"):
            data = data + 1.0
        base, suffix = hf.rsplit(".", 1)
        name = names.get_name(base)
        assert name is not None, f"no GGUF name for {hf!r}"
        w.add_tensor(f"{name}.{suffix}", np.ascontiguousarray(data))
    rp = _rope(cfg)
    if model_type == "phi3" and rp.get("long_factor"):
        for kind, key in ((gguf.MODEL_TENSOR.ROPE_FACTORS_LONG, "long_factor"),
                          (gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT, "short_factor")):
            w.add_tensor(gguf.TENSOR_NAMES[kind] + ".weight", np.asarray(rp[key], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
