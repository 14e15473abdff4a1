"""``--rotate`` (``quant/rotation.py``): the rotated weights compute transformers' logits of the
unrotated model, through grokc's torch model and through an artifact's CPU plan, and the build
records the rotation and refuses what it cannot turn.

The reference is transformers' fp32 model of each tiny family (``tiny_families.py``: norms away from
1, biases, tied heads), never the rotation code's own output."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_families_vs_hf import LOGIT_TOL, prefill_logits, prompt, rel_err

from grokc.compiler.build import BuildOptions, build, build_loaded
from grokc.compiler.frontends import load_model
from grokc.compiler.quality import reference_logits, reference_model
from grokc.core import tensors as names
from grokc.core.errors import BuildOptionError
from grokc.quant.rotation import hadamard, orthogonal, rotated
from grokc.runner import Runner

ROTATABLE = ("qwen2", "qwen3", "mistral", "phi3")
BUILD = dict(archs=("sm90",), batch=2, buckets=(16, 64), max_seq=128, quality_tokens=0)


@pytest.mark.parametrize("n", [1, 2, 12, 20, 24, 44, 64, 576, 1536, 2048])
def test_hadamard_orders(n):
    h = hadamard(n)
    assert set(np.unique(h)) <= {-1, 1} and (h @ h.T == n * np.eye(n, dtype=np.int64)).all()


@pytest.mark.parametrize("n", [64, 576, 896])   # 896 = 7 * 128: no construction here, a random orthogonal one
def test_orthogonal_is_orthogonal_and_seeded(n):
    q = orthogonal(n, seed=3)
    assert np.abs(q @ q.T - np.eye(n)).max() < 1e-12
    assert (q == orthogonal(n, seed=3)).all() and not (q == orthogonal(n, seed=4)).all()


@pytest.mark.parametrize("family", ROTATABLE)
def test_rotated_weights_keep_transformers_logits(tiny_family, hf_reference, family):
    loaded = load_model(tiny_family(family).hf)
    cfg, weights = rotated(loaded.config, loaded.weights)
    embd = names.name(names.Tensor.TOKEN_EMBD)
    assert np.abs(weights[embd] - loaded.weights[embd]).max() > 0.05          # it turned something
    assert all((weights[names.name(names.Tensor.ATTN_NORM, i)] == 1).all() for i in range(cfg.num_layers))
    ids = prompt(20, seed=7)
    with torch.no_grad():
        want = hf_reference(family)(torch.tensor([ids])).logits[0].numpy()
    got = reference_logits(reference_model(cfg, weights), ids)
    assert rel_err(got, want) < 1e-4, family


def test_rotated_fp16_plan_matches_transformers(tiny_family, hf_reference, tmp_path):
    """The rotated (untied, biased) qwen2 stored in f16 and run by the CPU plan, against transformers'
    unrotated model: the same tolerance as every family's fp16 build."""
    loaded = load_model(tiny_family("qwen2").hf)
    assert loaded.config.tie_word_embeddings
    cfg, weights = rotated(loaded.config, loaded.weights)
    build_loaded(replace(loaded, config=cfg, weights=weights), tmp_path / "a", BuildOptions(quant="fp16", **BUILD))
    runner = Runner(tmp_path / "a", device="cpu")
    for n in (12, 40):
        ids = prompt(n, seed=n)
        with torch.no_grad():
            want = hf_reference("qwen2")(torch.tensor([ids])).logits[0, -1].numpy()
        got = prefill_logits(runner, ids)
        assert rel_err(got, want) < LOGIT_TOL and got.argmax() == want.argmax()


def test_a_rotated_build_records_it_and_keeps_a_head_of_its_own(tiny_family, tmp_path):
    manifest = build(tiny_family("qwen2").hf, tmp_path / "a", BuildOptions(quant="int4-rtn", rotate=True, **BUILD))
    assert manifest.quant.recipe["rotate"] is True and not manifest.model.tie_word_embeddings
    plain = build(tiny_family("qwen2").hf, tmp_path / "b", BuildOptions(quant="int4-rtn", **BUILD))
    assert "rotate" not in plain.quant.recipe and plain.model.tie_word_embeddings


@pytest.mark.parametrize("family, quant, match", [
    ("gemma3", "int4-rtn", "norms after the attention"),
    ("qwen2", "fp16", "stores none"),
])
def test_what_cannot_be_rotated_is_refused(tiny_family, tmp_path, family, quant, match):
    with pytest.raises(BuildOptionError, match=match):
        build(tiny_family(family).hf, tmp_path / "a", BuildOptions(quant=quant, rotate=True, **BUILD))
    assert not (tmp_path / "a").exists()


def test_the_default_int4_leaves_a_model_it_cannot_turn_unrotated_and_says_why(tiny_family, tmp_path):
    from grokc.compiler.calibrate import CalibrationOptions

    said: list[str] = []
    calib = CalibrationOptions(samples=2, tokens=32, sequential=False)
    manifest = build(tiny_family("gemma3").hf, tmp_path / "a", BuildOptions(calibration=calib, **BUILD), said.append)
    r = manifest.quant.recipe
    assert r["name"] == "int4" and "rotate" not in r and "norms after the attention" in r["not_rotated"]
    assert r["lm_head"] == "f16" and manifest.model.tie_word_embeddings
    assert any(s.startswith("note: --quant int4 rotates where the model allows it; not rotated: a gemma3") for s in said)
