"""The RoPE table and its on-the-fly fallback against the analytic rotary embedding.

Reference: transformers' own RoPE initialisation (``ROPE_INIT_FUNCTIONS``) for the frequencies
and attention factor of every scaling type, and float64 cos/sin of ``p * inv_freq`` for the
values. The fallback (positions at or past the table) is exercised through the CPU executor's
attention-op code path that reads the table.
"""

import numpy as np
import pytest
from tests_rope_configs import ROPES
from tiny_llama import hf_config_dict, tiny_config

from grokc.core import rope as rope_math
from grokc.core.ir import Module
from grokc.passes import rope_table
from grokc.runner import cpu

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402


@pytest.mark.parametrize("name", ROPES)
def test_frequencies_match_transformers(name):
    cfg = tiny_config(rope=ROPES[name], max_position_embeddings=1024)
    hf_cfg = transformers.LlamaConfig(**hf_config_dict(cfg))
    fn = ROPE_INIT_FUNCTIONS[hf_cfg.rope_parameters["rope_type"]] if name != "default" else None
    if fn is None:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        want, want_scale = LlamaRotaryEmbedding.compute_default_rope_parameters(hf_cfg)
    else:
        want, want_scale = fn(hf_cfg, "cpu")
    got, mscale = rope_math.inv_freq(cfg.rope, cfg.head_dim)
    np.testing.assert_allclose(got, want.double().numpy(), rtol=1e-6)
    assert mscale == pytest.approx(want_scale, rel=1e-6)


@pytest.mark.parametrize("name", ROPES)
def test_table_and_fallback_match_analytic(name):
    cfg = tiny_config(rope=ROPES[name], max_position_embeddings=4096)
    length = 100
    module = Module(config=cfg, graphs={}, params={})
    table = rope_table.run(module, rope_table.RopeTableConfig(length)).params.get(rope_table.TABLE)
    freqs, mscale = rope_math.inv_freq(cfg.rope, cfg.head_dim)
    positions = np.array([0, 1, 57, 99, 100, 101, 1000, 4095])
    analytic = mscale * np.stack([np.cos(positions[:, None] * freqs), np.sin(positions[:, None] * freqs)], -1)
    args = {"rope_table": np.asarray(table) if table is not None else rope_math.table(cfg.rope, cfg.head_dim, length),
            "inv_freq": freqs.astype(np.float32), "head_dim": cfg.head_dim, "table_len": length, "mscale": mscale}
    cos, sin = cpu._rope_cos_sin(args, positions)
    inside = positions < length
    # Inside the table: f32 rounding of float64 values. Past it: f32 angle p*inv_freq, ~p * 2**-24 rad.
    np.testing.assert_allclose(cos[inside], analytic[inside, :, 0], atol=1e-7)
    np.testing.assert_allclose(sin[inside], analytic[inside, :, 1], atol=1e-7)
    tol = 4 * positions[~inside].max() * 2.0 ** -24 * mscale
    np.testing.assert_allclose(cos[~inside], analytic[~inside, :, 0], atol=tol)
    np.testing.assert_allclose(sin[~inside], analytic[~inside, :, 1], atol=tol)
