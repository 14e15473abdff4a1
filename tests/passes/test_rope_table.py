"""The RoPE table and its on-the-fly fallback against the analytic rotary embedding.

Reference: transformers' own RoPE initialisation (``ROPE_INIT_FUNCTIONS``) for the frequencies
and attention factor of every scaling type, and float64 cos/sin of ``p * inv_freq`` for the
values. The fallback (positions at or past the table) is exercised through the CPU executor's
attention-op code path that reads the table.
"""

import numpy as np
import pytest
from tests_rope_configs import ROPES
from tiny_llama import hf_config_dict, tiny_config, tiny_weights

from grokc.compiler.trace import trace_module
from grokc.core import rope as rope_math
from grokc.passes import fuse_attention, rope_table
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


def rope_tabled(cfg, length: int):
    """The tiny model traced, its attention fused, then the RoPE pass: the table the pass stores."""
    module = fuse_attention.run(trace_module(cfg, tiny_weights(cfg)))
    return rope_table.run(module, rope_table.RopeTableConfig(length))


@pytest.mark.parametrize("name", ROPES)
def test_table_and_fallback_match_analytic(name):
    cfg = tiny_config(rope=ROPES[name], max_position_embeddings=4096)
    length = 100
    module = rope_tabled(cfg, length)
    table = np.asarray(module.params[rope_table.TABLE])              # the pass's own table, as stored
    assert table.shape == (length, cfg.head_dim // 2, 2) and table.dtype == np.float32
    readers = [n for g in module.graphs.values() for n in g.nodes if "rope_table" in n.inputs]
    assert readers and all(n.inputs["rope_table"] == rope_table.TABLE for n in readers)
    assert module.meta.rope.table_length == length
    # the analytic rotary embedding: transformers' frequencies (test above), float64 cos/sin
    freqs, mscale = rope_math.inv_freq(cfg.rope, cfg.head_dim)
    assert module.meta.rope.mscale == pytest.approx(mscale)
    positions = np.array([0, 1, 57, 99, 100, 101, 1000, 4095])
    analytic = mscale * np.stack([np.cos(positions[:, None] * freqs), np.sin(positions[:, None] * freqs)], -1)
    inside = positions < length
    np.testing.assert_allclose(table[positions[inside]], analytic[inside], atol=1e-7)
    # past the table, the attention op computes from inv_freq: f32 angle p*inv_freq, ~p * 2**-24 rad
    args = {"rope_table": table, "inv_freq": np.asarray(module.params["rope_inv_freq"]), "head_dim": cfg.head_dim,
            "table_len": length, "mscale": module.meta.rope.mscale}
    cos, sin = cpu._rope_cos_sin(args, positions)
    np.testing.assert_allclose(cos[inside], analytic[inside, :, 0], atol=1e-7)
    np.testing.assert_allclose(sin[inside], analytic[inside, :, 1], atol=1e-7)
    tol = 4 * positions[~inside].max() * 2.0 ** -24 * mscale
    np.testing.assert_allclose(cos[~inside], analytic[~inside, :, 0], atol=tol)
    np.testing.assert_allclose(sin[~inside], analytic[~inside, :, 1], atol=tol)
