"""The ``int4-rot`` preset: the unrotated ``int4-norot`` recipe (per output channel, GPTQ) on weights
turned by ``quant/rotation.py``, and the default ``int4``, which rotates where the model allows it
and stores a rotated tied LM head's own copy as int8. Checked as recipes (what they are made of) and
through builds: on a tiny model whose reading linears have outlier input columns (what per-channel
int4 serves worst and the rotation spreads), the CPU plan of an ``int4-rot`` artifact is much closer
to the unquantized model than that of an ``int4-norot`` one. The reference is grokc's fp32 torch model on the source weights (itself
checked against transformers, ``tests/models/test_rotation.py``), not the rotation code's output."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from calib_tiny import byte_loaded
from tokenizers import Tokenizer

from grokc.compiler import quality, text
from grokc.compiler.build import BuildOptions, build_loaded
from grokc.compiler.calibrate import CalibrationOptions
from grokc.core import tensors as names
from grokc.core.ir import WeightFormat
from grokc.quant.recipe import QUANT
from grokc.runner import Runner

T = names.Tensor
BUILD = dict(archs=("sm90",), batch=1, buckets=(16,), max_seq=128, quality_tokens=0,
             calibration=CalibrationOptions(samples=4, tokens=64, seed=0, sequential=False))


def test_int4_rot_is_the_unrotated_recipe_turned():
    assert QUANT["int4-rot"] == replace(QUANT["int4-norot"], name="int4-rot", rotate=True)
    assert QUANT["int4-rot"].summary == QUANT["int4-norot"].summary + ", rotated"


def test_the_default_rotates_where_supported_with_an_int8_tied_head():
    default = QUANT["int4"]
    assert default == replace(QUANT["int4-norot"], name="int4", rotate=True, rotate_where_supported=True,
                              rotated_tied_head=WeightFormat.Q8)
    tied, untied = default.for_model(None, tied=True), default.for_model(None, tied=False)
    assert tied == replace(QUANT["int4-rot"], name="int4", lm_head=WeightFormat.Q8)
    assert untied == replace(QUANT["int4-rot"], name="int4")
    refused = default.for_model("a gemma3 model", tied=True)
    assert refused == replace(QUANT["int4-norot"], name="int4", not_rotated="a gemma3 model")
    assert refused.to_json()["not_rotated"] == "a gemma3 model" and "rotate" not in refused.to_json()
    assert QUANT["int4-rot"].for_model(None, tied=True) == QUANT["int4-rot"]   # an explicit preset as it says
    assert QUANT["int4-norot"].for_model("why", tied=True) == QUANT["int4-norot"]


def test_build_options_settle_rotation_and_the_head():
    def recipe(**kw):
        return BuildOptions(**kw).compile_options().quant

    assert recipe(rotate=False) == replace(QUANT["int4-norot"], name="int4")
    assert recipe(rotate=True) == replace(QUANT["int4"], rotate_where_supported=False)   # --rotate: refuse, not skip
    assert recipe(lm_head="fp16").rotated_tied_head is None                             # --lm-head: every head
    assert recipe(quant="int4-norot", rotate=True) == replace(QUANT["int4-rot"], name="int4-norot")


def test_a_default_build_of_a_tied_model_rotates_and_stores_an_int8_head(tmp_path):
    tiny = byte_loaded()
    assert tiny.config.tie_word_embeddings
    manifest = build_loaded(tiny, tmp_path / "a", BuildOptions(**BUILD))
    r = manifest.quant.recipe
    assert (r["name"], r["rotate"], r["lm_head"]) == ("int4", True, "q8") and "not_rotated" not in r
    assert "rotate_where_supported" not in r and "rotated_tied_head" not in r   # what was done, settled
    assert not manifest.model.tie_word_embeddings
    plain = build_loaded(tiny, tmp_path / "b", BuildOptions(rotate=False, **BUILD))
    assert "rotate" not in plain.quant.recipe and plain.quant.recipe["lm_head"] == "f16"


def _with_outlier_columns(loaded, columns=(5, 37), factor=12.0):
    """``loaded`` with ``columns`` of every norm-fed linear (q, k, v, gate, up) scaled by ``factor``."""
    weights = dict(loaded.weights)
    for i in range(loaded.config.num_layers):
        for kind in (T.ATTN_Q, T.ATTN_K, T.ATTN_V, T.FFN_GATE, T.FFN_UP):
            w = weights[names.name(kind, i)].copy()
            w[:, list(columns)] *= factor
            weights[names.name(kind, i)] = w
    return replace(loaded, weights=weights, source_sha256=loaded.source_sha256 + "-outliers")


def test_int4_rot_serves_outlier_inputs_better_than_int4(tmp_path):
    tiny = _with_outlier_columns(byte_loaded())
    ids = Tokenizer.from_str(tiny.tokenizer_json).encode(text.pydoc_text("eval")).ids[:64]
    want = quality.reference_logits(quality.reference_model(tiny.config, tiny.weights), ids)   # [64, V]
    err = {}
    for quant in ("int4-norot", "int4-rot"):
        manifest = build_loaded(tiny, tmp_path / quant, BuildOptions(quant=quant, **BUILD))
        got = Runner(tmp_path / quant, device="cpu").engine.score([ids])[0]
        err[quant] = float(np.sqrt(((got - want) ** 2).mean() / (want ** 2).mean()))
        assert manifest.quant.recipe["group_size"] == 0
    assert manifest.quant.recipe["rotate"] is True and not manifest.model.tie_word_embeddings
    assert err["int4-rot"] < 0.5 * err["int4-norot"], err   # measured: 0.22 against 0.51 of the logits' RMS
