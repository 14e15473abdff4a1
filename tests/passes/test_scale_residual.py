"""passes/scale_residual.py on a tiny traced Gemma 3 block (the logits against transformers, past
the f16 range: tests/models/test_gemma3_f16_range.py): what it rewrites, what the quality report
reads back, and the graphs it refuses."""

import numpy as np
import pytest
from tiny_llama import tiny_config, tiny_weights

from grokc.compiler.quality import stored_weights
from grokc.compiler.trace import trace_module
from grokc.core.config import Activation
from grokc.core.errors import UnsupportedModel
from grokc.core.ir import OpKind, verify
from grokc.passes import fuse_attention, fuse_epilogues, fuse_mlp, scale_residual

S = 2.0 ** -4


def fused(**variant):
    cfg = tiny_config(**variant)
    return fuse_epilogues.run(fuse_mlp.run(fuse_attention.run(trace_module(cfg, tiny_weights(cfg)))))


def gemma_like():
    return fused(architecture="gemma3", post_norms=True, qk_norm=True, activation=Activation.GELU_TANH,
                 embedding_scale=8.0)


def test_stream_scaled_and_its_norms_follow():
    before = gemma_like()
    after = scale_residual.run(before, 4)
    verify(after)
    old, new = ({n.name: n for n in m.graphs["forward"].nodes} for m in (before, after))
    assert new["token_embd"].attrs.scale == 8.0 * S
    eps = before.config.rms_norm_eps
    for name in ("blk.0.attn_qkv", "blk.1.ffn_gate_up", "output"):      # pre-norms and the final norm
        assert new[name].attrs.norm_eps == eps * S * S, name
    post = [n for n in new.values() if n.op is OpKind.RMS_NORM]
    assert len(post) == 4 and all("residual" in n.inputs and n.attrs.eps == eps for n in post)
    for n in post:
        np.testing.assert_array_equal(after.params[n.inputs["weight"]], before.params[n.inputs["weight"]] * np.float32(S))
    unchanged = [k for k in old if k not in {"token_embd", "blk.0.attn_qkv", "blk.1.attn_qkv", "blk.0.ffn_gate_up",
                                             "blk.1.ffn_gate_up", "output"} | {n.name for n in post}]
    assert all(old[k] == new[k] for k in unchanged)
    assert after.meta.residual_scale == S


def test_quality_report_reads_the_unscaled_model():
    before = gemma_like()
    want, got = stored_weights(before), stored_weights(scale_residual.run(before, 4))
    assert sorted(want) == sorted(got)
    assert all(want[k].tobytes() == got[k].tobytes() for k in want)


def test_shift_zero_is_the_identity():
    m = gemma_like()
    assert scale_residual.run(m, 0) is m


def test_refuses_a_linear_adding_into_the_stream():
    with pytest.raises(UnsupportedModel, match="blk.0.attn_output reads the residual stream as residual"):
        scale_residual.run(fused(), 4)   # Llama: the o projection adds its product into the stream
