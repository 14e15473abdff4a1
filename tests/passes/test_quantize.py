"""The quantize pass (passes/quantize.py): which parameters it writes, under which names, in which format."""

import numpy as np
import pytest
from quant_oracles import int8_reference

from grokc.abi import int4, int8
from grokc.core.ir import WeightFormat
from grokc.quant.calibration import Calibration
from grokc.quant.recipe import QuantRecipe, Rounding
from grokc.quant.weights import dequantized_embedding, dequantized_weight


def traced_tiny():
    from tiny_llama import tiny_config, tiny_weights

    from grokc.compiler.trace import trace_module

    cfg = tiny_config()   # tied LM head
    return trace_module(cfg, tiny_weights(cfg))


@pytest.mark.parametrize("fmt,head", [(WeightFormat.Q4, WeightFormat.F16), (WeightFormat.Q8, WeightFormat.F16),
                                      (WeightFormat.Q4, WeightFormat.Q4), (WeightFormat.F16, WeightFormat.F16)])
def test_pass_quantizes_the_table_and_a_tied_head_keeps_its_own_weights(fmt, head):
    from grokc.core.ir import OpKind, verify
    from grokc.passes import quantize

    m = traced_tiny()
    table_f32 = np.asarray(m.params["token_embd.weight"])
    recipe = QuantRecipe("int4-rtn", WeightFormat.Q4, group_size=32, symmetric=False, lm_head=head, embeddings=fmt)
    q = quantize.run(m, recipe)
    verify(q)
    g = q.graphs["forward"]
    emb = next(n for n in g.nodes if n.op is OpKind.EMBEDDING)
    lm = next(n for n in g.nodes if n.outputs[0] in g.outputs)
    assert emb.attrs.weight_format is fmt and q.meta.quant.recipe["embeddings"] == fmt.value
    if fmt is WeightFormat.F16:       # shared, as before
        assert emb.inputs["table"] == lm.inputs["weight"] == "token_embd.weight"
        return
    codes_name = "token_embd.qweight" if fmt is WeightFormat.Q4 else "token_embd.q8weight"
    assert emb.inputs["table"] == codes_name and emb.inputs["scales"] == "token_embd.scales"
    assert ("zeros" in emb.inputs) == (fmt is WeightFormat.Q4)    # int8 is always symmetric
    assert emb.attrs.group_size == (32 if fmt is WeightFormat.Q4 else 0)
    assert "token_embd.weight" not in q.params                     # token_embd.* is what the embedding reads
    zeros = q.params.get("token_embd.zeros")
    deq = (int4 if fmt is WeightFormat.Q4 else int8).dequantize(q.params[codes_name], q.params["token_embd.scales"],
                                                                zeros, emb.attrs.group_size)
    np.testing.assert_array_equal(deq, dequantized_embedding(table_f32, recipe))
    if head is WeightFormat.F16:   # the f16 table, as the head's own weight
        assert lm.inputs["weight"] == "output.weight"
        np.testing.assert_array_equal(q.params["output.weight"], table_f32.astype(np.float16))
    else:
        assert lm.inputs["qweight"] == "output.qweight" and "output.weight" not in q.params


def _head_and_table(q):
    from grokc.core.ir import OpKind

    g = q.graphs["forward"]
    return (next(n for n in g.nodes if n.outputs[0] in g.outputs),
            next(n for n in g.nodes if n.op is OpKind.EMBEDDING))


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("embeddings", [WeightFormat.F16, WeightFormat.Q8, WeightFormat.Q4])
def test_pass_int8_head_is_per_channel_rtn_of_the_tied_table_which_keeps_its_format(symmetric, embeddings):
    from grokc.core.ir import verify
    from grokc.passes import quantize

    m = traced_tiny()   # tied: the head reads token_embd.weight
    source = np.asarray(m.params["token_embd.weight"])
    recipe = QuantRecipe("int4-rtn", WeightFormat.Q4, group_size=32, symmetric=symmetric, lm_head=WeightFormat.Q8,
                         embeddings=embeddings)
    q = quantize.run(m, recipe)
    verify(q)
    lm, emb = _head_and_table(q)
    assert lm.attrs.weight_format is WeightFormat.Q8 and lm.attrs.group_size == 0 and q.meta.quant.recipe["lm_head"] == "q8"
    # a symmetric int8 head of an int8 table reads the table's own codes and scales: stored once
    base = "token_embd" if symmetric and embeddings is WeightFormat.Q8 else "output"
    assert lm.inputs["qweight"] == f"{base}.q8weight" and lm.inputs["scales"] == f"{base}.scales"
    assert ("output.q8weight" in q.params) == (base == "output")
    assert ("zeros" in lm.inputs) == (not symmetric) and "weight" not in lm.inputs
    assert not any(r.startswith("residual") for r in lm.inputs)
    codes = q.params[f"{base}.q8weight"]
    assert codes.dtype == np.uint8 and codes.shape == source.shape and q.params[f"{base}.scales"].shape == (source.shape[0], 1)
    deq = int8.dequantize(codes, q.params[f"{base}.scales"], q.params.get(f"{base}.zeros"), 0)
    np.testing.assert_allclose(deq, int8_reference(source, symmetric), rtol=1e-6, atol=1e-7)
    # the embedding table keeps its own format, under token_embd.*
    assert emb.attrs.weight_format is embeddings
    if embeddings is WeightFormat.F16:
        assert emb.inputs["table"] == "token_embd.weight"
        np.testing.assert_array_equal(q.params["token_embd.weight"], source.astype(np.float16))
    else:
        assert emb.inputs["table"].startswith("token_embd.") and "token_embd.weight" not in q.params


def test_gptq_recipe_with_int8_head_runs_gptq_on_the_body_only():
    """A calibrated recipe: every body linear is GPTQ-rounded with its statistics (so it differs from
    round-to-nearest), the int8 head is round-to-nearest and needs no statistics of its own."""
    from grokc.core import tensors as names
    from grokc.core.ir import OpKind
    from grokc.passes import quantize

    m = traced_tiny()
    rng = np.random.default_rng(0)
    linears = [n for n in m.graphs["forward"].nodes if n.op is OpKind.LINEAR and n.outputs[0] not in m.graphs["forward"].outputs]
    hessians = {}
    for n in linears:
        k = m.params[n.inputs["weight"]].shape[1]
        x = rng.standard_normal((4 * k, k)).astype(np.float32) * np.linspace(0.2, 3, k, dtype=np.float32)
        hessians[names.input_key(n.inputs["weight"])] = x.T @ x / len(x)
    assert names.LM_HEAD not in hessians
    recipe = QuantRecipe("int4", WeightFormat.Q4, symmetric=False, rounding=Rounding.GPTQ,
                         lm_head=WeightFormat.Q8)
    q = quantize.run(m, recipe, Calibration(hessians))
    lm, _ = _head_and_table(q)
    np.testing.assert_allclose(int8.dequantize(q.params["output.q8weight"], q.params["output.scales"],
                                               q.params["output.zeros"], 0),
                               int8_reference(np.asarray(m.params["token_embd.weight"]), False), rtol=1e-6, atol=1e-7)
    for n in linears:
        base = n.inputs["weight"].removesuffix(".weight")
        w = np.asarray(m.params[n.inputs["weight"]])
        got = int4.dequantize(q.params[f"{base}.qweight"], q.params[f"{base}.scales"], q.params[f"{base}.zeros"], 0)
        want = dequantized_weight(w, recipe, hessians[names.input_key(n.inputs["weight"])])
        np.testing.assert_array_equal(got, want)
        assert not np.array_equal(got, dequantized_weight(w, recipe.uncalibrated()))
