"""``passes/fuse_moe.py`` and ``passes/quantize_moe.py`` on a traced tiny mixture of experts.

- structure: each MOE with its norm and residual add becomes the router LINEAR (norm folded, f32
  out), MOE_ROUTE, MOE_GATHER, MOE_LINEAR (gate_up, silu_mul), MOE_LINEAR (down, f32) and
  MOE_COMBINE (the residual folded, the ADD's name kept);
- a shared expert split into chunks of the experts' size (zero-padded) computes the same MLP: the
  sum of the chunks' SwiGLU MLPs equals the shared one's (numpy, 1e-5), and ``canonical_weights``
  gives back exactly the weights that went in;
- synthetic zero placeholders stay placeholders through the restacking (no memory);
- quantize_moe: the router stays f16, every expert is its own per-channel int4 grid: expert e's
  row n of the round-to-nearest build has scale ``max|w[e, n]| / 7`` and codes within half a
  step of the weights.
"""

from __future__ import annotations

import numpy as np
from tiny_moe import moe_config, moe_weights

from grokc.abi import int4
from grokc.compiler.trace import trace_module
from grokc.core.ir import Act, DType, OpKind, WeightFormat, verify
from grokc.passes import fuse_moe, quantize_moe
from grokc.quant.recipe import QUANT

CFG = moe_config("mixtral")


def _fused(seed: int = 0):
    return fuse_moe.run(trace_module(CFG, moe_weights(CFG, seed)))


def test_each_moe_becomes_the_routed_launches():
    m = _fused()
    verify(m)
    g = m.graphs["forward"]
    assert not any(n.op is OpKind.MOE or n.name.endswith("ffn_norm") for n in g.nodes)
    ops = [n.op for n in g.nodes if n.name.startswith("blk.0.moe")]
    assert ops == [OpKind.LINEAR, OpKind.MOE_ROUTE, OpKind.MOE_GATHER, OpKind.MOE_LINEAR, OpKind.MOE_LINEAR,
                   OpKind.MOE_COMBINE]
    router, route, gather, gate_up, down, combine = (n for n in g.nodes if n.name.startswith("blk.0.moe"))
    assert router.inputs["norm"] == "blk.0.ffn_norm.weight" and router.attrs.out_dtype is DType.F32
    assert gather.inputs["norm"] == "blk.0.ffn_norm.weight" and gather.inputs["x"] == router.inputs["x"]
    assert gate_up.attrs.act is Act.SILU_MUL and down.attrs.act is Act.NONE and down.attrs.out_dtype is DType.F32
    assert combine.inputs["residual"] == router.inputs["x"] and combine.outputs == ("blk.0.add.1",)
    assert route.attrs.top_k == 2 and route.attrs.slots == 2 and route.attrs.n_shared == 0
    stacked = m.params[gate_up.inputs["weight"]]
    w = moe_weights(CFG, 0)
    np.testing.assert_array_equal(stacked[3], np.concatenate([w["blk.0.ffn_gate_exps.weight"][3],
                                                              w["blk.0.ffn_up_exps.weight"][3]]))


def _swiglu(x, gate, up, down):
    g = x @ gate.T
    return (g / (1 + np.exp(-g)) * (x @ up.T)) @ down.T


def test_shared_expert_chunks_compute_the_shared_mlp():
    rng = np.random.default_rng(0)
    e, inter, hidden, shared = 3, 16, 24, 40          # 3 chunks of 16, the last padded by 8
    routed = [rng.standard_normal(s) for s in ((e, inter, hidden), (e, inter, hidden), (e, hidden, inter))]
    s_gate, s_up, s_down = (rng.standard_normal(s) for s in ((shared, hidden), (shared, hidden), (hidden, shared)))
    gate, up, down = fuse_moe.with_shared(*routed, s_gate, s_up, s_down)
    assert gate.shape == (e + 3, inter, hidden) and down.shape == (e + 3, hidden, inter)
    x = rng.standard_normal((5, hidden))
    chunks = sum(_swiglu(x, gate[j], up[j], down[j]) for j in range(e, e + 3))
    np.testing.assert_allclose(chunks, _swiglu(x, s_gate, s_up, s_down), rtol=1e-5, atol=1e-9)
    back = fuse_moe.canonical_weights(0, rng.standard_normal((e + 1, hidden)), np.concatenate([gate, up], 1), down,
                                      e, shared)
    for kind, want in (("ffn_gate_shexp", s_gate), ("ffn_up_shexp", s_up), ("ffn_down_shexp", s_down),
                       ("ffn_gate_exps", routed[0]), ("ffn_up_exps", routed[1]), ("ffn_down_exps", routed[2])):
        np.testing.assert_array_equal(back[f"blk.0.{kind}.weight"], want, err_msg=kind)


def test_placeholders_stay_placeholders():
    zero = np.zeros((), np.float32)
    parts = [np.broadcast_to(zero, s) for s in ((8, 64, 32), (8, 64, 32), (8, 32, 64), (100, 32), (100, 32), (32, 100))]
    for w in fuse_moe.with_shared(*parts):
        assert not any(w.strides) and w.shape[0] == 10


def test_quantize_moe_keeps_the_router_f16_and_quantizes_each_expert():
    m = quantize_moe.run(_fused(seed=1), QUANT["int4-rtn"])
    g = m.graphs["forward"]
    router = next(n for n in g.nodes if n.name == "blk.1.moe.router")
    assert router.attrs.weight_format is WeightFormat.F16 and m.params[router.inputs["weight"]].dtype == np.float16
    down = next(n for n in g.nodes if n.name == "blk.1.moe.down")
    assert down.attrs.weight_format is WeightFormat.Q4 and "weight" not in down.inputs
    w = moe_weights(CFG, 1)["blk.1.ffn_down_exps.weight"]                      # [E, H, I]
    q, s = m.params[down.inputs["qweight"]], m.params[down.inputs["scales"]]
    assert q.shape == (4, CFG.hidden_size, CFG.moe.expert_size // 2) and s.shape == (4, CFG.hidden_size, 1)
    for e in range(4):
        want = np.abs(w[e]).max(1, keepdims=True) / 7                          # symmetric per output channel
        np.testing.assert_allclose(s[e].astype(np.float32), want, rtol=1e-3)
        deq = int4.dequantize(q[e], s[e], None, 0)
        assert np.all(np.abs(deq - w[e]) <= s[e].astype(np.float32) * 0.5 + 1e-6)
