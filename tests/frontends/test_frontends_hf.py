"""Hugging Face folder frontend: transformers' save of the reference loads to the GGUF frontend's bytes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from frontends_tiny import TEXTS, tiny_hf_config
from safetensors.torch import load_file
from tokenizers import Tokenizer

from grokc.compiler import models
from grokc.compiler.frontends import load_model
from grokc.compiler.frontends.hf import folder_sha256
from grokc.core.config import RopeType


@pytest.fixture(scope="module")
def saved_reference(tmp_path_factory, hf_reference, hf_tokenizer) -> Path:
    """The transformers reference saved as a sharded safetensors folder with its tokenizer."""
    folder = tmp_path_factory.mktemp("smollm2-hf")
    # transformers will not save a model it loaded through its GGUF quantizer, so copy the
    # reference's weights into a plain model of the same config first.
    raw = {k: v for k, v in hf_reference.config.to_dict().items() if k != "quantization_config"}
    plain = type(hf_reference)(type(hf_reference.config).from_dict(raw))
    plain.load_state_dict(hf_reference.state_dict())
    plain.save_pretrained(folder, safe_serialization=True, max_shard_size="200MB")
    hf_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf_loaded(saved_reference):
    return load_model(saved_reference)


def test_folder_is_sharded_and_tied(saved_reference):
    index = json.loads((saved_reference / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert "lm_head.weight" not in index["weight_map"]


def test_weights_byte_identical_to_gguf_frontend(hf_loaded, smollm2_loaded):
    assert list(hf_loaded.weights) == list(smollm2_loaded.weights)
    for name, arr in hf_loaded.weights.items():
        ref = smollm2_loaded.weights[name]
        assert arr.dtype == np.float32 and arr.flags.c_contiguous and not arr.flags.writeable, name
        assert arr.shape == ref.shape and arr.tobytes() == ref.tobytes(), name


def test_config_equal_to_gguf_frontend(hf_loaded, smollm2_loaded):
    assert hf_loaded.config == smollm2_loaded.config
    assert hf_loaded.source_format == "hf"


def test_tokenizer_and_template(hf_loaded, smollm2_loaded, saved_reference):
    assert hf_loaded.tokenizer_json == (saved_reference / "tokenizer.json").read_text(encoding="utf-8")
    ours, gguf_tok = Tokenizer.from_str(hf_loaded.tokenizer_json), Tokenizer.from_str(smollm2_loaded.tokenizer_json)
    for text in TEXTS:
        assert ours.encode(text).ids == gguf_tok.encode(text).ids, text
    assert hf_loaded.chat_template == smollm2_loaded.chat_template


def test_source_sha256_is_the_documented_listing(hf_loaded, saved_reference):
    index = json.loads((saved_reference / "model.safetensors.index.json").read_text())
    names = set(index["weight_map"].values()) | {"config.json", "tokenizer.json"}
    names |= {n for n in ("tokenizer_config.json", "chat_template.jinja", "generation_config.json") if (saved_reference / n).is_file()}
    listing = "".join(f"{hashlib.sha256((saved_reference / n).read_bytes()).hexdigest()}  {n}\n" for n in sorted(names))
    assert hf_loaded.source_sha256 == hashlib.sha256(listing.encode()).hexdigest()
    assert folder_sha256(saved_reference) == hf_loaded.source_sha256


def test_bf16_weights_become_exact_fp32(tiny_hf):
    folder = tiny_hf(dtype=torch.bfloat16)
    loaded = load_model(folder)
    ref = load_file(str(folder / "model.safetensors"))
    canonical = models.get(loaded.config.architecture).hf_to_canonical(loaded.config)
    assert sorted(canonical.values()) == sorted(loaded.weights)
    for hf, name in canonical.items():
        arr = loaded.weights[name]
        assert arr.dtype == np.float32 and not arr.flags.writeable
        assert np.array_equal(arr, ref[hf].float().numpy()), name
    assert loaded.chat_template == "{{ hf }}"
    assert not loaded.config.tie_word_embeddings and loaded.config.eos_token_ids == (0,)


def test_rope_scaling_v4_and_v5_spellings(tiny_hf):
    v4 = tiny_hf(
        "v4",
        config={
            **tiny_hf_config(),
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        },
    )
    v5 = tiny_hf(
        "v5",
        config={
            **tiny_hf_config(),
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        },
    )
    a, b = load_model(v4).config.rope, load_model(v5).config.rope
    assert a == b
    assert (a.type, a.theta, a.factor, a.original_max_position_embeddings) == (RopeType.LLAMA3, 500000.0, 8.0, 8192)


def test_artifact_weights_identical_from_gguf_and_hf_folder(saved_reference, smollm2_gguf, tmp_path):
    """The same weights through either frontend give byte-identical weights in the artifact."""
    from grokc.compiler.build import BuildOptions, build
    from grokc.compiler.calibrate import CalibrationOptions

    opts = BuildOptions(archs=("sm90",), buckets=(128,), max_seq=512,   # calibration too must not tell them apart
                        calibration=CalibrationOptions(samples=4, tokens=256, sequential=False))
    build(smollm2_gguf, tmp_path / "from_gguf", opts)
    build(saved_reference, tmp_path / "from_hf", opts)
    a = (tmp_path / "from_gguf" / "weights.safetensors").read_bytes()
    b = (tmp_path / "from_hf" / "weights.safetensors").read_bytes()
    assert len(a) > 50_000_000 and a == b
