"""The last rung of the ladder on the GPU: the real test models (SmolLM2-135M, and Gemma-3-270M:
head_dim 256, sliding windows, q/k norms, GeGLU, the residual rescaling) through CUDA graphs vs
the CPU executor.

Both executors run the same plan; the GPU kernels round differently (half2 math in the int4
GEMV, f16 tensor-core operands in prefill), so logits must agree to 3e-2 of their RMS (max over
every position and vocabulary entry), or, for a model that amplifies rounding, to three times its
own spread under half-ulp weight noise on the CPU (``plan_compare.assert_close``), and the greedy
tokens must be identical (fp16) or part only at a near-tie of the CPU's logits (int4).
"""

import numpy as np
import pytest
from plan_compare import TOL, assert_close, prefill_logits, rel_err

from grokc.core.errors import TargetError
from grokc.runner import Runner, SamplingParams

PROMPT = "The capital of France is"


# int4-r: int4 with a 0.5% fp16 residual and an int4 LM head (sparse_residual launches before
# every linear, the head's included: its addend is f32 [1 or B, vocab]); int4-h8: int4 with an int8
# LM head (asymmetric like the recipe: gemv2's q8 path with zero-points, at M = 1 and M = batch)
BUILDS = {"fp16": ("fp16", {}), "int4": ("int4", {}), "int4-r": ("int4", {"fp16_residual": 0.005, "lm_head": "int4"}),
          "int4-h8": ("int4", {"lm_head": "int8"})}


# (model, build): every SmolLM2 build, and Gemma-3-270M's fp16 and default int4 ones
PAIRS = [("smollm2", b) for b in BUILDS] + [("gemma3", "fp16"), ("gemma3", "int4")]


@pytest.fixture(scope="module", params=PAIRS, ids=[f"{m}-{b}" for m, b in PAIRS])
def pair(request):
    model, name = request.param
    quant, extra = BUILDS[name]
    path = request.getfixturevalue(f"{model}_artifacts")(quant, **extra)
    return name, Runner(path, device="cuda"), Runner(path, device="cpu")


def test_prefill_logits_every_bucket(pair):
    _, gpu, cpu = pair
    rng = np.random.default_rng(0)
    for bucket in gpu.engine.shapes.buckets:
        for n in (5, bucket):   # a short prompt, and one filling the bucket
            ids = [int(t) for t in rng.integers(20, 49000, n)]
            assert_close(prefill_logits(gpu, ids, bucket), prefill_logits(cpu, ids, bucket), cpu,
                         lambda r: prefill_logits(r, ids, bucket))


def test_decode_logits_teacher_forced(pair):
    _, gpu, cpu = pair
    rng = np.random.default_rng(1)
    seqs = [[int(t) for t in rng.integers(20, 49000, n)] for n in (40, 23, 33, 17, 9)]   # 5 > batch
    for i, (g, c) in enumerate(zip(gpu.engine.score(seqs), cpu.engine.score(seqs))):
        assert_close(g, c, cpu, lambda r: r.engine.score([seqs[i]])[0])


def test_greedy_32_tokens_match_cpu(pair):
    quant, gpu, cpu = pair
    ids = [gpu.encode(PROMPT)]
    g = gpu.generate_ids(ids, SamplingParams(max_new_tokens=32))
    c = cpu.generate_ids(ids, SamplingParams(max_new_tokens=32))
    if quant == "fp16":
        assert g == c
        return
    # int4: the two may part only where the CPU's own logits are a near-tie, i.e. the GPU's token
    # scores within the logits tolerance (2 * TOL of their RMS: each side's error) of the CPU's best
    k = next((i for i, (a, b) in enumerate(zip(g[0], c[0])) if a != b), None)
    if k is None:
        return
    row = cpu.engine.score([ids[0] + c[0][:k]])[0][-1]
    gap = float(row[c[0][k]] - row[g[0][k]])
    assert gap <= 2 * TOL * float(np.sqrt((row ** 2).mean())), (k, gap)


def test_batch_slots_are_independent(pair):
    _, gpu, _ = pair
    prompts = [gpu.encode(p) for p in (PROMPT, "Once upon a time", "def main():\n", "1, 2, 3, 4,")]
    params = SamplingParams(max_new_tokens=16)
    together = gpu.generate_ids(prompts, params)
    assert together == [gpu.generate_ids([p], params)[0] for p in prompts]


def test_seeded_sampling_matches_cpu(pair):
    quant, gpu, cpu = pair
    if quant != "fp16":
        pytest.skip("fp16 only: int4 logits differ by more than sampling boundaries tolerate")
    ids = [gpu.encode(PROMPT)]
    params = SamplingParams(max_new_tokens=12, temperature=0.8, top_k=40, top_p=0.9, seed=3)
    assert gpu.generate_ids(ids, params) == cpu.generate_ids(ids, params)
    assert gpu.generate_ids(ids, params) == gpu.generate_ids(ids, params)


def test_wrong_arch_is_refused(smollm2_artifacts):
    path = smollm2_artifacts("fp16", archs=("sm80",))
    with pytest.raises(TargetError, match="rebuild with --arch sm90"):
        Runner(path, device="cuda")


def test_synthetic_weights_fill_identically(tmp_path):
    """A tiny config-only build: the GPU's fill kernel and numpy's materialize give the same model."""
    import json

    from grokc.compiler.build import BuildOptions, build

    cfg = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 512,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    build(tmp_path / "config.json", tmp_path / "art", BuildOptions(batch=2, buckets=(32,), max_seq=128,
                                                                   synthetic_seed=5))
    gpu, cpu = Runner(tmp_path / "art", device="cuda"), Runner(tmp_path / "art", device="cpu")
    seqs = [[int(t) for t in np.random.default_rng(2).integers(0, 1000, 20)]]
    assert rel_err(gpu.engine.score(seqs)[0], cpu.engine.score(seqs)[0]) < TOL
