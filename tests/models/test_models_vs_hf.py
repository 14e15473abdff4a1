"""Rung 1 of the ladder for every family: grokc's torch model (``compiler/models/transformer.py``) on
the weights a frontend loads equals transformers' own model, in fp32.

For each family, from the Hugging Face folder and from the GGUF: logits of 40 tokens within 1e-4
of their RMS (summation order and RoPE angles in float64 against float32). Also variants the
builds do not cover: Gemma 3 with ``query_pre_attn_scalar`` 24 (not head_dim) and its
layer pattern taken from ``sliding_window_pattern``, and Qwen2 with a sliding window on its second
layer (``use_sliding_window``, ``max_window_layers`` 1). The GGUF frontend loads exactly the folder's weights, and the config fields a GGUF
cannot carry are the documented ones.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from tiny_families import FAMILIES, cached_logits, hf_model

from grokc.compiler.frontends import load_model
from grokc.compiler.quality import reference_logits, reference_model

TOL = 1e-4
# The fields a family's GGUF cannot carry, and what grokc reads instead (documented in each family's
# file): Mistral's GGUF is a Llama one without the window.
GGUF_LOSES = {"mistral": {"architecture", "sliding_window", "local_layers"}}


def ids(n: int = 40, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(5, 300, n).tolist()


def check(loaded, hf, tokens: list[int], cached: bool = False) -> None:
    """grokc's torch model against ``hf`` in one forward (``cached``: token by token, KV cache)."""
    ours = reference_model(loaded.config, loaded.weights)
    got = reference_logits(ours, tokens)
    if cached:
        want = cached_logits(hf, tokens)
    else:
        with torch.no_grad():
            want = hf(torch.tensor([tokens])).logits[0].numpy()
    err = np.abs(got - want).max() / np.sqrt((want ** 2).mean())
    assert err < TOL, f"{loaded.config.architecture}: {err:.3g} of the logits' RMS"


@pytest.mark.parametrize("family", FAMILIES)
def test_torch_model_matches_transformers(tiny_family, hf_reference, family):
    """longrope: transformers switches factors per call, so its reference is token by token with a
    KV cache (positions >= 16 long, as grokc's per-position rule), over 40 tokens."""
    check(load_model(tiny_family(family).hf), hf_reference(family), ids(), cached=family == "phi3_longrope")


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_loads_the_folders_model(tiny_family, family):
    fam = tiny_family(family)
    hf, gg = load_model(fam.hf), load_model(fam.gguf)
    assert sorted(hf.weights) == sorted(gg.weights)
    for name, a in hf.weights.items():
        np.testing.assert_array_equal(gg.weights[name], a, err_msg=name)
    assert differing(hf.config, gg.config) == GGUF_LOSES.get(family, set())


def differing(a, b) -> set[str]:
    """The fields of two configs that differ, floats compared to f32 precision (GGUF stores f32)."""
    def same(x, y) -> bool:
        if dataclasses.is_dataclass(x) and dataclasses.is_dataclass(y):
            return not differing(x, y)
        if isinstance(x, float) and isinstance(y, float):
            return x == pytest.approx(y, rel=1e-6)
        if isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y):
            return all(same(u, v) for u, v in zip(x, y))
        return x == y
    return {f.name for f in dataclasses.fields(a) if not same(getattr(a, f.name), getattr(b, f.name))}


@pytest.mark.parametrize("overrides", [
    dict(query_pre_attn_scalar=24),
    dict(query_pre_attn_scalar=24, layer_types=None, sliding_window_pattern=3),
])
def test_gemma3_variants_match_transformers(tmp_path, overrides):
    model, tok = hf_model("gemma3", **overrides)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.config.attn_scale == pytest.approx(24 ** -0.5)
    pattern = overrides.get("sliding_window_pattern", 6)
    assert loaded.config.local_layers == tuple(i for i in range(6) if (i + 1) % pattern)
    check(loaded, model, ids())


def test_qwen2_sliding_window_matches_transformers(tmp_path):
    model, tok = hf_model("qwen2", use_sliding_window=True, sliding_window=6, max_window_layers=1)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert (loaded.config.local_layers, loaded.config.sliding_window) == ((1,), 6)
    check(loaded, model, ids())
