"""Fuzzing the model readers (tests/fuzzing.py): a Hugging Face folder whose config.json (and
generation_config.json) is mutated at random, a GGUF whose metadata values are replaced, and a
GGUF whose header bytes are flipped. Loading may succeed or raise grokc's error in one line;
nothing else, nothing slow, nothing outside the temp folder opened or changed."""

import json
import string

import pytest
from frontends_tiny import tiny_hf_config, tiny_tokenizer_metadata, write_tiny_gguf, write_tiny_hf
from fuzzing import FUZZ, mutate, only_grokc_errors
from hypothesis import given
from hypothesis import strategies as st
from tamper import file_accesses, outside

from grokc.compiler.frontends import load_model


class Folder:
    """A temp folder (kept out of the repr Hypothesis prints for a failing case)."""

    def __init__(self, path):
        self.path = path

    def __repr__(self) -> str:
        return f"Folder({str(self.path)!r})"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return Folder(tmp_path_factory.mktemp("fuzz_models"))


def checked(root, call):
    with file_accesses() as seen:
        only_grokc_errors(call)
    assert outside(seen, root) == [], outside(seen, root)


@pytest.fixture(scope="module")
def hf(root):
    return write_tiny_hf(root.path / "hf")


@FUZZ
@given(data=st.data())
def test_fuzzed_hf_configs(root, hf, data):
    config = mutate(data, tiny_hf_config(), max_edits=4)
    (hf / "config.json").write_text(json.dumps(config))
    if data.draw(st.booleans(), label="generation_config"):
        (hf / "generation_config.json").write_text(json.dumps(mutate(data, {"eos_token_id": [0, 1], "bos_token_id": 1})))
    else:
        (hf / "generation_config.json").unlink(missing_ok=True)
    checked(root.path, lambda: load_model(hf))


GGUF_KEYS = ["llama.block_count", "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
             "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.freq_base",
             "llama.rope.dimension_count", "llama.attention.layer_norm_rms_epsilon", "llama.vocab_size",
             "llama.attention.key_length", "llama.expert_count", "llama.rope.scaling.type", "llama.rope.scaling.factor",
             "general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.bos_token_id",
             "tokenizer.ggml.eos_token_id", "tokenizer.ggml.merges", "tokenizer.ggml.tokens",
             "tokenizer.ggml.token_type", "tokenizer.chat_template"]
# What a GGUF can hold (the tiny writer stores ints as uint32, floats as float32), hostile within that.
GGUF_VALUES = st.one_of(
    st.none(),   # the key left out
    st.booleans(),
    st.sampled_from([0, 1, 2, 3, 7, 16, 255, 65535, 2**31 - 1, 2**32 - 1]),
    st.integers(0, 2**32 - 1),
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.text(string.printable, max_size=12),
    st.sampled_from(["llama", "gpt2", "mamba", "yarn", "linear", "llama3", ""]),
    st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=4),
    st.lists(st.text(string.ascii_letters, min_size=1, max_size=3), min_size=1, max_size=4),
)


@FUZZ
@given(data=st.data())
def test_fuzzed_gguf_metadata(root, data):
    edits = data.draw(st.dictionaries(st.sampled_from(GGUF_KEYS), GGUF_VALUES, min_size=1, max_size=4))
    tokenizer = {k: v for k, v in edits.items() if k.startswith("tokenizer.") and v is not None}
    metadata = {k: v for k, v in edits.items() if not k.startswith("tokenizer.")}
    path = root.path / "m.gguf"
    try:
        write_tiny_gguf(path, metadata=metadata, tokenizer={**tiny_tokenizer_metadata(), **tokenizer}
                        if tokenizer else None)
    except Exception:   # a value the GGUF writer itself cannot store: not a file anyone could hand grokc
        return
    checked(root.path, lambda: load_model(path))


@pytest.fixture(scope="module")
def gguf_bytes(root):
    return write_tiny_gguf(root.path / "pristine.gguf").read_bytes()


@FUZZ
@given(data=st.data())
def test_fuzzed_gguf_header_bytes(root, gguf_bytes, data):
    """Bytes flipped in the first 8 kB (the header, the metadata and the tensor index), or the file cut."""
    raw = bytearray(gguf_bytes)
    for _ in range(data.draw(st.integers(1, 6), label="flips")):
        raw[data.draw(st.integers(0, min(8192, len(raw)) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans(), label="cut"):
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    path = root.path / "flipped.gguf"
    path.write_bytes(bytes(raw))
    checked(root.path, lambda: load_model(path))

