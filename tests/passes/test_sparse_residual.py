"""The sparse_residual pass (passes/sparse_residual.py): the SPARSE_RESIDUAL node in front of each
corrected linear, feeding its addend."""

from dataclasses import replace

import numpy as np
import pytest
from tiny_llama import tiny_loaded

from grokc.compiler.build import compile_loaded
from grokc.compiler.pipeline import CompileOptions
from grokc.core.ir import OpKind, WeightFormat
from grokc.passes.static_shapes import StaticShapes
from grokc.quant.recipe import QUANT

SHAPES = StaticShapes(2, (16,), 64, 0)


@pytest.fixture(scope="module")
def corrected():
    """The tiny model with int4-rtn, int4 LM head and a 3% residual, through the whole pipeline."""
    recipe = replace(QUANT["int4-rtn"], fp16_residual=0.03, lm_head=WeightFormat.Q4)
    return compile_loaded(tiny_loaded(seed=0), CompileOptions(SHAPES, recipe), check_ir=True)


def test_every_int4_linear_gets_a_residual_node_feeding_its_addend(corrected):
    assert "sparse_residual" in corrected.meta.passes
    assert corrected.meta.quant.recipe["fp16_residual"] == 0.03
    for g in corrected.graphs.values():
        producers = g.producers()
        linears = [n for n in g.nodes if n.op is OpKind.LINEAR]
        assert linears and all(n.attrs.weight_format is WeightFormat.Q4 for n in linears)
        for n in linears:
            assert not any(r.startswith("residual_") for r in n.inputs)
            node = producers[n.inputs["addend"]]
            assert node.op is OpKind.SPARSE_RESIDUAL
            assert node.inputs["x"] == n.inputs["x"]                 # the prefill head: the last row only
            assert node.inputs.get("norm") == n.inputs.get("norm")
            assert node.attrs.norm_eps == (n.attrs.norm_eps if "norm" in n.inputs else None)
            base = n.inputs["qweight"].removesuffix(".qweight")
            assert node.inputs["vals"] == f"{base}.residual_vals"
            nw = corrected.params[n.inputs["qweight"]].shape[0]
            assert g.tensors[n.inputs["addend"]].shape == (g.tensors[n.inputs["x"]].shape[0], nw)
            assert corrected.params[node.inputs["rowptr"]].shape == (nw + 1,)
            k = corrected.params[n.inputs["qweight"]].shape[1] * 2
            assert corrected.params[node.inputs["cols"]].size == int(np.floor(0.03 * nw * k + 0.5))


def test_budget_zero_leaves_the_module_as_without_the_option():
    loaded = tiny_loaded(seed=0)
    plain = compile_loaded(loaded, CompileOptions(SHAPES, QUANT["int4-rtn"]))
    zero = compile_loaded(loaded, CompileOptions(SHAPES, replace(QUANT["int4-rtn"], fp16_residual=0.0)))
    assert plain.meta.passes == zero.meta.passes and "sparse_residual" not in zero.meta.passes
    assert plain.meta.quant == zero.meta.quant and "fp16_residual" not in zero.meta.quant.recipe
    assert sorted(plain.params) == sorted(zero.params)
    assert not any("residual_" in name for name in zero.params)
    for name in plain.params:
        np.testing.assert_array_equal(plain.params[name], zero.params[name])
    assert plain.graphs == zero.graphs
