"""Writers of tiny model files (GGUF and Hugging Face folders) and shared inputs for the frontend tests.

The tiny models are random, 2 layers, hidden 64, 4 query / 2 KV heads: small enough to write in
milliseconds, shaped like a real Llama so every code path of the frontends runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import save_file

from grokc.compiler.frontends.gguf_tokenizer import bytes_to_unicode

# Strings every tokenizer test runs: prose, spaces, digits, punctuation, unicode, chat markup.
TEXTS = [
    "The capital of France is",
    "Hello, world! How are you doing today?",
    " leading space",
    "   three leading spaces and trailing   ",
    "\tTabs\tand\nnew\nlines\n\n\n",
    "Numbers: 0 7 42 2024 1234567890 3.14159 -17 1e-5",
    "Punctuation!?... (brackets) [square] {curly} <angle> @#$%^&*_+=|\\/~`'\"",
    "don't can't won't it's we're they've I'll I'd",
    "Unicode: café naïve Zürich 東京 日本語 Ελληνικά русский 한국어 🤖🚀 ∑∫√",
    "mixed\r\nline endings\rhere",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after end<|endoftext|>",
    "def f(x):\n    return x ** 2  # square\n",
    "",
    " ",
    "a" * 300,
]

TINY = dict(hidden=64, layers=2, heads=4, kv_heads=2, ff=128)


def tiny_tokenizer_metadata() -> dict[str, Any]:
    """A byte-level BPE vocabulary: the 256 byte characters, two merges, two control tokens."""
    tokens = ["<|end|>", "<|start|>"] + list(bytes_to_unicode().values()) + ["Ġt", "Ġth"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3] + [1] * (len(tokens) - 2),
        "tokenizer.ggml.merges": ["Ġ t", "Ġt h"],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 0,
        "tokenizer.chat_template": "{{ messages }}",
    }


def add_kv(writer: gguf.GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, list) and value and isinstance(value[0], int):
        writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    else:
        writer.add_array(key, value)


def tiny_gguf_tensors(vocab: int, tied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """GGUF-named random fp32 weights, ``[out, in]`` as numpy lays them out."""
    h, ff, hd = TINY["hidden"], TINY["ff"], TINY["hidden"] // TINY["heads"]
    rng = np.random.default_rng(seed)
    t = {"token_embd.weight": rng.standard_normal((vocab, h)), "output_norm.weight": rng.standard_normal(h)}
    if not tied:
        t["output.weight"] = rng.standard_normal((vocab, h))
    for i in range(TINY["layers"]):
        t |= {
            f"blk.{i}.attn_norm.weight": rng.standard_normal(h),
            f"blk.{i}.attn_q.weight": rng.standard_normal((TINY["heads"] * hd, h)),
            f"blk.{i}.attn_k.weight": rng.standard_normal((TINY["kv_heads"] * hd, h)),
            f"blk.{i}.attn_v.weight": rng.standard_normal((TINY["kv_heads"] * hd, h)),
            f"blk.{i}.attn_output.weight": rng.standard_normal((h, TINY["heads"] * hd)),
            f"blk.{i}.ffn_norm.weight": rng.standard_normal(h),
            f"blk.{i}.ffn_gate.weight": rng.standard_normal((ff, h)),
            f"blk.{i}.ffn_up.weight": rng.standard_normal((ff, h)),
            f"blk.{i}.ffn_down.weight": rng.standard_normal((h, ff)),
        }
    return {k: v.astype(np.float32) for k, v in t.items()}


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "llama",
    tied: bool = True,
    drop: tuple[str, ...] = (),
    extra_tensors: dict[str, np.ndarray] | None = None,
    metadata: dict[str, Any] | None = None,
    tokenizer: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random Llama GGUF: linears Q8_0, embeddings F16, norms F32."""
    tok = tokenizer if tokenizer is not None else tiny_tokenizer_metadata()
    vocab = len(tok["tokenizer.ggml.tokens"])
    writer = gguf.GGUFWriter(str(path), arch)
    kv = {
        f"{arch}.block_count": TINY["layers"],
        f"{arch}.context_length": 256,
        f"{arch}.embedding_length": TINY["hidden"],
        f"{arch}.feed_forward_length": TINY["ff"],
        f"{arch}.attention.head_count": TINY["heads"],
        f"{arch}.attention.head_count_kv": TINY["kv_heads"],
        f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.rope.dimension_count": TINY["hidden"] // TINY["heads"],
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{arch}.vocab_size": vocab,
        **tok,
        **(metadata or {}),
    }
    for key, value in kv.items():
        if value is not None:
            add_kv(writer, key, value)
    tensors = tiny_gguf_tensors(vocab, tied) | (extra_tensors or {})
    for name, arr in tensors.items():
        if name in drop:
            continue
        if arr.ndim == 2 and name != "token_embd.weight":
            writer.add_tensor(name, gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif arr.ndim == 2:
            writer.add_tensor(name, arr.astype(np.float16))
        else:
            writer.add_tensor(name, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_hf_config(**overrides: Any) -> dict[str, Any]:
    h, heads = TINY["hidden"], TINY["heads"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": TINY["ff"],
        "num_hidden_layers": TINY["layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": TINY["kv_heads"],
        "head_dim": h // heads,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256,
        "vocab_size": 260,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "bos_token_id": 1,
        "eos_token_id": 0,
        "hidden_act": "silu",
    }
    return {k: v for k, v in (config | overrides).items() if v is not None}


def write_tiny_hf(
    folder: Path,
    *,
    config: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    extra_tensors: dict[str, torch.Tensor] | None = None,
    dtype: torch.dtype = torch.float32,
    tokenizer: bool = True,
) -> Path:
    """Write a tiny random Llama as a Hugging Face folder (HF tensor names, ``dtype`` safetensors)."""
    from grokc.compiler.frontends.gguf_tokenizer import build_tokenizer_json

    folder.mkdir(parents=True, exist_ok=True)
    cfg = config if config is not None else tiny_hf_config()
    (folder / "config.json").write_text(json.dumps(cfg))
    if tokenizer:
        (folder / "tokenizer.json").write_text(build_tokenizer_json(tiny_tokenizer_metadata()))
        (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ hf }}"}))
    g = torch.Generator().manual_seed(0)
    h, ff, hd, v = TINY["hidden"], TINY["ff"], TINY["hidden"] // TINY["heads"], cfg.get("vocab_size", 260)
    t = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(TINY["layers"]):
        p = f"model.layers.{i}."
        t |= {
            p + "self_attn.q_proj.weight": (TINY["heads"] * hd, h),
            p + "self_attn.k_proj.weight": (TINY["kv_heads"] * hd, h),
            p + "self_attn.v_proj.weight": (TINY["kv_heads"] * hd, h),
            p + "self_attn.o_proj.weight": (h, TINY["heads"] * hd),
            p + "mlp.gate_proj.weight": (ff, h),
            p + "mlp.up_proj.weight": (ff, h),
            p + "mlp.down_proj.weight": (h, ff),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    tensors = {k: torch.randn(s, generator=g).to(dtype) for k, s in t.items() if k not in drop}
    save_file(tensors | (extra_tensors or {}), str(folder / "model.safetensors"))
    return folder
