"""GGUF frontend against transformers' own GGUF loader (the independent fp32 reference)."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from grokc.compiler import models
from grokc.compiler.frontends import load_model, weight_shapes
from grokc.compiler.frontends.gguf import (
    llama3_rope_factors,
    llama3_rope_from_factors,
    unpermute_qk,
)
from grokc.core.config import RopeType
from grokc.core.errors import UnsupportedModel

SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def _reference_state_dict(model) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def assert_weights_match_reference(loaded, model) -> None:
    ref = _reference_state_dict(model)
    assert list(loaded.weights) == list(weight_shapes(loaded.config))
    # canonical names back to transformers' own, through the architecture's name table
    hf_of = {c: h for h, c in models.get(loaded.config.architecture).hf_to_canonical(loaded.config).items()}
    ours = {hf_of[name]: arr for name, arr in loaded.weights.items()}
    if loaded.config.tie_word_embeddings:
        # transformers keeps a tied lm_head that *is* the embedding; we leave it out.
        assert set(ref) - set(ours) == {"lm_head.weight"}
        np.testing.assert_array_equal(ref["lm_head.weight"], ours["model.embed_tokens.weight"])
    else:
        assert set(ref) == set(ours)
    for name, arr in ours.items():
        assert arr.dtype == np.float32 and arr.flags.c_contiguous and not arr.flags.writeable, name
        assert arr.shape == ref[name].shape, name
        assert np.array_equal(arr, ref[name]), f"{name} differs from transformers' fp32 weights"


def assert_config_matches_reference(cfg, hf) -> None:
    rope = getattr(hf, "rope_parameters", None) or {}
    assert cfg.vocab_size == hf.vocab_size
    assert cfg.hidden_size == hf.hidden_size
    assert cfg.intermediate_size == hf.intermediate_size
    assert cfg.num_layers == hf.num_hidden_layers
    assert cfg.num_heads == hf.num_attention_heads
    assert cfg.num_kv_heads == hf.num_key_value_heads
    assert cfg.head_dim == hf.head_dim
    assert cfg.rms_norm_eps == hf.rms_norm_eps
    assert cfg.max_position_embeddings == hf.max_position_embeddings
    assert cfg.tie_word_embeddings == hf.tie_word_embeddings
    assert cfg.rope.theta == rope.get("rope_theta", getattr(hf, "rope_theta", None))
    assert cfg.rope.type.value == rope.get("rope_type", "default")
    assert cfg.bos_token_id == hf.bos_token_id
    assert cfg.eos_token_ids[0] == hf.eos_token_id


def test_weights_equal_transformers(smollm2_loaded, hf_reference):
    assert_weights_match_reference(smollm2_loaded, hf_reference)


def test_config_matches_transformers(smollm2_loaded, hf_reference):
    cfg = smollm2_loaded.config
    assert_config_matches_reference(cfg, hf_reference.config)
    # and the numbers the notes give for the test model
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert cfg.vocab_size == 49152 and cfg.tie_word_embeddings and cfg.eos_token_ids == (2,)
    assert cfg.rope.type is RopeType.DEFAULT and cfg.rope.theta == 100000.0


def test_source_and_template(smollm2_loaded, smollm2_gguf, hf_tokenizer):
    assert smollm2_loaded.source_format == "gguf"
    assert smollm2_loaded.source_sha256 == SMOLLM2_SHA256
    assert smollm2_loaded.source_sha256 == hashlib.sha256(smollm2_gguf.read_bytes()).hexdigest()
    assert smollm2_loaded.chat_template == hf_tokenizer.chat_template


def test_progress_reports_dequantizing(tiny_gguf):
    lines: list[str] = []
    load_model(tiny_gguf(), progress=lines.append)
    assert any("dequantizing 20 tensors" in line for line in lines)


def llamacpp_permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, verbatim."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 8), (32, 8, 128)])
def test_unpermute_inverts_llamacpp_permute(heads, kv_heads, head_dim):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((heads * head_dim, 16)).astype(np.float32)
    k = rng.standard_normal((kv_heads * head_dim, 16)).astype(np.float32)
    assert np.array_equal(unpermute_qk(llamacpp_permute(q, heads, heads), heads), q)
    assert np.array_equal(unpermute_qk(llamacpp_permute(k, heads, kv_heads), kv_heads), k)
    assert not np.array_equal(llamacpp_permute(q, heads, heads), q)


def test_untied_tiny_gguf_matches_transformers(tiny_gguf):
    """An untied model with an ``output.weight``, Q8_0 and F16 tensors, through both loaders."""
    transformers = pytest.importorskip("transformers")
    path = tiny_gguf(tied=False)
    loaded = load_model(path)
    assert not loaded.config.tie_word_embeddings and "output.weight" in loaded.weights
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    assert_weights_match_reference(loaded, ref)
    assert_config_matches_reference(loaded.config, ref.config)


def llamacpp_llama3_factors(base, dim, factor, low_freq_factor, high_freq_factor, old_context_len):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (llama3), as written there."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(rope_factors, dtype=np.float32)


@pytest.mark.parametrize(
    "theta,head_dim,params",
    [(500000.0, 128, (8.0, 1.0, 4.0, 8192)), (500000.0, 64, (32.0, 1.0, 4.0, 8192)), (10000.0, 128, (4.0, 2.0, 8.0, 8192))],
)
def test_llama3_rope_recovered_from_rope_freqs(theta, head_dim, params):
    table = llamacpp_llama3_factors(theta, head_dim, *params)
    rope = llama3_rope_from_factors(table, theta, head_dim, params[3], "test.gguf")
    assert rope.type is RopeType.LLAMA3
    assert (rope.factor, rope.low_freq_factor, rope.high_freq_factor, rope.original_max_position_embeddings) == params
    np.testing.assert_allclose(llama3_rope_factors(theta, head_dim, *params), table, rtol=1e-6)


def test_rope_freqs_end_to_end(tiny_gguf):
    table = llamacpp_llama3_factors(10000.0, 16, 4.0, 1.0, 4.0, 64)
    path = tiny_gguf(extra_tensors={"rope_freqs.weight": table}, metadata={"llama.rope.scaling.original_context_length": 64})
    rope = load_model(path).config.rope
    assert (rope.type, rope.factor, rope.low_freq_factor, rope.high_freq_factor) == (RopeType.LLAMA3, 4.0, 1.0, 4.0)


def test_rope_freqs_that_are_not_llama3_are_refused():
    table = np.linspace(1.0, 3.0, 64).astype(np.float32) ** 2
    with pytest.raises(UnsupportedModel, match="rope_freqs.weight") as err:
        llama3_rope_from_factors(table, 500000.0, 128, 8192, "odd.gguf")
    assert "\n" not in str(err.value)


def test_linear_and_yarn_rope_metadata(tiny_gguf):
    lin = load_model(tiny_gguf("lin.gguf", metadata={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}))
    assert (lin.config.rope.type, lin.config.rope.factor) == (RopeType.LINEAR, 2.0)
    yarn = load_model(
        tiny_gguf(
            "yarn.gguf",
            metadata={
                "llama.rope.scaling.type": "yarn",
                "llama.rope.scaling.factor": 4.0,
                "llama.rope.scaling.original_context_length": 64,
            },
        )
    )
    r = yarn.config.rope
    assert (r.type, r.factor, r.original_max_position_embeddings, r.attention_factor) == (RopeType.YARN, 4.0, 64, None)
