"""onnxruntime-genai model-builder graphs of tiny random Llamas and a Qwen2 -> grokc, against onnxruntime.

The builder writes GroupQueryAttention with rotary folded in, (Skip)SimplifiedLayerNormalization,
MatMulNBits int4 weights and, with shared embeddings, a GatherBlockQuantized table. References:
the Hugging Face config.json the model came from (the architecture read from the graph must equal
it), onnxruntime on the same file (logits within 2e-2 of their RMS after the prompt and at each
decode step, MatMulNBits at accuracy_level 0; greedy tokens identical), and onnxruntime's own
dequantized MatMulNBits weights (each node run alone on the identity): the f32 weights grokc reads
equal them, and the int4 weights it carries hold onnxruntime's codes and scales (f16-rounded).
The Qwen2 graph adds its packed q|k|v bias after the MatMulNBits: the same comparisons, and the same
model with the bias moved into MatMulNBits' own bias input (onnxruntime computes the same logits from
both) reads as the same weights. A bias added to the output projection, which grokc's decoders do not
have, is refused naming its Add.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from graph_exports import (
    build,
    build_genai,
    exact,
    hf_folder,
    ort_dequantized,
    ort_greedy,
    ort_quantize,
    ort_steps,
    plan_steps,
    rel_err,
)

from grokc.abi import int4
from grokc.artifacts.store import open_artifact
from grokc.compiler.frontends import load_model
from grokc.core.errors import UnsupportedModel
from grokc.runner import Runner, SamplingParams

TOL = 2e-2
D = 16   # head_dim of the tiny models


@pytest.fixture(scope="module")
def genai(tmp_path_factory):
    root = tmp_path_factory.mktemp("genai")
    folder = hf_folder(root / "hf", seed=5)
    tied = hf_folder(root / "hf_tied", seed=6, tie_word_embeddings=True)
    qwen2 = hf_folder(root / "hf_qwen2", family="qwen2", seed=7, rope_theta=1000000.0)
    cache = root / "cache"
    return {"hf": folder, "hf_tied": tied, "hf_qwen2": qwen2, "qwen2": build_genai(qwen2, root / "qwen2", "int4", cache),
            "fp32": build_genai(folder, root / "fp32", "fp32", cache),
            "int4": build_genai(folder, root / "int4", "int4", cache),
            "tied": build_genai(tied, root / "tied", "int4", cache, shared_embeddings="true")}


@pytest.fixture(scope="module")
def built(genai, tmp_path_factory):
    root = tmp_path_factory.mktemp("genai_art")
    return {"fp32": build(load_model(genai["fp32"]), root / "fp32"),
            "int4": build(load_model(genai["int4"]), root / "int4", quant="int4", lm_head="int4"),
            "tied": build(load_model(genai["tied"]), root / "tied", quant="int4-rtn"),
            "qwen2": build(load_model(genai["qwen2"]), root / "qwen2", quant="int4", lm_head="int4")}


@pytest.mark.parametrize("which,hf", [("fp32", "hf"), ("int4", "hf"), ("tied", "hf_tied"), ("qwen2", "hf_qwen2")])
def test_architecture_is_the_models(genai, which, hf):
    loaded, ref = load_model(genai[which]), load_model(genai[hf])
    assert loaded.config == ref.config
    if which == "fp32":
        for name, w in ref.weights.items():
            np.testing.assert_array_equal(loaded.weights[name], w, err_msg=name)


@pytest.mark.parametrize("which", ["fp32", "int4", "tied", "qwen2"])
def test_prefill_and_decode_logits_match_onnxruntime(genai, built, which):
    tokens = [int(t) for t in np.random.default_rng(7).integers(4, 192, 12)]
    got = plan_steps(built[which], tokens, prompt=8)
    want = ort_steps(exact(genai[which]), tokens, prompt=8, head_dim=D)
    errs = [rel_err(g, w) for g, w in zip(got, want)]
    assert len(errs) == 5 and max(errs) < TOL, errs


@pytest.mark.parametrize("which", ["fp32", "int4", "qwen2"])
def test_greedy_fp16_tokens_match_onnxruntime(genai, built, which):
    prompt = [int(t) for t in np.random.default_rng(8).integers(4, 192, 6)]
    got = Runner(built[which], device="cpu").generate_ids([prompt], SamplingParams(max_new_tokens=10))[0]
    assert got == ort_greedy(exact(genai[which]), prompt, 10, head_dim=D, eos=(2,))


def _edited(path: Path, out: str, edit) -> Path:
    """A copy of the builder's graph beside it, ``edit(graph)`` applied (the weights file shared)."""
    model = onnx.load(str(path), load_external_data=False)
    edit(model.graph)
    onnx.save(model, str(path.with_name(out)))
    return path.with_name(out)


def _bias_into_matmulnbits(g: onnx.GraphProto) -> None:
    """Each MatMulNBits + Add of a bias becomes MatMulNBits with that bias as its input 5."""
    inits, producer = {t.name for t in g.initializer}, {o: n for n in g.node for o in n.output}
    for add in [n for n in g.node if n.op_type == "Add" and n.input[1] in inits
                and producer[n.input[0]].op_type == "MatMulNBits"]:
        mm = producer[add.input[0]]
        mm.input.extend([""] * (5 - len(mm.input)) + [add.input[1]])
        mm.output[0] = add.output[0]
        g.node.remove(add)


def _o_proj_bias(g: onnx.GraphProto) -> None:
    """Layer 0's output projection gets a bias (zeros, so onnxruntime's result would not change)."""
    mm = next(n for n in g.node if n.name == "/model/layers.0/attn/o_proj/MatMul_Q4")
    n = next(a.i for a in mm.attribute if a.name == "N")
    g.initializer.append(onnx.numpy_helper.from_array(np.zeros(n, np.float32), "o_bias"))
    out = mm.output[0]
    mm.output[0] = out + "/unbiased"
    g.node.insert(list(g.node).index(mm) + 1, onnx.helper.make_node("Add", [mm.output[0], "o_bias"], [out],
                                                                   name="/model/layers.0/attn/o_proj/Add"))


def test_matmulnbits_bias_input_is_the_same_model(genai):
    path = genai["qwen2"]
    moved = _edited(path, "bias_input.onnx", _bias_into_matmulnbits)
    nodes = onnx.load(str(moved), load_external_data=False).graph.node
    assert len([n for n in nodes if n.op_type == "MatMulNBits" and len(n.input) == 6]) == 2   # each layer's q|k|v
    tokens = [int(t) for t in np.random.default_rng(9).integers(4, 192, 9)]
    for a, b in zip(ort_steps(exact(moved), tokens, prompt=8, head_dim=D), ort_steps(exact(path), tokens, 8, D)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)   # onnxruntime: one model, two spellings
    ours, ref = load_model(moved), load_model(path)
    assert ours.config == ref.config and ours.config.qkv_bias and sorted(ours.weights) == sorted(ref.weights)
    for name, w in ref.weights.items():
        np.testing.assert_array_equal(ours.weights[name], w, err_msg=name)


def test_a_bias_grokc_has_no_place_for_is_refused_naming_the_node(genai):
    path = _edited(genai["qwen2"], "o_bias.onnx", _o_proj_bias)
    with pytest.raises(UnsupportedModel, match=r"node '/model/layers\.0/attn/o_proj/Add' \(Add\) adds a bias to the "
                                               r"attention's output projection; grokc's decoders have biases on the "
                                               r"q, k and v projections only"):
        load_model(path)


def _weight_of(name: str, weights: dict, tied: bool) -> np.ndarray:
    """The f32 weight [N, K] grokc read for the builder's MatMulNBits node ``name``."""
    if name.startswith("/lm_head"):
        return weights["token_embd.weight" if tied else "output.weight"]
    layer, proj = re.match(r"/model/layers\.(\d+)/\w+/(\w+)_proj/", name).groups()
    kinds = {"qkv": ["attn_q", "attn_k", "attn_v"], "o": ["attn_output"], "gate": ["ffn_gate"], "up": ["ffn_up"],
             "down": ["ffn_down"]}[proj]
    return np.concatenate([weights[f"blk.{layer}.{k}.weight"] for k in kinds])


@pytest.mark.parametrize("which", ["int4", "tied"])
def test_matmulnbits_weights_are_onnxruntimes(genai, which):
    loaded = load_model(genai[which])
    ort = ort_dequantized(genai[which])
    assert len(ort) == 11   # per layer: the packed q|k|v, o, gate, up, down; and the LM head
    for name, w in ort.items():
        np.testing.assert_allclose(_weight_of(name, loaded.weights, which == "tied"), w, rtol=1e-6, atol=1e-7,
                                   err_msg=name)


def test_carried_int4_holds_onnxruntimes_codes(genai, built):
    """The artifact's int4 weights, dequantized as the kernels do, are onnxruntime's up to the f16
    rounding of each block's scale; the manifest says every linear was carried, at group size 32."""
    art = open_artifact(built["int4"])
    quant = art.manifest.quant
    assert quant.carried == {"weights": 15, "source": ["MatMulNBits"], "group_sizes": [32], "symmetric": [True]}
    assert quant.recipe["rounding"] == "rtn"   # nothing for GPTQ to do: no calibration ran
    stored = art.weights()
    dense = {base: int4.dequantize(np.asarray(stored[f"{base}.qweight"]), np.asarray(stored[f"{base}.scales"]),
                                   None, 32) for base in {k.rsplit(".", 1)[0] for k in stored if k.endswith(".qweight")}}
    for name, w in ort_dequantized(genai["int4"]).items():
        if name.startswith("/lm_head"):
            got = dense["output"]
        else:
            layer, proj = re.match(r"/model/layers\.(\d+)/\w+/(\w+)_proj/", name).groups()
            fused = {"qkv": "attn_qkv", "o": "attn_output", "gate": "ffn_gate_up", "up": "ffn_gate_up",
                     "down": "ffn_down"}[proj]
            got = dense[f"blk.{layer}.{fused}"]
            if proj in ("gate", "up"):
                got = got[: len(got) // 2] if proj == "gate" else got[len(got) // 2:]
        np.testing.assert_allclose(got, w, rtol=2 ** -11, atol=1e-7, err_msg=name)


@pytest.fixture(scope="module")
def requantized(genai, tmp_path_factory):
    """The fp32 graph quantized by onnxruntime's own MatMulNBits quantizer at other block sizes and bits."""
    root = tmp_path_factory.mktemp("nbits")
    fp32 = genai["fp32"]
    return {key: ort_quantize(fp32, root / f"{key}.onnx", bits, bs, sym) for key, (bits, bs, sym) in {
        "g64_asym": (4, 64, False), "g128": (4, 128, True), "g16": (4, 16, True), "int8": (8, 32, True)}.items()}


@pytest.mark.parametrize("key,carried,groups", [("g64_asym", True, {0, 64}), ("g128", True, {0}), ("g16", False, None),
                                                ("int8", False, None)])
def test_block_sizes_grokc_keeps_and_those_it_requantizes(genai, requantized, key, carried, groups):
    """Blocks covering K (64 for q/k/v/o/gate/up) are one scale per output channel (group 0); the down
    projection's K = 96 is two blocks of 64, the last one padded."""
    notes = []
    loaded = load_model(requantized[key], progress=notes.append, tokenizer=genai["fp32"].parent)
    grids = loaded.module.meta.carried
    assert (len(grids) == 15) == carried and any("re-quantized" in n for n in notes) != carried
    if carried:
        assert {g.group_size for g in grids.values()} == groups
        assert all((g.zeros is None) == (key != "g64_asym") for g in grids.values())
    ort = ort_dequantized(requantized[key])
    for name, w in ort.items():
        np.testing.assert_allclose(_weight_of(name, loaded.weights, False), w, rtol=1e-6, atol=1e-7, err_msg=name)
