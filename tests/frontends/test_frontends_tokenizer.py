"""The tokenizer rebuilt from GGUF metadata tokenizes exactly like transformers' GGUF tokenizer."""

from __future__ import annotations

import json

import pytest
from frontends_tiny import TEXTS
from tokenizers import Tokenizer

from grokc.compiler.frontends import load_model
from grokc.compiler.frontends.gguf import read_metadata
from grokc.compiler.frontends.gguf_tokenizer import build_tokenizer_json
from grokc.core.errors import UnsupportedModel


@pytest.fixture(scope="module")
def our_tokenizer(smollm2_loaded) -> Tokenizer:
    return Tokenizer.from_str(smollm2_loaded.tokenizer_json)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_transformers(our_tokenizer, hf_tokenizer, text):
    want = hf_tokenizer(text)["input_ids"]
    assert our_tokenizer.encode(text).ids == want


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trip(our_tokenizer, hf_tokenizer, text):
    ids = our_tokenizer.encode(text).ids
    assert our_tokenizer.decode(ids, skip_special_tokens=False) == text
    assert our_tokenizer.decode(ids, skip_special_tokens=False) == hf_tokenizer.decode(ids)


def test_special_tokens_stay_whole(our_tokenizer):
    ids = our_tokenizer.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ids[0] == 1 and ids[-1] == 2  # <|im_start|>, <|im_end|>


def test_tokenizer_json_matches_transformers_backend(smollm2_loaded, hf_tokenizer):
    ours = json.loads(smollm2_loaded.tokenizer_json)
    ref = json.loads(hf_tokenizer.backend_tokenizer.to_str())
    for key in ("normalizer", "pre_tokenizer", "decoder", "post_processor"):
        assert ours[key] == ref[key], key
    assert ours["model"] == ref["model"]
    assert ours["added_tokens"] == ref["added_tokens"]


def _smollm2_tokenizer_metadata(path) -> dict:
    return {k: v for k, v in read_metadata(path).items() if k.startswith("tokenizer.")}


def test_bos_and_split_regex_variant_matches_transformers(smollm2_gguf, tiny_gguf):
    """The same vocabulary with add_bos_token and Llama 3's split regex (``llama-bpe``): the
    post-processor and pre-tokenizer branches SmolLM2 does not take, against transformers."""
    transformers = pytest.importorskip("transformers")
    tok_meta = _smollm2_tokenizer_metadata(smollm2_gguf) | {
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.add_bos_token": True,
    }
    path = tiny_gguf("bos-llama-bpe.gguf", tokenizer=tok_meta)
    ref = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ours = Tokenizer.from_str(load_model(path).tokenizer_json)
    for text in TEXTS:
        assert ours.encode(text).ids == ref(text)["input_ids"], text
    assert ours.encode("hi").ids[0] == 1  # bos prepended


def test_sentencepiece_vocabulary_without_merges_or_scores_is_refused():
    with pytest.raises(UnsupportedModel, match="neither merges nor scores") as err:
        build_tokenizer_json({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>"]})
    assert "\n" not in str(err.value)
