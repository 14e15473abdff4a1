"""``--embeddings int8|int4`` through CUDA graphs: a tiny config-only build, GPU vs the CPU executor.
With ``--lm-head int8`` and symmetric codes the head reads the table's own codes and scales.

The embedding kernels are bit-exact against the oracle (``test_kernels_misc.py``); here the whole plan
runs, so logits must agree to the e2e tolerance (3e-2 of their RMS) and greedy tokens must match.
"""

import json

import numpy as np
import pytest

from grokc.compiler.build import BuildOptions, build
from grokc.runner import Runner, SamplingParams

TOL = 3e-2


@pytest.mark.parametrize("embeddings,extra", [("int4", {"group_size": 64, "symmetric": False}), ("int8", {}),
                                              ("int8", {"lm_head": "int8", "symmetric": True})])
def test_quantized_embeddings_gpu_matches_cpu(tmp_path, embeddings, extra):
    cfg = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 512,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    build(tmp_path / "config.json", tmp_path / "art", BuildOptions(batch=2, buckets=(32,), max_seq=128, synthetic_seed=5,
                                                                   embeddings=embeddings, **extra))
    gpu, cpu = Runner(tmp_path / "art", device="cuda"), Runner(tmp_path / "art", device="cpu")
    kernels = {l.kernel for g in gpu.plan.graphs.values() for l in g.launches if l.op == "embedding"}
    assert kernels == {"embedding_q4_w4" if embeddings == "int4" else "embedding_q8_v8"}
    head = {a.param: a.weight for a in gpu.plan.graphs["decode_1"].launches[-2].args}
    if extra.get("lm_head") == "int8":   # one copy of the codes, read by both
        assert (head["weight"], head["scales"]) == ("token_embd.q8weight", "token_embd.scales")
    seqs = [[int(t) for t in np.random.default_rng(2).integers(0, 1000, 20)]]
    g, c = gpu.engine.score(seqs)[0], cpu.engine.score(seqs)[0]
    assert float(np.abs(g - c).max() / np.sqrt((c ** 2).mean())) < TOL
    outs = []
    for r in (gpu, cpu):
        slot = r.engine.add(seqs[0][:8], SamplingParams(max_new_tokens=6))
        r.engine.decode(5)
        r.executor.synchronize()
        outs.append(r.engine.tokens(slot))
    assert len(outs[0]) == 6 and outs[0] == outs[1]   # greedy
