"""The rope config a graph's rotary frequencies are read as (``graph/rope_fit.py``), against transformers.

The frequencies come from transformers' own rope initialisers (``ROPE_INIT_FUNCTIONS``, in f32 as a
graph holds them); the config grokc fits must give, through ``core/rope.py``, the same frequencies
to 1e-6 relative (f32 rounding), and be the config transformers was given where the frequencies
decide it (theta, factor, and the ramp's ends over the context: a llama3 ramp fixes only
``original_max_position_embeddings / low_freq_factor`` and ``.../ high_freq_factor``, so a config with
``low_freq_factor`` 2 reads back as the equivalent one with 1). Frequencies of no known scaling (yarn,
perturbed ones) are refused in one line naming the node they came from.
"""

from __future__ import annotations

import numpy as np
import pytest

from grokc.compiler.frontends.graph.emit import RopeFreqs
from grokc.compiler.frontends.graph.rope_fit import fit_rope
from grokc.core import rope as rope_math
from grokc.core.config import RopeConfig, RopeType
from grokc.core.errors import UnsupportedModel

WHERE = "m.onnx: node 'rope' (RotaryEmbedding)"


def hf_inv_freq(head_dim: int, rope: dict, max_positions: int = 131072) -> tuple[np.ndarray, float]:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, max_position_embeddings=max_positions,
                      rope_scaling=rope)
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return 1.0 / rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim), 1.0
    inv, scale = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
    return inv.numpy().astype(np.float64), float(scale)


LLAMA31 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("head_dim,rope,want", [
    (128, LLAMA31, RopeConfig(500000.0, RopeType.LLAMA3, 8.0, 1.0, 4.0, 8192)),                     # Llama 3.1 / 3.2
    (64, {**LLAMA31, "factor": 32.0}, RopeConfig(500000.0, RopeType.LLAMA3, 32.0, 1.0, 4.0, 8192)),  # Llama 3.2 1B
    (16, LLAMA31, RopeConfig(500000.0, RopeType.LLAMA3, 8.0, 1.0, 4.0, 8192)),    # one pair on the ramp
    (64, {**LLAMA31, "rope_theta": 1e6, "factor": 16.0, "high_freq_factor": 2.0, "original_max_position_embeddings": 256},
     RopeConfig(1e6, RopeType.LLAMA3, 16.0, 1.0, 2.0, 256)),
    (128, {**LLAMA31, "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
           "original_max_position_embeddings": 1024}, RopeConfig(10000.0, RopeType.LLAMA3, 4.0, 1.0, 4.0, 512)),
    (64, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, RopeConfig(10000.0, RopeType.LINEAR, 4.0)),
    (128, {"rope_type": "default", "rope_theta": 500000.0}, RopeConfig(500000.0)),
])
def test_frequencies_read_back_as_their_config(head_dim, rope, want):
    inv, scale = hf_inv_freq(head_dim, rope)
    got = fit_rope(RopeFreqs(inv.astype(np.float32).astype(np.float64), scale), head_dim, WHERE)
    assert got == want
    np.testing.assert_allclose(rope_math.inv_freq(got, head_dim)[0], inv, rtol=1e-6)


@pytest.mark.parametrize("case", ["yarn", "perturbed"])
def test_frequencies_of_no_known_scaling_are_refused_naming_the_node(case):
    if case == "yarn":   # attention_factor 1 so that the frequencies alone must give it away
        inv, _ = hf_inv_freq(64, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "attention_factor": 1.0,
                                  "original_max_position_embeddings": 2048})
    else:
        inv, _ = hf_inv_freq(64, LLAMA31)
        inv = inv * (1 + 0.01 * np.sin(np.arange(len(inv))))
    with pytest.raises(UnsupportedModel, match=r"^m\.onnx: node 'rope' \(RotaryEmbedding\) rotates by frequencies "
                                               r".* that follow no base theta"):
        fit_rope(RopeFreqs(inv, 1.0), 64, WHERE)
