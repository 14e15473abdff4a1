"""torch.onnx.export graphs of tiny random Llamas and a Qwen2 -> grokc, against onnxruntime running the same file.

Three exports: a Llama at opset 20 with ``past_key_values`` inputs and ``present`` outputs (the
decomposed graph: Pow/ReduceMean RMSNorm, Sin/Cos rotate-half RoPE, MatMul/Softmax attention), a
Llama at opset 23 without a cache, with tied embeddings and llama3 rope scaling (RMSNormalization,
RotaryEmbedding, Attention; ``graph_exports.LLAMA3_ROPE``), and a Qwen2 at opset 20 without a cache
(q/k/v biases: MatMul then Add of the bias).
The architecture read from each graph must equal what grokc's Hugging Face frontend reads from the
model's config.json (the rope scaling and the biases included), the IR must be the graph grokc's
tracer makes of that config, and the CPU plan's last-token logits must be onnxruntime's within 2e-2
of their RMS (f16 activations and weights: measured about 2e-3), after the prompt and at each decode
step; greedy fp16 tokens must be onnxruntime's."""

from __future__ import annotations

import numpy as np
import pytest
from graph_exports import LLAMA3_ROPE, build, export_torch, hf_folder, ort_greedy, ort_steps, plan_steps, rel_err

from grokc.compiler.frontends import load_model
from grokc.compiler.trace import trace_module
from grokc.runner import Runner, SamplingParams

TOL = 2e-2


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch_onnx")
    kv = hf_folder(root / "llama", seed=1)
    tied = hf_folder(root / "tied", seed=2, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_scaling=LLAMA3_ROPE)
    qwen2 = hf_folder(root / "qwen2", family="qwen2", seed=3)
    return {"kv": (kv, export_torch(kv, root / "llama_kv.onnx", cache=True)),
            "op23": (tied, export_torch(tied, root / "tied_op23.onnx", cache=False, opset=23)),
            "qwen2": (qwen2, export_torch(qwen2, root / "qwen2.onnx", cache=False))}


@pytest.fixture(scope="module")
def artifacts(exports, tmp_path_factory):
    root = tmp_path_factory.mktemp("torch_onnx_art")
    return {k: build(load_model(path, tokenizer=folder), root / k) for k, (folder, path) in exports.items()}


@pytest.mark.parametrize("which", ["kv", "op23", "qwen2"])
def test_architecture_and_ir_are_what_the_model_is(exports, which):
    folder, path = exports[which]
    loaded, hf = load_model(path, tokenizer=folder), load_model(folder)
    assert loaded.config == hf.config
    assert loaded.source_format == "onnx" and loaded.module is not None
    ref = trace_module(hf.config, hf.weights)
    ours, theirs = loaded.module.graphs["forward"], ref.graphs["forward"]
    assert ours.nodes == theirs.nodes and dict(ours.tensors) == dict(theirs.tensors)
    assert sorted(loaded.module.params) == sorted(ref.params)
    for name, w in ref.params.items():   # the exporter's constant-folded W^T, back to [out, in]
        np.testing.assert_array_equal(loaded.module.params[name], w, err_msg=name)


@pytest.mark.parametrize("which", ["kv", "op23", "qwen2"])
def test_prefill_and_decode_logits_match_onnxruntime(exports, artifacts, which):
    folder, path = exports[which]
    tokens = [int(t) for t in np.random.default_rng(3).integers(4, 192, 12)]
    got = plan_steps(artifacts[which], tokens, prompt=8)
    want = ort_steps(path, tokens, prompt=8, head_dim=16)
    errs = [rel_err(g, w) for g, w in zip(got, want)]
    assert len(errs) == 5 and max(errs) < TOL, errs


@pytest.mark.parametrize("which", ["kv", "op23", "qwen2"])
def test_greedy_fp16_tokens_match_onnxruntime(exports, artifacts, which):
    folder, path = exports[which]
    prompt = [int(t) for t in np.random.default_rng(4).integers(4, 192, 6)]
    got = Runner(artifacts[which], device="cpu").generate_ids([prompt], SamplingParams(max_new_tokens=10))[0]
    assert got == ort_greedy(path, prompt, 10, head_dim=16, eos=(2,))
