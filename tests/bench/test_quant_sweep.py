"""bench/probes/quant_sweep.py's emulation of an online turn of ffn_down's input (``down_turned``):
without quantization it gives back the weight (the turn is orthogonal and put back exactly), and
with int4 it serves a weight whose input has outlier channels better than the unturned weight does
(the output error ``tr(dW H dWᵀ)`` on those inputs' statistics), as the rotation literature says.
Specs parse into the recipe and the turn's order."""

from __future__ import annotations

import numpy as np
import pytest
import quant_sweep  # bench/probes/, on the path by conftest.py

from grokc.quant.recipe import QUANT
from grokc.quant.weights import dequantized_weight


def _inputs(rng: np.random.Generator, k: int) -> np.ndarray:
    """Second moment of inputs with a few channels 30x the others (the activations' outliers)."""
    x = rng.standard_normal((2048, k))
    x[:, [3, 70, 100]] *= 30
    return (x.T @ x / len(x)).astype(np.float32)


def _output_error(w: np.ndarray, q: np.ndarray, h: np.ndarray) -> float:
    d = (q - w).astype(np.float64)
    return float(np.einsum("nk,kj,nj->", d, h, d))


@pytest.mark.parametrize("block", [0, 64])
def test_turn_is_exact_without_quantization(block: int, monkeypatch):
    seen = {}

    def unquantized(w, recipe, h):     # the quantizer left out: W R back as given, its statistics kept
        seen["h"] = h
        return w

    monkeypatch.setattr(quant_sweep, "dequantized_weight", unquantized)
    rng = np.random.default_rng(1)
    w, h = rng.standard_normal((32, 128)).astype(np.float32), _inputs(rng, 128)
    got = quant_sweep.down_turned(w, h, QUANT["int4-norot"], block)
    assert np.abs(got - w).max() <= 1e-5 * np.abs(w).max()
    assert np.isclose(np.trace(seen["h"]), np.trace(h), rtol=1e-5)   # R^T H R: the same trace
    assert not np.allclose(seen["h"], h, atol=1e-3 * np.abs(h).max())  # but turned


@pytest.mark.parametrize("block", [0, 64])
def test_turn_lowers_int4_output_error_on_outlier_inputs(block: int):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    w[:, [3, 70, 100]] *= 8                                  # the columns those inputs meet
    h = _inputs(rng, 256)
    recipe = QUANT["int4-norot"]
    plain = _output_error(w, dequantized_weight(w, recipe, h), h)
    turned = _output_error(w, quant_sweep.down_turned(w, h, recipe, block), h)
    assert turned < 0.8 * plain, (turned, plain)


def test_specs_parse():
    recipe, had = quant_sweep.recipe_of("int4+res0.005+had64")
    assert recipe.name == "int4" and recipe.fp16_residual == 0.005 and had == 64
    assert quant_sweep.recipe_of("int4-norot+had")[1] == 0 and quant_sweep.recipe_of("int4")[1] is None
    assert quant_sweep.recipe_of("int4-norot+down32+out64")[0].fine == ("ffn_down", "attn_output")
    with pytest.raises(SystemExit):
        quant_sweep.recipe_of("int4+bogus")
    with pytest.raises(SystemExit):
        quant_sweep.down_turned(np.zeros((4, 96), np.float32), np.eye(96, dtype=np.float32), QUANT["int4-norot"], 64)
