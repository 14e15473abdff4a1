"""Calibration of mixture-of-experts layers (``compiler/calibrate_moe.py``).

- each expert's statistics against numpy written from the definitions: its routed tokens' normed
  inputs ``sum x x^T`` and activations ``sum a a^T`` (softmax top-k routing and SwiGLU in numpy,
  on the torch model's normed inputs), shrunk towards the layer's pooled moments with
  ``PRIOR_TOKENS``; the shared expert's chunks see every token (Qwen2-MoE), within 1e-5 relative;
- an int4 GPTQ build of a tiny Mixtral records per layer the tokens its experts saw (``top_k``
  distinct experts per calibration token, so the counts of a layer sum to ``top_k`` times the
  calibration tokens) and a quality report whose KL divergence is finite and positive.
"""

from __future__ import annotations

import numpy as np
import torch
from tiny_moe import moe_config, moe_loaded

from grokc.artifacts.store import open_artifact
from grokc.compiler import calibrate_moe
from grokc.compiler.build import BuildOptions, build_loaded
from grokc.compiler.calibrate import CalibrationOptions
from grokc.compiler.quality import reference_model


def _silu(v: np.ndarray) -> np.ndarray:
    return v / (1 + np.exp(-v))


def _want(x: np.ndarray, w: dict[str, np.ndarray], layer: int, cfg) -> dict[str, np.ndarray]:
    """Each stacked expert's shrunk (gate_up input, down input) second moments, in numpy float64."""
    moe, p = cfg.moe, lambda k: w[f"blk.{layer}.{k}.weight"].astype(np.float64)
    logits = x @ p("ffn_gate_inp").T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    chosen = np.argsort(-probs, -1, kind="stable")[:, :moe.top_k]           # [T, k]
    ins, acts, counts = [], [], []
    for e in range(moe.n_experts):
        xe = x[(chosen == e).any(-1)]
        a = _silu(xe @ p("ffn_gate_exps")[e].T) * (xe @ p("ffn_up_exps")[e].T)
        ins.append(xe.T @ xe), acts.append(a.T @ a), counts.append(len(xe))
    if moe.shared_size:
        a = _silu(x @ p("ffn_gate_shexp").T) * (x @ p("ffn_up_shexp").T)      # [T, Is]
        chunks = -(-moe.shared_size // moe.expert_size)
        a = np.pad(a, ((0, 0), (0, chunks * moe.expert_size - a.shape[1]))).reshape(len(x), chunks, -1)
        for j in range(chunks):
            ins.append(x.T @ x), acts.append(a[:, j].T @ a[:, j]), counts.append(len(x))
    pool_in, pool_act = x.T @ x / len(x), sum(acts) / sum(counts)
    n0 = calibrate_moe.PRIOR_TOKENS
    out = {}
    for e, n in enumerate(counts):
        out[f"blk.{layer}.ffn_gate_up_exps.weight[{e}]"] = (ins[e] + n0 * pool_in) / (n + n0)
        out[f"blk.{layer}.ffn_down_exps.weight[{e}]"] = (acts[e] + n0 * pool_act) / (n + n0)
    return out


def test_expert_statistics_match_numpy():
    loaded = moe_loaded(moe_config("qwen2_moe"), seed=4)
    cfg = loaded.config
    model = reference_model(cfg, loaded.weights)
    stats = [calibrate_moe.ExpertStats(b, cfg, i) for i, b in enumerate(model.blk)]
    normed = [[] for _ in model.blk]
    hooks = [b.ffn_norm.register_forward_hook(s.hook) for b, s in zip(model.blk, stats)]
    hooks += [b.ffn_norm.register_forward_hook(lambda m, i, o, seen=seen: seen.append(o)) for b, seen in
              zip(model.blk, normed)]
    with torch.no_grad():
        for seed in range(3):
            tokens = np.random.default_rng(seed).integers(3, 256, 40)
            model(torch.from_numpy(tokens).int(), torch.arange(40, dtype=torch.int32))
    for h in hooks:
        h.remove()
    for layer, s in enumerate(stats):
        x = torch.cat(normed[layer]).double().numpy()
        got, want = s.hessians(), _want(x, loaded.weights, layer, cfg)
        assert sorted(got) == sorted(want)
        for key, w in want.items():
            assert np.abs(got[key] - w).max() <= 1e-5 * np.abs(w).max(), key


def test_int4_build_records_the_experts_tokens_and_its_quality(tmp_path):
    cfg = moe_config("mixtral", tie_word_embeddings=False)
    calib = CalibrationOptions(samples=2, tokens=64)
    build_loaded(moe_loaded(cfg, seed=3), tmp_path / "q4", BuildOptions(
        quant="int4", batch=2, buckets=(16,), max_seq=64, calibration=calib, quality_tokens=256, quality_context=64))
    quant = open_artifact(tmp_path / "q4").manifest.quant
    experts = quant.calibration["experts"]
    assert experts["prior_tokens"] == calibrate_moe.PRIOR_TOKENS
    assert experts["routed_experts"] == cfg.num_layers * cfg.moe.n_experts
    assert 0 <= experts["fewest_tokens"] <= experts["most_tokens"] <= calib.samples * calib.tokens
    # every token picks top_k distinct experts of each layer: the busiest one saw at least the mean
    assert experts["most_tokens"] >= calib.samples * calib.tokens * cfg.moe.top_k // cfg.moe.n_experts
    assert quant.quality["tokens"] == 256 and 0 < quant.quality["worst"]["kl_mean"] < float("inf")
