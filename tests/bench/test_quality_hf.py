"""``bench/probes/quality_hf.py``'s reading of a Gemma 3 artifact, against the tiny random Gemma 3 it
was built from (``tests/models/tiny_families.py``: six layers, norms away from their defaults), as a
Hugging Face folder, so the truth is transformers' own model, without the GGUF loader:

- ``--quant fp16``: every tensor the script hands transformers equals the model's to f16 rounding of
  what the artifact stores (the norms compared as transformers applies them, ``1 + w``; the
  post-norms come out of the residual stream's scale), nothing is missing, and transformers' logits
  on them equal the model's;
- ``--quant int4-g64-rtn`` (round to nearest, no clip search): every dequantized linear lies within
  one grid step (the source group's range over 15) of the model's weight, q/k/v and gate/up rows in
  transformers' order.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))   # tiny_families, gguf_writer

from quality_hf import artifact_state
from tiny_families import hf_model

from grokc.artifacts.store import open_artifact
from grokc.compiler.build import BuildOptions, build

pytest.importorskip("transformers")
BUILD = dict(archs=("sm90",), batch=2, buckets=(16, 64), max_seq=128, quality_tokens=0)
F16_TOL = 2e-3   # relative (Frobenius): f16 rounding gives ~3e-4


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    model, tok = hf_model("gemma3")
    folder = tmp_path_factory.mktemp("gemma3") / "hf"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, folder


def _built(folder: Path, quant: str):
    out = folder.parent / quant
    if not out.exists():
        build(folder, out, BuildOptions(quant=quant, **BUILD))
    return open_artifact(out)


def _applied(name: str, w: torch.Tensor) -> torch.Tensor:
    """What transformers' Gemma 3 multiplies by: ``1 + w`` for a norm."""
    return 1 + w if "norm" in name else w


def test_fp16_weights_and_logits_equal_the_model(gemma3):
    model, folder = gemma3
    state = artifact_state(_built(folder, "fp16"), model.config)
    truth = model.state_dict()
    assert set(truth) - {"lm_head.weight"} <= set(state)
    for name, w in state.items():
        want = _applied(name, truth[name])
        err = float((_applied(name, w) - want).norm() / want.norm())
        assert err < F16_TOL, f"{name}: {err:.3g}"
    stored = copy.deepcopy(model)
    stored.lm_head.weight = torch.nn.Parameter(state.pop("lm_head.weight"), requires_grad=False)
    stored.load_state_dict(state, strict=False)
    ids = torch.arange(3, 43).unsqueeze(0) % model.config.vocab_size
    with torch.no_grad():
        want, got = model(ids).logits, stored(ids).logits
    assert float((got - want).abs().max() / want.pow(2).mean().sqrt()) < 1e-2


def test_int4_g64_rtn_within_a_step_of_the_model(gemma3):
    model, folder = gemma3
    state = artifact_state(_built(folder, "int4-g64-rtn"), model.config)
    truth = model.state_dict()
    linears = [k for k in state if k.startswith("model.layers.") and k.endswith("_proj.weight")]
    assert len(linears) == 7 * model.config.num_hidden_layers
    for name in linears:
        w = truth[name].numpy()
        n, k = w.shape
        groups = w.reshape(n, -1, min(64, k))                        # [N, G, 64]
        step = (np.maximum(groups.max(-1), 0) - np.minimum(groups.min(-1), 0)) / 15
        err = np.abs(state[name].numpy() - w).reshape(groups.shape).max(-1)
        assert (err <= 1.05 * step + 1e-6).all(), f"{name}: {float((err / step).max()):.3g} steps"
