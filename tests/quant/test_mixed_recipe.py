"""A mixed recipe (``QuantRecipe.fine``): the linears of the ``fine`` kinds are stored, in every block,
in groups of ``fine_group_size``, the rest as the recipe says. Checked through the quantize pass
against the loop oracle of round to nearest, and through sequential calibration against a
quantizer written out here."""

from dataclasses import replace

import numpy as np
import pytest
from calib_tiny import byte_loaded
from quant_oracles import reference

from grokc.abi import int4
from grokc.compiler.build import compile_loaded
from grokc.compiler.calibrate import CalibrationOptions, calibrate, collect, mix_windows
from grokc.compiler.pipeline import CompileOptions
from grokc.compiler.quality import reference_model
from grokc.compiler.text import calibration_texts
from grokc.core import tensors as names
from grokc.core.errors import BuildOptionError
from grokc.core.ir import OpKind, WeightFormat, verify
from grokc.passes.static_shapes import StaticShapes
from grokc.quant.recipe import QUANT, QuantRecipe
from grokc.quant.weights import dequantized_weight


def test_the_pass_stores_the_fine_kinds_in_groups_and_the_rest_per_channel():
    from tiny_llama import tiny_config, tiny_weights

    from grokc.compiler.trace import trace_module
    from grokc.passes import quantize

    cfg = tiny_config()
    m = trace_module(cfg, tiny_weights(cfg))
    recipe = QuantRecipe("mixed", WeightFormat.Q4, symmetric=True, fine=("ffn_down",), fine_group_size=32)
    q = quantize.run(m, recipe)
    verify(q)
    fine = 0
    for node in q.graphs["forward"].nodes:
        if node.op is not OpKind.LINEAR or node.outputs[0] in q.graphs["forward"].outputs:
            continue
        base = node.inputs["qweight"].removesuffix(".qweight")
        gs = 32 if base.endswith("ffn_down") else 0
        assert node.attrs.group_size == gs, base
        w = np.asarray(m.params[base + ".weight"], np.float32)
        deq = int4.dequantize(q.params[base + ".qweight"], q.params[base + ".scales"], None, gs)
        np.testing.assert_array_equal(deq, reference(w, gs, True))
        fine += gs > 0
    assert fine == cfg.num_layers
    assert q.meta.quant.recipe["fine"] == ["ffn_down"] and q.meta.quant.recipe["fine_group_size"] == 32


def test_sequential_calibration_quantizes_the_fine_kinds_in_groups():
    tiny = byte_loaded()
    recipe = replace(QUANT["int4-mixed"], fine_group_size=32)
    opts = CalibrationOptions(samples=2, tokens=48, sequential=True)
    got = calibrate(tiny, recipe, opts).hessians

    def by_hand(name, w, h):   # the mixed rule written out: down in groups of 32, the rest per channel
        gs = 32 if ".ffn_down." in name else 0
        return dequantized_weight(w, replace(QUANT["int4"], group_size=gs), h)

    from tokenizers import Tokenizer
    sources = calibration_texts()
    tok = Tokenizer.from_str(tiny.tokenizer_json)
    wins, _ = mix_windows([tok.encode(t.text).ids for t in sources], sources, opts)
    want = collect(reference_model(tiny.config, tiny.weights).requires_grad_(False), wins, by_hand)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    plain = collect(reference_model(tiny.config, tiny.weights).requires_grad_(False), wins,
                    lambda name, w, h: dequantized_weight(w, QUANT["int4"], h))
    last = names.LM_HEAD   # block 1's down in groups changes what the head's input sees
    assert not np.array_equal(got[last], plain[last])


def test_a_gptq_mixed_build_stores_down_in_groups_with_its_statistics():
    tiny = byte_loaded()
    recipe = replace(QUANT["int4-mixed"], fine_group_size=32)
    calib = calibrate(tiny, recipe, CalibrationOptions(samples=2, tokens=48, sequential=False))
    module = compile_loaded(tiny, CompileOptions(StaticShapes(2, (16,), 64, 0), recipe, calib))
    sizes = {n.inputs["qweight"].split(".")[2]: n.attrs.group_size for g in module.graphs.values()
             for n in g.nodes if n.op is OpKind.LINEAR and "qweight" in n.inputs}
    assert sizes == {"attn_qkv": 0, "attn_output": 0, "ffn_gate_up": 0, "ffn_down": 32}
    assert module.params["blk.0.ffn_down.scales"].shape == (tiny.config.hidden_size, tiny.config.intermediate_size // 32)
    again = compile_loaded(tiny, CompileOptions(StaticShapes(2, (16,), 64, 0), recipe, calib))
    for name, a in module.params.items():   # deterministic: the same bytes
        np.testing.assert_array_equal(np.asarray(again.params[name]), np.asarray(a), err_msg=name)


def test_recipes_without_fine_kinds_describe_themselves_as_before():
    assert "fine" not in QUANT["int4"].to_json() and "fine_group_size" not in QUANT["int4-g64"].to_json()
    assert QUANT["int4"].for_weight("blk.3.ffn_down.weight") is QUANT["int4"]
    fine = QUANT["int4-mixed"].for_weight("blk.3.ffn_down.weight")
    assert fine.group_size == 64 and not fine.fine
    assert QUANT["int4-mixed"].for_weight("blk.3.ffn_gate_up.weight").group_size == 0
    assert "ffn_down in groups of 64" in QUANT["int4-mixed"].summary


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(fine=("ffn_down",), fine_group_size=12), "fine_group_size 12"),
    (dict(fine=("ffn_down",), fine_group_size=0), "fine_group_size 0"),
    (dict(fine=("ffn_gate",)), "fine kind 'ffn_gate' cannot be stored finer"),
])
def test_a_bad_mixed_recipe_is_refused_in_one_sentence(kwargs, fragment):
    with pytest.raises(BuildOptionError, match=fragment):
        QuantRecipe("mixed", WeightFormat.Q4, **kwargs)
