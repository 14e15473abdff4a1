"""A Hugging Face ``tokenizer.json`` rebuilt from a GGUF file's tokenizer metadata.

A GGUF carries no ``tokenizer.json``: the vocabulary, merges, token types and special ids sit in
metadata under llama.cpp's keys (``tokenizer.ggml.*``). This module turns them back into the
tokenizer ``transformers.AutoTokenizer.from_pretrained(dir, gguf_file=name)`` builds, so grokc
tokenizes exactly like the reference it is tested against. That tokenizer, for
``tokenizer.ggml.model == "gpt2"``, is:

- model: byte-level BPE over the file's tokens and merges; a token written outside the GPT-2 byte
  alphabet is respelled through its UTF-8 bytes (``bytes_to_unicode``);
- pre-tokenizer: ``ByteLevel(add_prefix_space=False)`` with GPT-2's own split regex, unless
  ``tokenizer.ggml.pre`` names a split transformers knows (Llama 3's ``llama-bpe``, Mistral's
  ``tekken``, ...), which then runs first. Other ``pre`` values (SmolLM2's ``smollm``) fall back to
  the GPT-2 regex, as in transformers -- not necessarily as in llama.cpp;
- decoder: ``ByteLevel``;
- added tokens: every CONTROL token (token type 3) spelled in the byte alphabet, and the bos/eos/
  unk/pad tokens, as special tokens; USER_DEFINED tokens (type 4) as plain added tokens;
- post-processor: a template that prepends bos / appends eos when ``tokenizer.ggml.add_bos_token``
  / ``add_eos_token`` say so (nothing otherwise).

Only ``gpt2`` (byte-level BPE) vocabularies are supported; SentencePiece (``llama``) files are
refused with ``UnsupportedModel``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from grokc.core.errors import UnsupportedModel

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# The split regexes transformers runs before ByteLevel for these `tokenizer.ggml.pre` values
# (transformers.integrations.gguf.gguf_tokenizer_mapping), restricted to Llama-architecture files.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "pixtral": _LLAMA3_SPLIT,
    "tekken": _TEKKEN_SPLIT,
    "llama4": _GPT4O_SPLIT,
    "gpt-4o": _GPT4O_SPLIT,
}

_SPECIAL_ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character (the byte-level alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def build_tokenizer_json(metadata: Mapping[str, Any]) -> str:
    """The ``tokenizer.json`` text for the tokenizer described by GGUF metadata.

    Parameters
    ----------
    metadata
        The GGUF key/value metadata, values already decoded to Python (strings, ints, lists).

    Returns
    -------
    str
        A ``tokenizers`` serialization, loadable with ``tokenizers.Tokenizer.from_str``.

    Raises
    ------
    UnsupportedModel
        The vocabulary is not byte-level BPE, tokens/merges are missing, or the ``tokenizers``
        library refuses what they describe (merges of unknown tokens, special ids past the vocabulary).
    """
    try:
        return _build_tokenizer_json(metadata)
    except UnsupportedModel:
        raise
    except Exception as exc:  # the tokenizers library raises its own exception types on a bad vocabulary
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise UnsupportedModel(f"GGUF tokenizer metadata does not describe a usable tokenizer ({detail}); "
                               "re-export the file") from None


def _build_tokenizer_json(metadata: Mapping[str, Any]) -> str:
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedModel(
            f"GGUF tokenizer.ggml.model is {kind!r}, but grokc only rebuilds byte-level BPE ('gpt2') "
            "tokenizers; convert the model with a byte-level BPE tokenizer or load its Hugging Face folder"
        )
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        if key not in metadata:
            raise UnsupportedModel(f"GGUF metadata has no {key!r}, so its tokenizer cannot be rebuilt; re-export the file")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    token_types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or ())

    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())

    def respell(token: str) -> str:
        if set(token) <= alphabet:
            return token
        return "".join(spelling[b] for b in token.encode("utf-8"))

    vocab = {respell(token): index for index, token in enumerate(tokens)}
    merges = [tuple(merge.split(" ")) for merge in metadata["tokenizer.ggml.merges"]]
    tok = Tokenizer(
        models.BPE(
            vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False
        )
    )
    split = PRE_TOKENIZER_SPLITS.get(metadata.get("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    tok.decoder = decoders.ByteLevel()

    # Special tokens: the bos/eos/unk/pad tokens, then every CONTROL token. One written outside the
    # byte alphabet is a llama.cpp mislabel that transformers skips (adding it would grow the vocab).
    special_ids = [metadata[f"tokenizer.ggml.{k}"] for k in _SPECIAL_ID_KEYS if f"tokenizer.ggml.{k}" in metadata]
    special = [tokens[i] for i in special_ids if 0 <= i < len(tokens)]
    special += [
        token
        for token, token_type in zip(tokens, token_types)
        if token_type == TOKEN_TYPE_CONTROL and set(token) <= alphabet
    ]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in dict.fromkeys(special)])
    user_defined = [
        AddedToken(token, normalized=False, special=False)
        for token, token_type in zip(tokens, token_types)
        if token_type == TOKEN_TYPE_USER_DEFINED and token in vocab
    ]
    if user_defined:
        tok.add_tokens(user_defined)

    tok.post_processor = _post_processor(metadata, tokens)
    return tok.to_str()


def _post_processor(metadata: Mapping[str, Any], tokens: list[str]) -> processors.TemplateProcessing:
    """Prepend bos / append eos when the file asks for it (the shape transformers gives it)."""
    parts: dict[str, tuple[str, int] | None] = {}
    for side, flag, key in (("bos", "add_bos_token", "bos_token_id"), ("eos", "add_eos_token", "eos_token_id")):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        wanted = bool(metadata.get(f"tokenizer.ggml.{flag}", False))
        parts[side] = (tokens[token_id], token_id) if wanted and token_id is not None else None
    bos, eos = parts["bos"], parts["eos"]
    single = f"{bos[0] + ':0 ' if bos else ''}$A:0{' ' + eos[0] + ':0' if eos else ''}"
    pair = f"{single}{' ' + bos[0] + ':1' if bos else ''} $B:1{' ' + eos[0] + ':1' if eos else ''}"
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=[p for p in (bos, eos) if p])
