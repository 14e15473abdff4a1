"""The tokenizer grokc rebuilds from a GGUF against transformers' tokenizer of the same GGUF, on the
300 strings of ``tokenizer_strings.py``: ids equal, and decoding gives transformers' text.

- every tiny family's byte-level BPE (Qwen's files name the ``qwen2`` split regex, one digit per
  piece; the others GPT-2's);
- SentencePiece vocabularies read the Llama, Gemma and Phi-3 ways (``spm_vocab.py``): the whole
  ``tokenizer.json`` (model, merges derived from the vocabulary, normalizer, pre-tokenizer,
  decoder, added tokens, post-processor) equals transformers' backend;
- the chat template grokc keeps renders as transformers renders the GGUF's.
"""

from __future__ import annotations

import json

import pytest
from spm_vocab import write_spm_gguf
from tiny_families import FAMILIES
from tokenizer_strings import strings
from tokenizers import Tokenizer

from grokc.compiler import models
from grokc.compiler.frontends import load_model
from grokc.compiler.frontends.gguf import read_metadata
from grokc.compiler.frontends.gguf_tokenizer import build_tokenizer_json

transformers = pytest.importorskip("transformers")
STRINGS = strings()


def same_as_transformers(ours: Tokenizer, ref) -> None:
    for text in STRINGS:
        ids = ours.encode(text).ids
        assert ids == ref(text)["input_ids"], repr(text)
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids), repr(text)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_gguf_tokenizer_matches_transformers(tiny_family, family):
    fam = tiny_family(family)
    ref = transformers.AutoTokenizer.from_pretrained(str(fam.gguf.parent), gguf_file=fam.gguf.name)
    loaded = load_model(fam.gguf)
    same_as_transformers(Tokenizer.from_str(loaded.tokenizer_json), ref)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    want = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render(loaded.chat_template, messages) == want


def render(template: str, messages: list[dict]) -> str:
    """``template`` rendered as transformers renders chat templates (its jinja settings)."""
    import jinja2

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "phi3"])
def test_sentencepiece_vocabulary_matches_transformers(tmp_path, arch):
    path = write_spm_gguf(tmp_path / f"{arch}.gguf", arch)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    style = models.for_gguf(arch, arch).gguf_sentencepiece
    ours_json = build_tokenizer_json(read_metadata(path), style)
    ours, theirs = json.loads(ours_json), json.loads(ref.backend_tokenizer.to_str())
    for key in ("model", "normalizer", "pre_tokenizer", "decoder", "post_processor", "added_tokens"):
        assert ours[key] == theirs[key], key
    same_as_transformers(Tokenizer.from_str(ours_json), ref)
