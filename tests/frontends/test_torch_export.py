"""torch.export programs of tiny random transformers models -> grokc, against eager transformers (fp32).

Four ways in: a Llama program (tied embeddings, llama3 rope scaling: ``graph_exports.LLAMA3_ROPE``)
and a Qwen2 program (q/k/v biases: ``aten.linear`` with a bias) saved with ``torch.export.save``
(``grokc build model.pt2``), and through the Python API (``load_module`` with example inputs) a
``LlamaForCausalLM`` and a user's own Llama-like module (``own_llama.py``, transformers' weights, so
transformers is its reference too). The architecture read from each ATen graph must equal what
grokc's Hugging Face frontend reads from config.json, the IR must be the graph grokc's tracer makes
of that config with the same parameters, and the CPU plan's last-token logits must be eager torch's
within 2e-2 of their RMS (f16 activations and weights: measured about 2e-3), after the prompt and at
each decode step; greedy fp16 tokens must be eager torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from graph_exports import (
    LLAMA3_ROPE,
    NoCache,
    build,
    hf_folder,
    hf_model,
    plan_steps,
    rel_err,
    torch_greedy,
    torch_steps,
)
from own_llama import from_hf

from grokc.compiler.frontends import load_model
from grokc.compiler.frontends.torch_export import load_module
from grokc.compiler.trace import trace_module
from grokc.core.errors import UnsupportedModel

TOL = 2e-2


def save_pt2(folder, path):
    model = hf_model(folder)
    seq = torch.export.Dim("seq", min=2, max=256)
    ids = torch.randint(4, model.config.vocab_size, (1, 5))
    ep = torch.export.export(NoCache(model), (ids, torch.ones(1, 5, dtype=torch.int64), torch.arange(5)[None]),
                             dynamic_shapes=({1: seq}, {1: seq}, {1: seq}), strict=False)
    torch.export.save(ep, str(path))
    return path


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pt2")
    tied = hf_folder(root / "tied", seed=21, tie_word_embeddings=True, rope_scaling=LLAMA3_ROPE)
    qwen2 = hf_folder(root / "qwen2", family="qwen2", seed=23)
    llama = hf_folder(root / "llama", seed=22, rope_theta=250000.0)
    own = hf_folder(root / "own", seed=24)
    ids = torch.randint(4, 192, (1, 6))
    return {"pt2": (tied, lambda: load_model(root / "t.pt2", tokenizer=tied), save_pt2(tied, root / "t.pt2")),
            "qwen2": (qwen2, lambda: load_model(root / "q.pt2", tokenizer=qwen2), save_pt2(qwen2, root / "q.pt2")),
            "module": (llama, lambda: load_module(hf_model(llama), {"input_ids": ids}, tokenizer=llama), None),
            "own": (own, lambda: load_module(from_hf(hf_model(own)), (ids,), tokenizer=own), None)}


@pytest.fixture(scope="module")
def loaded(programs):
    return {k: load() for k, (_, load, _) in programs.items()}


@pytest.fixture(scope="module")
def artifacts(loaded, tmp_path_factory):
    root = tmp_path_factory.mktemp("pt2_art")
    return {k: build(m, root / k) for k, m in loaded.items()}


@pytest.mark.parametrize("which", ["pt2", "qwen2", "module", "own"])
def test_architecture_and_ir_are_what_the_model_is(programs, loaded, which):
    folder = programs[which][0]
    ours, hf = loaded[which], load_model(folder)
    assert ours.config == hf.config and ours.source_format == "pt2"
    ref = trace_module(hf.config, hf.weights)
    g, r = ours.module.graphs["forward"], ref.graphs["forward"]
    assert g.nodes == r.nodes and dict(g.tensors) == dict(r.tensors)
    assert sorted(ours.module.params) == sorted(ref.params)
    for name, w in ref.params.items():
        np.testing.assert_array_equal(ours.module.params[name], w, err_msg=name)


@pytest.mark.parametrize("which", ["pt2", "qwen2", "module", "own"])
def test_prefill_and_decode_logits_match_eager_torch(programs, artifacts, which):
    folder = programs[which][0]
    tokens = [int(t) for t in np.random.default_rng(9).integers(4, 192, 12)]
    errs = [rel_err(g, w) for g, w in zip(plan_steps(artifacts[which], tokens, prompt=8),
                                          torch_steps(folder, tokens, prompt=8))]
    assert len(errs) == 5 and max(errs) < TOL, errs


@pytest.mark.parametrize("which", ["pt2", "qwen2", "module", "own"])
def test_greedy_fp16_tokens_match_eager_torch(programs, artifacts, which):
    from grokc.runner import Runner, SamplingParams

    prompt = [int(t) for t in np.random.default_rng(10).integers(4, 192, 6)]
    got = Runner(artifacts[which], device="cpu").generate_ids([prompt], SamplingParams(max_new_tokens=10))[0]
    assert got == torch_greedy(programs[which][0], prompt, 10, eos=(2,))


def test_a_file_that_is_not_a_program_is_refused(tmp_path, programs):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(programs["pt2"][2].read_bytes()[:4096])
    with pytest.raises(UnsupportedModel, match="cannot read .*bad.pt2.* as a torch.export program"):
        load_model(bad, tokenizer=programs["pt2"][0])

