"""Rung 2 -> 3 of the ladder on a tiny random Llama: the CPU plan computes grokc's torch model.

The reference is the torch model in fp32 on the weights the artifact stores (f16-rounded, or the
dequantized int4 codes), so the only differences left are the plan's f16 activations: logits
must agree to 2e-2 of their RMS at every position.
"""

import numpy as np
import pytest

from grokc.abi import int4, int8
from grokc.compiler.quality import reference_logits, reference_model
from grokc.runner import Runner, SamplingParams

TOL = 2e-2


def stored_weights(runner: Runner, loaded, residual: bool = True) -> dict[str, np.ndarray]:
    """Canonically named f32 weights as the artifact stores them (fused tensors split back; without any fp16
    residual when ``residual`` is False)."""
    art = runner.artifact.weights()
    c = loaded.config

    def dense(base: str) -> np.ndarray:
        if f"{base}.qweight" in art:
            gs = runner.artifact.manifest.quant.recipe["group_size"]
            zeros = art.get(f"{base}.zeros")
            w = int4.dequantize(np.asarray(art[f"{base}.qweight"]), np.asarray(art[f"{base}.scales"]),
                                None if zeros is None else np.asarray(zeros), gs)
            if residual and f"{base}.residual_vals" in art:   # the fp16 residual: w[row, col] += val, entry by entry
                rowptr, cols, vals = (np.asarray(art[f"{base}.residual_{s}"]) for s in ("rowptr", "cols", "vals"))
                for r in range(w.shape[0]):
                    for e in range(rowptr[r], rowptr[r + 1]):
                        w[r, cols[e]] += np.float32(vals[e])
            return w
        return np.asarray(art[f"{base}.weight"], dtype=np.float32)

    out = {}
    for canon in loaded.weights:
        layer, _, kind = canon.removeprefix("blk.").partition(".")
        kind = kind.removesuffix(".weight")
        if kind in ("attn_q", "attn_k", "attn_v"):
            qkv = dense(f"blk.{layer}.attn_qkv")
            start = {"attn_q": 0, "attn_k": c.q_dim, "attn_v": c.q_dim + c.kv_dim}[kind]
            out[canon] = qkv[start:start + (c.q_dim if kind == "attn_q" else c.kv_dim)]
        elif kind in ("ffn_gate", "ffn_up"):
            gu = dense(f"blk.{layer}.ffn_gate_up")
            out[canon] = gu[: c.intermediate_size] if kind == "ffn_gate" else gu[c.intermediate_size:]
        else:
            out[canon] = dense(canon.removesuffix(".weight"))
    if "output.qweight" in art:                  # an LM head of its own (tied in the source, or rotated): int4 ...
        out["output.weight"] = dense("output")
    if "output.q8weight" in art:                 # ... or int8 (the default int4's rotated tied head)
        zeros = art.get("output.zeros")
        out["output.weight"] = int8.dequantize(np.asarray(art["output.q8weight"]), np.asarray(art["output.scales"]),
                                               None if zeros is None else np.asarray(zeros), 0)
    return out


@pytest.mark.parametrize("recipe", ["fp16", "int4", "int4-g32", "int4-r"])
def test_teacher_forced_logits_match_torch_model(tiny_artifacts, tiny_model, recipe):
    runner = Runner(tiny_artifacts[recipe], device="cpu")
    ref_model = reference_model(tiny_model.config, stored_weights(runner, tiny_model))
    seqs = [list(np.random.default_rng(s).integers(3, 256, 40)) for s in range(4)]  # 4 > batch: two waves
    got = runner.engine.score(seqs)
    for seq, g in zip(seqs, got):
        want = reference_logits(ref_model, seq)
        err = np.abs(g - want).max() / np.sqrt((want ** 2).mean())
        assert err < TOL, f"{recipe}: max error {err:.3g} of the logits' RMS"


def test_plan_applies_the_fp16_residual(tiny_artifacts, tiny_model):
    """Without its residual the int4-r model is far from what the plan computes: the check above
    could not pass with the residual dropped on either side."""
    runner = Runner(tiny_artifacts["int4-r"], device="cpu")
    assert any(name.endswith(".residual_vals") for name in runner.artifact.weights())
    ref_model = reference_model(tiny_model.config, stored_weights(runner, tiny_model, residual=False))
    seq = list(np.random.default_rng(0).integers(3, 256, 40))
    got, want = runner.engine.score([seq])[0], reference_logits(ref_model, seq)
    assert np.abs(got - want).max() / np.sqrt((want ** 2).mean()) > 5 * TOL


def test_prefill_bucket_padding_does_not_change_logits(tiny_artifacts):
    runner = Runner(tiny_artifacts["fp16"], device="cpu")
    prompt = list(np.random.default_rng(7).integers(3, 256, 11))
    logits = {}
    for bucket in (16, 64):
        slot = runner.engine.add(prompt, SamplingParams(max_new_tokens=4), bucket=bucket)
        logits[bucket] = runner.executor.read(runner.plan.graphs[f"prefill_{bucket}"].logits)[0].copy()
        runner.engine.release(slot)
    np.testing.assert_allclose(logits[16], logits[64], rtol=0, atol=1e-5 * np.abs(logits[16]).max())


def test_prompt_alone_and_in_full_batch_give_same_tokens(tiny_artifacts):
    runner = Runner(tiny_artifacts["int4"], device="cpu")
    rng = np.random.default_rng(11)
    prompts = [list(rng.integers(3, 256, n)) for n in (9, 30, 17)]
    params = SamplingParams(max_new_tokens=12)
    alone = runner.generate_ids(prompts[:1], params)[0]
    together = runner.generate_ids(prompts, params)
    assert together[0] == alone
    assert [runner.generate_ids([p], params)[0] for p in prompts[1:]] == together[1:]


def test_sampling_is_seeded_and_respects_top_k_1(tiny_artifacts):
    runner = Runner(tiny_artifacts["fp16"], device="cpu")
    prompt = [list(np.random.default_rng(5).integers(3, 256, 12))]
    greedy = runner.generate_ids(prompt, SamplingParams(max_new_tokens=10))
    top1 = runner.generate_ids(prompt, SamplingParams(max_new_tokens=10, temperature=0.8, top_k=1, seed=9))
    assert top1 == greedy
    a = runner.generate_ids(prompt, SamplingParams(max_new_tokens=10, temperature=100.0, seed=1))
    b = runner.generate_ids(prompt, SamplingParams(max_new_tokens=10, temperature=100.0, seed=1))
    c = runner.generate_ids(prompt, SamplingParams(max_new_tokens=10, temperature=100.0, seed=2))
    assert a == b and a != c
