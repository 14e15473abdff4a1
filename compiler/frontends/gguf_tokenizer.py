"""A Hugging Face ``tokenizer.json`` rebuilt from a GGUF file's tokenizer metadata.

A GGUF carries no ``tokenizer.json``: the vocabulary, merges, token types and special ids sit in
metadata under llama.cpp's keys (``tokenizer.ggml.*``). This module turns them back into the
tokenizer ``transformers.AutoTokenizer.from_pretrained(dir, gguf_file=name)`` builds, so grokc
tokenizes exactly like the reference it is tested against. That tokenizer, for
``tokenizer.ggml.model == "gpt2"`` (byte-level BPE), is:

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

For ``tokenizer.ggml.model == "llama"`` (a SentencePiece vocabulary: tokens, scores, token types,
``<0xNN>`` byte tokens) it is a BPE with byte fallback whose merges are the file's, or, when it has
none, every split of a token into two tokens, ordered by the token's score (its position in the
file for Gemma, whose scores do not follow the merge order), as transformers' ``generate_merges``
derives them; the text handling is the family's (``Architecture.gguf_sentencepiece``):

- ``LLAMA``: a ``Metaspace`` pre-tokenizer prepending "▁" (``LlamaTokenizer``);
- ``GEMMA``: spaces become "▁" with no prefix; tokens of spaces only are respelled as "▁"s first
  (``GemmaTokenizer``; llama.cpp writes them as real spaces);
- ``PHI3``: a normalizer prepending "▁" and turning spaces into "▁";

decoder ``Replace("▁", " ")``, ``ByteFallback``, ``Fuse`` (and, with a prefix, one leading space
stripped); CONTROL tokens and bos/eos/unk/pad special, USER_DEFINED ones plain added tokens; bos
prepended unless ``add_bos_token`` is false. Other tokenizer models are refused with
``UnsupportedModel``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from grokc.compiler.models.architecture import SentencePiece
from grokc.core.errors import UnsupportedModel

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# The split regexes transformers runs before ByteLevel for these `tokenizer.ggml.pre` values
# (transformers.integrations.gguf.gguf_tokenizer_mapping).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (  # transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX: one digit per piece
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
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
    "qwen2": _QWEN2_SPLIT,
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


def build_tokenizer_json(metadata: Mapping[str, Any], sentencepiece: SentencePiece = SentencePiece.LLAMA) -> str:
    """The ``tokenizer.json`` text for the tokenizer described by GGUF metadata.

    Parameters
    ----------
    metadata
        The GGUF key/value metadata, values already decoded to Python (strings, ints, lists).
    sentencepiece
        How the architecture's SentencePiece vocabularies handle text (``tokenizer.ggml.model`` llama).

    Returns
    -------
    str
        A ``tokenizers`` serialization, loadable with ``tokenizers.Tokenizer.from_str``.

    Raises
    ------
    UnsupportedModel
        The vocabulary is neither byte-level BPE nor SentencePiece, its tokens (merges, scores) are missing,
        or the ``tokenizers`` library refuses what they describe (merges of unknown tokens, special ids
        past the vocabulary).
    """
    try:
        return _build_tokenizer_json(metadata, sentencepiece)
    except UnsupportedModel:
        raise
    except Exception as exc:  # the tokenizers library raises its own exception types on a bad vocabulary
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise UnsupportedModel(f"GGUF tokenizer metadata does not describe a usable tokenizer ({detail}); "
                               "re-export the file") from None


def _build_tokenizer_json(metadata: Mapping[str, Any], sentencepiece: SentencePiece) -> str:
    kind = metadata.get("tokenizer.ggml.model")
    if kind == "llama":
        return _sentencepiece(metadata, sentencepiece).to_str()
    if kind != "gpt2":
        raise UnsupportedModel(
            f"GGUF tokenizer.ggml.model is {kind!r}, but grokc rebuilds byte-level BPE ('gpt2') and SentencePiece "
            "('llama') tokenizers only; convert the model with one of those or load its Hugging Face folder"
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


_META = "\u2581"   # SentencePiece's space


def _sentencepiece(metadata: Mapping[str, Any], style: SentencePiece) -> Tokenizer:
    """The SentencePiece vocabulary as transformers' GGUF builders make it (module docstring)."""
    tokens: list[str] = list(metadata.get("tokenizer.ggml.tokens") or ())
    token_types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or ())
    if not tokens:
        raise UnsupportedModel("GGUF metadata has no 'tokenizer.ggml.tokens', so its tokenizer cannot be rebuilt; "
                               "re-export the file")
    if style is SentencePiece.GEMMA:
        tokens = [_META * len(t) if " " in t and not t.strip() else t for t in tokens]
        ranks = {t: -i for i, t in enumerate(tokens)}          # Gemma's merge order is its file order
    elif "tokenizer.ggml.merges" not in metadata:
        if "tokenizer.ggml.scores" not in metadata:
            raise UnsupportedModel("GGUF SentencePiece vocabulary has neither merges nor scores; re-export the file")
        ranks = dict(zip(tokens, metadata["tokenizer.ggml.scores"]))
    vocab = {t: i for i, t in enumerate(tokens)}
    if "tokenizer.ggml.merges" in metadata:
        merges = [tuple(m.split(" ")) for m in metadata["tokenizer.ggml.merges"]]
    else:
        merges = merges_from_vocab(vocab, ranks)
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if style is SentencePiece.GEMMA and unk_id is not None else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True, dropout=None))
    steps = [decoders.Replace(_META, " "), decoders.ByteFallback(), decoders.Fuse()]
    if style is SentencePiece.GEMMA:
        tok.normalizer = normalizers.Replace(" ", _META)
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    elif style is SentencePiece.PHI3:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(_META), normalizers.Replace(" ", _META)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_META, prepend_scheme="first", split=False)
    if style is not SentencePiece.GEMMA:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    special_ids = [metadata[f"tokenizer.ggml.{k}"] for k in _SPECIAL_ID_KEYS if f"tokenizer.ggml.{k}" in metadata]
    special = [tokens[i] for i in special_ids if 0 <= i < len(tokens)]
    special += [t for t, kind in zip(tokens, token_types) if kind == TOKEN_TYPE_CONTROL]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in dict.fromkeys(special)])
    original = list(metadata["tokenizer.ggml.tokens"])    # USER_DEFINED tokens as the file spells them
    user_defined = [AddedToken(t, normalized=False, special=False)
                    for t, kind in zip(original, token_types) if kind == TOKEN_TYPE_USER_DEFINED and t in vocab]
    if user_defined:
        tok.add_tokens(user_defined)
    tok.post_processor = _post_processor(metadata, tokens, add_bos=True)
    return tok


def merges_from_vocab(vocab: Mapping[str, int], ranks: Mapping[str, float]) -> list[tuple[str, str]]:
    """The merges a vocabulary without them implies (transformers' ``generate_merges`` with scores):
    every split of a token into two tokens of ``vocab``, the splits of one token by the two halves'
    ids, then all of them by (the token's rank, the halves' lengths), highest first, stable."""
    found = []
    for token, rank in ranks.items():
        local = [(token[:i], token[i:], rank) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _post_processor(metadata: Mapping[str, Any], tokens: list[str], add_bos: bool = False) -> processors.TemplateProcessing:
    """Prepend bos / append eos when the file asks for it (the shape transformers gives it);
    ``add_bos`` is what a file that does not say means (SentencePiece files: bos)."""
    parts: dict[str, tuple[str, int] | None] = {}
    for side, flag, key in (("bos", "add_bos_token", "bos_token_id"), ("eos", "add_eos_token", "eos_token_id")):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        wanted = bool(metadata.get(f"tokenizer.ggml.{flag}", add_bos if side == "bos" else False))
        parts[side] = (tokens[token_id], token_id) if wanted and token_id is not None else None
    bos, eos = parts["bos"], parts["eos"]
    single = f"{bos[0] + ':0 ' if bos else ''}$A:0{' ' + eos[0] + ':0' if eos else ''}"
    pair = f"{single}{' ' + bos[0] + ':1' if bos else ''} $B:1{' ' + eos[0] + ':1' if eos else ''}"
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=[p for p in (bos, eos) if p])
