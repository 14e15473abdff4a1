"""Recipes' perplexity per held-out genre without building: a quick comparison on a slow machine.

The model's linears are replaced in memory by what ``quant.weights.dequantized_weight`` stores for
each recipe (the quantize pass's own numerics; the LM head, embeddings and norms left in f32), and
grokc's float32 torch model (``compiler.quality``, as the build report) measures each shipped
evaluation genre against the unquantized model. Statistics: by default one set for every recipe,
from the unquantized model (as ``--no-sequential``; ``--calib-samples`` windows of the shipped mix),
cached in ``--cache``; with ``--sequential``, each recipe's own, as a default build calibrates
(``compiler.calibrate.calibrate``: block by block on the outputs of the blocks already quantized),
not cached. Differences from a build then: no f16 rounding of norms.

    python bench/probes/quant_sweep.py MODEL.gguf int4 int4-g64 int4+res0.005 int4+damp0.1 [--tokens 2048] [--calib-samples 8]
    python bench/probes/quant_sweep.py MODEL.gguf int4 int4-mixed --sequential --calib-samples 32   # as a default build
    python bench/probes/quant_sweep.py MODEL.gguf int4 int4+had int4+had64 --calib-samples 32   # ffn_down's input turned online

Prints one JSON line per recipe: per genre (perplexity, increase in %, top-1 agreement, mean KL) and the worst.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from grokc.compiler.calibrate import CalibrationOptions, calibrate
from grokc.compiler.frontends import load_model
from grokc.compiler.quality import combine, position_stats, reference_logits, reference_model, report_windows
from grokc.compiler.text import eval_texts
from grokc.core import tensors as names
from grokc.quant.recipe import QUANT
from grokc.quant.rotation import orthogonal, rotated
from grokc.quant.weights import dequantized_weight

_OVERRIDES = {"res": lambda r, v: {"fp16_residual": float(v)}, "damp": lambda r, v: {"damp": float(v)},
              "down": lambda r, v: {"fine": (*r.fine, "ffn_down"), "fine_group_size": int(v)},
              "out": lambda r, v: {"fine": (*r.fine, "attn_output"), "fine_group_size": int(v)},
              "rot": lambda r, v: {"rotate": True}}
_HAD_SEED = 7   # the turn's signs (quant.rotation.orthogonal)


def recipe_of(spec: str):
    """``(recipe, had)`` of a spec: ``NAME`` of the QUANT registry, with ``+resF`` for
    ``--fp16-residual F``, ``+dampF`` for GPTQ's damping F, ``+downG`` / ``+outG`` for ffn_down /
    attn_output in groups of G (a mixed recipe; both take the last G), ``+rot`` for ``--rotate``;
    ``had`` is None, or with ``+had`` / ``+hadB`` the order of the online turn of ffn_down's input
    (0: all of it, else blocks of B; ``down_turned``)."""
    name, *extra = spec.split("+")
    recipe, had = QUANT[name], None
    for part in extra:
        if part.startswith("had"):
            had = int(part.removeprefix("had") or 0)
            continue
        key = next((k for k in _OVERRIDES if part.startswith(k)), None)
        if key is None:
            raise SystemExit(f"{spec}: unknown override {part!r}; use +resF, +dampF, +downG, +outG, +rot or +had[B]")
        recipe = replace(recipe, **_OVERRIDES[key](recipe, part.removeprefix(key)))
    return recipe, had


def down_turned(w: np.ndarray, h: np.ndarray, recipe, block: int) -> np.ndarray:
    """ffn_down ``w [H, I]`` as the model would see it with its input turned online (QuaRot's R4:
    ``x R`` computed at run time, ``W R`` stored; R a seeded randomized Hadamard matrix of order I, or
    block-diagonal of order ``block``): ``W R`` quantized with the turned statistics ``Rᵀ h R``, times
    ``Rᵀ``, exact in real arithmetic but for the quantization. No build stores this yet."""
    k = w.shape[1]
    if block and k % block:
        raise SystemExit(f"+had{block}: ffn_down has {k} inputs, not a multiple of {block}")
    r = orthogonal(k, _HAD_SEED) if not block else np.kron(np.eye(k // block), orthogonal(block, _HAD_SEED))
    turned = dequantized_weight(np.ascontiguousarray(w @ r, np.float32), recipe, (r.T @ h.astype(np.float64) @ r).astype(np.float32))
    return np.ascontiguousarray(turned @ r.T, np.float32)


def _shared_statistics(loaded, args, rotate: bool) -> dict:
    """The unquantized model's statistics (not sequential), cached in ``--cache`` (``-rot`` for rotated)."""
    cache = args.cache.with_name(args.cache.stem + ("-rot" if rotate else "") + args.cache.suffix)
    if not cache.exists():
        opts = CalibrationOptions(samples=args.calib_samples, sequential=False)
        np.savez(cache, **calibrate(loaded, QUANT["int4-norot"], opts).hessians)
    return dict(np.load(cache))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("recipes", nargs="+")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--calib-samples", type=int, default=8)
    ap.add_argument("--sequential", action="store_true", help="each recipe's own sequential calibration, as a build")
    ap.add_argument("--cache", type=Path, help="shared statistics (default /tmp/grokc-sweep-hessians-SAMPLES.npz)")
    args = ap.parse_args()
    args.cache = args.cache or Path(f"/tmp/grokc-sweep-hessians-{args.calib_samples}.npz")
    torch.set_num_threads(2)
    t0 = time.time()
    plain = load_model(args.model)
    texts = eval_texts()
    wins = report_windows(plain.tokenizer_json, texts, args.tokens, args.context)
    ref = reference_model(plain.config, plain.weights)
    ref_logits = {t.name: [reference_logits(ref, w) for w in wins[t.name]] for t in texts}
    models, shared = {False: plain}, {}   # rotated or not -> the model, the statistics its recipes share
    for spec in args.recipes:
        (recipe, had), t1 = recipe_of(spec), time.time()
        if recipe.rotate not in models:
            config, turned = rotated(plain.config, plain.weights)
            models[True] = replace(plain, config=config, weights=turned)
        loaded = models[recipe.rotate]
        if args.sequential:
            hess = dict(calibrate(loaded, recipe, CalibrationOptions(samples=args.calib_samples)).hessians)
        else:
            if recipe.rotate not in shared:
                shared[recipe.rotate] = _shared_statistics(loaded, args, recipe.rotate)
            hess = shared[recipe.rotate]
        linears = [k for k in loaded.weights if names.input_key(k) in hess and k != names.LM_HEAD]
        def stored(k: str, w: np.ndarray) -> np.ndarray:
            w, h = np.asarray(w, np.float32), hess[names.input_key(k)]
            if had is not None and (names.parse(k) or (None,))[0] is names.Tensor.FFN_DOWN:
                return down_turned(w, h, recipe.for_weight(k), had)
            return dequantized_weight(w, recipe.for_weight(k), h)

        weights = {k: (stored(k, v) if k in linears else v) for k, v in loaded.weights.items()}
        model = reference_model(loaded.config, weights)
        genres = {}
        for t in texts:
            m = combine([position_stats(r, reference_logits(model, w), w) for r, w in zip(ref_logits[t.name], wins[t.name])])
            genres[t.name] = {"ppl_reference": round(m["ppl_reference"], 3), "ppl": round(m["ppl_artifact"], 3),
                              "increase_pct": round(100 * m["ppl_increase"], 1),
                              "top1": round(m["top1_agreement"], 3), "kl": round(m["kl_mean"], 4)}
        worst = max(genres, key=lambda g: genres[g]["increase_pct"])
        print(json.dumps({"recipe": spec, "seconds": round(time.time() - t1), "genres": genres,
                          "worst": {"genre": worst, "increase_pct": genres[worst]["increase_pct"]}}), flush=True)
    print(json.dumps({"total_seconds": round(time.time() - t0)}))


if __name__ == "__main__":
    main()
