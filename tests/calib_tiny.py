"""The tiny random Llama of ``tiny_llama`` with a byte-level tokenizer, so that prose (the pydoc
calibration and evaluation text) becomes varied token ids instead of one unknown word."""

from __future__ import annotations

from dataclasses import replace

from tiny_llama import tiny_loaded
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from grokc.compiler.frontends import LoadedModel
from grokc.compiler.frontends.gguf_tokenizer import bytes_to_unicode


def byte_tokenizer_json() -> str:
    """256 tokens, one per byte (GPT-2's byte-to-unicode characters), no merges."""
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


def byte_loaded(seed: int = 0) -> LoadedModel:
    return replace(tiny_loaded(seed=seed), tokenizer_json=byte_tokenizer_json(), source_sha256=f"tiny-bytes-{seed}")
