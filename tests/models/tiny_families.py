"""Tiny random models of every family, made with transformers' own config classes, saved as Hugging
Face folders and written as GGUF (``gguf_writer.py``).

Shapes are shared where the family allows (hidden 64, MLP 128, 4 query / 2 KV heads, vocabulary
300), so the builds of different families compile the same kernels. Weights are drawn with
``initializer_range`` 0.08 and the norms moved away from their defaults (``1 + 0.3 N(0, 1)``;
Gemma's ``0.3 N(0, 1)``, its weights being offsets from 1), biases ``0.1 N(0, 1)``: a wrong norm or
a dropped bias changes the logits by far more than the tolerances.

Family specifics: ``qwen2`` q/k/v biases, tied; ``qwen3`` head_dim 32 (not 64 / 4), q/k norms;
``mistral`` a window of 6 on both layers; ``gemma3`` 6 layers (5 local with a window of 5, then 1
global), head_dim 32, bases 1e4 / 1e6, tied, GeGLU, the four norms; ``phi3`` fused q/k/v and
gate/up; ``phi3_longrope`` longrope with ``original_max_position_embeddings`` 16 (of 128) and 8
distinct factors each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from gguf_writer import write_gguf
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIALS = ["<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>"]
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["The quick brown fox jumps over the lazy dog. " * 3, "def fibonacci(n):\n    return n if n < 2 else n",
          "Once upon a time there was a tiny model that compiled ahead of time.", "Paris is the capital of France.",
          "café naïve 東京 12345 \t tabs   spaces\n\nnewlines"]
BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            initializer_range=0.08, rms_norm_eps=1e-5, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
            eos_token_id=2)
FAMILIES = ("qwen2", "qwen3", "mistral", "gemma3", "phi3", "phi3_longrope")


def tokenizer(family: str):
    """A byte-level BPE of 300 tokens trained on ``CORPUS`` (Qwen's split regex for Qwen, GPT-2's
    otherwise), with a ChatML template; bos is prepended except for Qwen."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if family.startswith("qwen"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    add_bos = not family.startswith("qwen")
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                           special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   add_bos_token=add_bos, chat_template=CHAT)


def config(family: str, vocab: int, **overrides):
    """The transformers config of a tiny ``family`` model."""
    import transformers as t

    c = dict(BASE, vocab_size=vocab)
    if family == "qwen2":
        return t.Qwen2Config(**c, rope_theta=1e6, tie_word_embeddings=True, **overrides)
    if family == "qwen3":
        return t.Qwen3Config(**c, head_dim=32, rope_theta=1e6, tie_word_embeddings=True, **overrides)
    if family == "mistral":
        return t.MistralConfig(**c, rope_theta=1e6, sliding_window=6, tie_word_embeddings=False, **overrides)
    if family == "gemma3":
        c.update(num_hidden_layers=6, head_dim=32)
        return t.Gemma3TextConfig(**{**dict(c, sliding_window=5, query_pre_attn_scalar=32, rope_theta=1e6,
                                            rope_local_base_freq=1e4, hidden_activation="gelu_pytorch_tanh",
                                            tie_word_embeddings=True), **overrides})
    if family == "phi3":
        return t.Phi3Config(**c, rope_theta=1e4, tie_word_embeddings=False, **overrides)
    if family == "phi3_longrope":
        half = 64 // 4 // 2
        rope = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0 + 0.1 * i for i in range(half)],
                "long_factor": [1.0 + 0.9 * i for i in range(half)]}
        return t.Phi3Config(**{**dict(c, max_position_embeddings=128, original_max_position_embeddings=16,
                                      rope_parameters=rope, tie_word_embeddings=False), **overrides})
    raise KeyError(family)


def randomise(model, family: str, seed: int = 1) -> None:
    """Move norm weights and biases away from their initial values (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((0.0 if family == "gemma3" else 1.0) + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def hf_model(family: str, **overrides):
    """A random fp32 transformers model of ``family`` (seeded) and its tokenizer."""
    import transformers

    tok = tokenizer(family)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config(family, len(tok), **overrides),
                                                          dtype=torch.float32).eval()
    randomise(model, family)
    return model, tok


@dataclass(frozen=True)
class TinyFamily:
    name: str
    hf: Path      # the Hugging Face folder
    gguf: Path    # the same model as llama.cpp's converter writes it


def write_family(family: str, root: Path) -> TinyFamily:
    """Save ``hf_model(family)`` under ``root/family`` as a folder and as a GGUF."""
    model, tok = hf_model(family)
    folder = root / family / "hf"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return TinyFamily(family, folder, write_gguf(folder, root / family / f"{family}.gguf"))


@torch.no_grad()
def cached_logits(model, ids: list[int]):
    """transformers' logits (numpy ``[len(ids), vocab]``) after each token, fed one token at a time
    with its KV cache, as ``generate`` runs (and as grokc decodes)."""
    import numpy as np

    out, cache = [], None
    for i, t in enumerate(ids):
        r = model(torch.tensor([[t]]), cache=cache, use_cache=True, position_ids=torch.tensor([[i]]))
        out.append(r.logits[0, -1].numpy())
        cache = r.cache
    return np.stack(out)
