"""The PyTorch baseline's prefill (``cli/baselines.TorchDecoder.prefill``, the model ``grokc bench``
times a prompt's first token with) computes what its decode step computes token by token: the same
last-token logits and the same cache rows, on the CPU in float16 (a tiny random config), to fp16 rounding."""

from __future__ import annotations

import torch

from grokc.cli.baselines import TorchDecoder
from grokc.core.config import ModelConfig, RopeConfig


def test_prefill_equals_the_decode_steps_it_replaces():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5, rope=RopeConfig(),
                      max_position_embeddings=32, tie_word_embeddings=False)
    tokens = torch.randint(0, 64, (7,))
    stepped = TorchDecoder(cfg, 1, 16, device="cpu")
    model = TorchDecoder(cfg, 1, 16, device="cpu")
    for name in ("embed", "head", "final_norm"):
        setattr(model, name, getattr(stepped, name))
    model.layers = stepped.layers
    for t in range(len(tokens)):
        want = stepped(tokens[t:t + 1], torch.tensor([t]))
    got = model.prefill(tokens)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for kc, kd in zip(model.k_cache, stepped.k_cache):
        torch.testing.assert_close(kc[0, :, :7], kd[0, :, :7], rtol=1e-2, atol=1e-2)
