"""Mixture-of-experts plans through CUDA graphs against the CPU executor: routing, grouping and the
expert kernels on the device in the real launch order.

- a tiny random Mixtral, Qwen2-MoE (its shared expert as chunks every token uses) and Qwen3-MoE (int4,
  round to nearest), a config-only build of a wider Mixtral (hidden 1024, 8 experts of 2048, top 2,
  synthetic weights, so the expert GEMV and the grouped GEMM run at tilings of real size) and one of
  the Grok-1 shape (GELU experts, head_dim 128, attention scores capped at 0.5 so that the cap binds
  in the tensor-core attention kernels): teacher-forced logits of 3 slots decoded together within ``TOL`` of
  their RMS, prefill's logits too, greedy tokens identical;
- slots decoded together give the tokens each gives alone on the GPU.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from tiny_moe import moe_config, moe_loaded

from grokc.compiler.build import BuildOptions, build, build_loaded
from grokc.runner import Runner, SamplingParams

TOL = 3e-2   # the e2e tolerance of the dense plans' GPU tests
OPTS = dict(batch=3, buckets=(16, 64), max_seq=128)
WIDE = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 1024,
        "intermediate_size": 2048, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
        "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 2000, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
GROK = {**WIDE, "model_type": "grok-1", "architectures": ["Grok1ModelForCausalLM"], "head_dim": 128,
        "num_experts": 8, "max_attn_value": 0.5, "tie_word_embeddings": True}
CONFIGS = {"wide": WIDE, "grok1": GROK}


@pytest.fixture(scope="module", params=["mixtral", "qwen2_moe", "qwen3_moe", "wide", "grok1"])
def runners(request, tmp_path_factory, sm):
    root = tmp_path_factory.mktemp(request.param)
    opts = BuildOptions(archs=(f"sm{sm}",), quant="int4-rtn", **OPTS)
    if request.param not in CONFIGS:
        build_loaded(moe_loaded(moe_config(request.param), seed=3), root / "art", opts)
        vocab = 256
    else:
        (root / "config.json").write_text(json.dumps(CONFIGS[request.param]))
        build(root / "config.json", root / "art", replace(opts, synthetic_seed=7))
        vocab = CONFIGS[request.param]["vocab_size"]
    return Runner(root / "art", device="cuda"), Runner(root / "art", device="cpu"), vocab


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.sqrt((b ** 2).mean()))


def test_decode_logits_gpu_match_cpu(runners):
    gpu, cpu, vocab = runners
    seqs = [np.random.default_rng(s).integers(3, vocab, 20).tolist() for s in range(3)]
    for g, c in zip(gpu.engine.score(seqs), cpu.engine.score(seqs)):
        assert _rel(g, c) < TOL


def test_prefill_logits_and_greedy_tokens_gpu_match_cpu(runners):
    gpu, cpu, vocab = runners
    prompt = np.random.default_rng(9).integers(3, vocab, 40).tolist()   # bucket 64, padded
    got = {}
    for name, r in (("gpu", gpu), ("cpu", cpu)):
        slot = r.engine.add(prompt, SamplingParams(max_new_tokens=8))
        logits = r.executor.read(r.plan.graphs["prefill_64"].logits)[0]
        r.engine.decode(7)
        r.executor.synchronize()
        got[name] = (logits, r.engine.tokens(slot))
        r.engine.release(slot)
    assert _rel(got["gpu"][0], got["cpu"][0]) < TOL
    assert got["gpu"][1] == got["cpu"][1]


def test_slots_stay_independent_on_the_gpu(runners):
    gpu, _, vocab = runners
    prompts = [np.random.default_rng(20 + s).integers(3, vocab, 6 + 5 * s).tolist() for s in range(3)]
    params = SamplingParams(max_new_tokens=10)
    together = gpu.generate_ids(prompts, params)
    assert together == [gpu.generate_ids([p], params)[0] for p in prompts]
