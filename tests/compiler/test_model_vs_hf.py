"""Rung 1 of the correctness ladder: grokc's torch Llama equals transformers' LlamaForCausalLM.

Same random weights, every RoPE scaling type grokc supports; fp32, so the only differences are
summation order and RoPE angles computed in float64 (ours) vs float32 (theirs): tolerance 1e-4
relative to the logits' RMS.
"""

import numpy as np
import pytest
import torch

from grokc.compiler.config import RopeConfig, RopeType
from grokc.compiler.quality import reference_model
from tiny_llama import hf_config_dict, tiny_config, tiny_weights

transformers = pytest.importorskip("transformers")

ROPES = {
    "default": RopeConfig(theta=10000.0),
    "linear": RopeConfig(theta=10000.0, type=RopeType.LINEAR, factor=2.0),
    "llama3": RopeConfig(theta=500000.0, type=RopeType.LLAMA3, factor=8.0, low_freq_factor=1.0,
                         high_freq_factor=4.0, original_max_position_embeddings=64),
    "yarn": RopeConfig(theta=10000.0, type=RopeType.YARN, factor=4.0, original_max_position_embeddings=128),
}


@pytest.mark.parametrize("rope", ROPES, ids=list(ROPES))
@pytest.mark.parametrize("tied", [True, False])
def test_torch_model_matches_transformers(rope, tied):
    cfg = tiny_config(rope=ROPES[rope], tie_word_embeddings=tied)
    weights = tiny_weights(cfg, seed=3)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_config_dict(cfg))).eval()
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=not tied)
    ours = reference_model(cfg, weights)
    tokens = torch.from_numpy(np.random.default_rng(1).integers(0, cfg.vocab_size, 300)).to(torch.int32)
    with torch.no_grad():
        want = hf(tokens[None].long()).logits[0].numpy()
        got = ours(tokens, torch.arange(300, dtype=torch.int32)).numpy()
    rms = np.sqrt((want ** 2).mean())
    assert np.abs(got - want).max() / rms < 1e-4
