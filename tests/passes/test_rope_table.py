"""The RoPE tables and their on-the-fly fallback against the analytic rotary embedding: one table per
scaling type, Gemma 3's two (local and global bases), Phi-3's longrope switching factors at its
original context.

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
from grokc.core.config import RopeConfig, RopeType
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
    assert [r.table_length for r in module.meta.rope] == [length]
    # the analytic rotary embedding: transformers' frequencies (test above), float64 cos/sin
    freqs, mscale = rope_math.inv_freq(cfg.rope, cfg.head_dim)
    assert module.meta.rope[0].mscale == pytest.approx(mscale)
    positions = np.array([0, 1, 57, 99, 100, 101, 1000, 4095])
    analytic = mscale * np.stack([np.cos(positions[:, None] * freqs), np.sin(positions[:, None] * freqs)], -1)
    inside = positions < length
    np.testing.assert_allclose(table[positions[inside]], analytic[inside], atol=1e-7)
    # past the table, the attention op computes from inv_freq: f32 angle p*inv_freq, ~p * 2**-24 rad
    args = {"rope_table": table, "inv_freq": np.asarray(module.params["rope_inv_freq"]), "head_dim": cfg.head_dim,
            "table_len": length, "mscale": module.meta.rope[0].mscale}
    cos, sin = cpu._rope_cos_sin(args, positions)
    np.testing.assert_allclose(cos[inside], analytic[inside, :, 0], atol=1e-7)
    np.testing.assert_allclose(sin[inside], analytic[inside, :, 1], atol=1e-7)
    tol = 4 * positions[~inside].max() * 2.0 ** -24 * mscale
    np.testing.assert_allclose(cos[~inside], analytic[~inside, :, 0], atol=tol)
    np.testing.assert_allclose(sin[~inside], analytic[~inside, :, 1], atol=tol)


def analytic(theta: float, d: int, positions: np.ndarray, factors=None, scale: float = 1.0) -> np.ndarray:
    """``scale * (cos, sin)(p * theta ** (-2i / d) / factor_i)`` in float64, ``[P, d/2, 2]``."""
    freqs = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d) / (1.0 if factors is None else np.asarray(factors))
    a = positions[:, None].astype(np.float64) * freqs
    return scale * np.stack([np.cos(a), np.sin(a)], -1)


def test_local_layers_get_their_own_table():
    """Gemma 3: local layers (0, 1, 3) rotate by base 1e4, the global one (2) by 1e6; two tables,
    each the analytic embedding of its base."""
    cfg = tiny_config(num_layers=4, rope=RopeConfig(theta=1e6), rope_local=RopeConfig(theta=1e4),
                      sliding_window=5, local_layers=(0, 1, 3))
    module = rope_tabled(cfg, 64)
    tables = {r.name: r for r in module.meta.rope}
    assert sorted(tables) == ["rope_table", "rope_table_local"]
    read = {n.attrs.layer: (n.inputs["rope_table"], n.inputs["inv_freq"]) for g in module.graphs.values()
            for n in g.nodes if "rope_table" in n.inputs}
    assert read == {0: ("rope_table_local", "rope_inv_freq_local"), 1: ("rope_table_local", "rope_inv_freq_local"),
                    2: ("rope_table", "rope_inv_freq"), 3: ("rope_table_local", "rope_inv_freq_local")}
    positions = np.arange(64)
    for name, theta in (("rope_table", 1e6), ("rope_table_local", 1e4)):
        np.testing.assert_allclose(module.params[name], analytic(theta, cfg.head_dim, positions), atol=1e-7)
    windows = {n.attrs.layer: n.attrs.window for g in module.graphs.values() for n in g.nodes if "rope_table" in n.inputs}
    assert windows == {0: 5, 1: 5, 2: 0, 3: 5}


def test_longrope_switches_at_the_original_context():
    """Phi-3 128k style: positions below original_max_position_embeddings rotate by the short factors,
    the others by the long ones, cos and sin times the attention factor sqrt(1 + ln(s) / ln(orig)); the
    frequencies are transformers' own on either side of the switch."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, orig, max_pos = 16, 16, 128
    short, long = [1.0 + 0.1 * i for i in range(d // 2)], [1.0 + 0.9 * i for i in range(d // 2)]
    attn = float(np.sqrt(1 + np.log(max_pos / orig) / np.log(orig)))
    rope = RopeConfig(theta=1e4, type=RopeType.LONGROPE, factor=max_pos / orig, original_max_position_embeddings=orig,
                      attention_factor=attn, short_factor=tuple(short), long_factor=tuple(long))
    cfg = tiny_config(rope=rope, max_position_embeddings=max_pos)
    module = rope_tabled(cfg, 100)
    (record,) = module.meta.rope
    assert record.mscale == pytest.approx(attn)
    table = np.asarray(module.params[record.name])
    positions = np.arange(100)
    want = np.where(positions[:, None, None] < orig, analytic(1e4, d, positions, short, attn),
                    analytic(1e4, d, positions, long, attn))
    np.testing.assert_allclose(table, want, atol=1e-6)
    hf_cfg = transformers.Phi3Config(hidden_size=64, num_attention_heads=4, max_position_embeddings=max_pos,
                                     original_max_position_embeddings=orig,
                                     rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                                      "short_factor": short, "long_factor": long})
    for seq_len, factors in ((orig, short), (orig + 1, long)):
        freqs, scale = ROPE_INIT_FUNCTIONS["longrope"](hf_cfg, "cpu", seq_len=seq_len)
        np.testing.assert_allclose(freqs.double().numpy(), 1e4 ** (-np.arange(0, d, 2) / d) / np.asarray(factors),
                                   rtol=1e-6)
        assert scale == pytest.approx(attn, rel=1e-6)
