"""Rung 1 of the correctness ladder: grokc's torch Llama equals transformers' LlamaForCausalLM.

Same random weights, every RoPE scaling type grokc supports; fp32, so the only differences are
summation order (threads, BLAS blocking) and RoPE angles in float64 (ours) vs float32 (theirs): 1e-3
relative to the logits' RMS.
"""

import numpy as np
import pytest
import torch
from tests_rope_configs import ROPES
from tiny_llama import hf_config_dict, hf_named, tiny_config, tiny_weights

from grokc.compiler.quality import reference_model

transformers = pytest.importorskip("transformers")

@pytest.mark.parametrize("rope", ROPES, ids=list(ROPES))
@pytest.mark.parametrize("tied", [True, False])
def test_torch_model_matches_transformers(rope, tied):
    cfg = tiny_config(rope=ROPES[rope], tie_word_embeddings=tied)
    weights = tiny_weights(cfg, seed=3)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_config_dict(cfg))).eval()
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in hf_named(cfg, weights).items()}, strict=not tied)
    ours = reference_model(cfg, weights)
    tokens = torch.from_numpy(np.random.default_rng(1).integers(0, cfg.vocab_size, 300)).to(torch.int32)
    with torch.no_grad():
        want = hf(tokens[None].long()).logits[0].numpy()
        got = ours(tokens, torch.arange(300, dtype=torch.int32)).numpy()
    rms = np.sqrt((want ** 2).mean())
    assert np.abs(got - want).max() / rms < 1e-3
