"""The fusion passes turn each Llama layer into qkv-linear, attention, o-linear, gate_up-linear, down-linear."""

import numpy as np
from tiny_llama import tiny_config, tiny_weights

from grokc.compiler.trace import trace_module
from grokc.core.ir import Act, OpKind, verify
from grokc.passes import fuse_attention, fuse_epilogues, fuse_mlp


def traced():
    cfg = tiny_config()
    return trace_module(cfg, tiny_weights(cfg))


def test_layer_structure_after_fusion():
    m = fuse_epilogues.run(fuse_mlp.run(fuse_attention.run(traced())))
    verify(m)
    g = m.graphs["forward"]
    ops = [(n.op, n.name) for n in g.nodes]
    expected = [(OpKind.EMBEDDING, "token_embd")]
    for i in range(2):
        expected += [(OpKind.LINEAR, f"blk.{i}.attn_qkv"), (OpKind.ATTENTION, f"blk.{i}.attention"),
                     (OpKind.LINEAR, f"blk.{i}.attn_output"), (OpKind.LINEAR, f"blk.{i}.ffn_gate_up"),
                     (OpKind.LINEAR, f"blk.{i}.ffn_down")]
    expected.append((OpKind.LINEAR, "output"))
    assert ops == expected
    by_name = {n.name: n for n in g.nodes}
    qkv, o, gu, down = (by_name[f"blk.0.{k}"] for k in ("attn_qkv", "attn_output", "ffn_gate_up", "ffn_down"))
    assert qkv.inputs["norm"] == "blk.0.attn_norm.weight" and "residual" not in qkv.inputs
    assert o.inputs["residual"] == "token_embd" and "norm" not in o.inputs
    assert gu.inputs["norm"] == "blk.0.ffn_norm.weight" and gu.attrs.act is Act.SILU_MUL
    assert down.inputs["residual"] == o.outputs[0]
    assert by_name["output"].inputs["norm"] == "output_norm.weight"
    assert by_name["blk.0.attention"].attrs.fused_rope
    # Concatenated weights: q, k, v rows and gate, up rows, exactly.
    src = traced().params
    np.testing.assert_array_equal(m.params["blk.0.attn_qkv.weight"], np.concatenate(
        [src["blk.0.attn_q.weight"], src["blk.0.attn_k.weight"], src["blk.0.attn_v.weight"]]))
    np.testing.assert_array_equal(m.params["blk.0.ffn_gate_up.weight"], np.concatenate(
        [src["blk.0.ffn_gate.weight"], src["blk.0.ffn_up.weight"]]))
    assert "blk.0.attn_q.weight" not in m.params   # unreferenced weights are dropped


def test_passes_do_not_mutate_their_input():
    before = traced()
    snapshot = ({k: v.copy() for k, v in before.params.items()}, before.graphs["forward"])
    fuse_epilogues.run(fuse_mlp.run(fuse_attention.run(before)))
    assert before.graphs["forward"] is snapshot[1] and len(before.graphs["forward"].nodes) == len(snapshot[1].nodes)
    for k, v in snapshot[0].items():
        np.testing.assert_array_equal(before.params[k], v)
