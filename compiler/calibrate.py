"""Calibration: the second moment ``E[x^T x]`` of every linear's input, on text the evaluation never sees.

What: ``calibrate(loaded, recipe, opts)`` runs grokc's torch model in float32 on the source
weights over ``opts.samples`` windows of ``opts.tokens`` tokens of calibration text and returns a
``quant.calibration.Calibration``: plain f32 ``[K, K]`` arrays keyed by ``names.input_key`` (one
per distinct input: q/k/v share one, gate/up another, then o_proj's and down_proj's, and
``names.LM_HEAD`` for the LM head's normed input). The quantize pass turns them into GPTQ
codes; it never runs the model itself.

Text: the calibration split of the pydoc topics (``text.pydoc_text("calibration")``), never the
split that ``grokc eval`` and the build's quality report measure. Windows start at offsets drawn
by ``numpy.random.default_rng(opts.seed)``, so the statistics are a function of the inputs.

Sequential (``opts.sequential``): the blocks are calibrated one after another, and each block's
outputs are recomputed with its weights already quantized (by the same function the pass uses),
so a block's statistics see the errors of the blocks before it, as at inference; a quantized
embedding table is dequantized before block 0 for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch
from tokenizers import Tokenizer

from grokc.compiler import calibrate_moe
from grokc.compiler.frontends import LoadedModel
from grokc.compiler.quality import reference_model
from grokc.compiler.text import pydoc_text
from grokc.core import tensors as names
from grokc.core.errors import BuildOptionError
from grokc.core.ir import WeightFormat
from grokc.quant.calibration import Calibration
from grokc.quant.recipe import QuantRecipe
from grokc.quant.weights import dequantized_embedding, dequantized_weight

Progress = Callable[[str], None]
Quantizer = Callable[[str, np.ndarray, np.ndarray], np.ndarray]  # (weight name, W f32, H) -> dequantized W

# The linears of a block whose input each hook records (the others share these inputs).
_RECORDED = ("attn_q", "attn_output", "ffn_gate", "ffn_down")
_LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
_STACKED = (names.Tensor.FFN_GATE_UP_EXPS, names.Tensor.FFN_DOWN_EXPS)   # expert weights: no fp16 residual


@dataclass(frozen=True)
class CalibrationOptions:
    samples: int = 32       # windows of calibration text
    tokens: int = 512       # tokens per window
    seed: int = 0           # draws the windows' offsets
    sequential: bool = True  # propagate each block's quantized outputs to the next

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise BuildOptionError(f"--calib-samples {self.samples} must be at least 1")
        if self.tokens < 2:
            raise BuildOptionError(f"--calib-tokens {self.tokens} must be at least 2")

    def to_json(self) -> dict:
        return {"text": "pydoc_data.topics, calibration split (odd topics less paragraphs of the even ones)", "samples": self.samples,
                "tokens": self.tokens, "seed": self.seed, "sequential": self.sequential}


def calibration_windows(token_ids: list[int], opts: CalibrationOptions) -> list[list[int]]:
    """``opts.samples`` windows of ``opts.tokens`` tokens at seeded offsets, in text order."""
    span = len(token_ids) - opts.tokens
    if span < 0:
        raise BuildOptionError(f"--calib-tokens {opts.tokens} is longer than the calibration text "
                               f"({len(token_ids)} tokens); use at most {len(token_ids)}")
    starts = np.sort(np.random.default_rng(opts.seed).integers(0, span + 1, opts.samples))
    return [token_ids[s:s + opts.tokens] for s in starts.tolist()]


def calibrate(loaded: LoadedModel, recipe: QuantRecipe, opts: CalibrationOptions,
              progress: Progress = lambda s: None) -> Calibration:
    """The statistics the quantize pass needs for ``recipe``, measured on the calibration split."""
    tokens = Tokenizer.from_str(loaded.tokenizer_json).encode(pydoc_text("calibration")).ids
    wins = calibration_windows(tokens, opts)
    model = reference_model(loaded.config, loaded.weights).requires_grad_(False)
    quantize = None
    if opts.sequential:
        def quantize(name: str, w: np.ndarray, h: np.ndarray) -> np.ndarray:
            expert = names.parse(name)[0] in _STACKED   # experts keep no fp16 residual
            return dequantized_weight(w, replace(recipe, fp16_residual=0.0) if expert else recipe, h)

        if recipe.embeddings is not WeightFormat.F16:   # block 0 sees the embedding rows the artifact holds
            table = model.token_embd.weight
            table.copy_(torch.from_numpy(dequantized_embedding(table.numpy(), recipe)))
    experts: list[calibrate_moe.ExpertStats] = []
    hessians = collect(model, wins, quantize, progress, experts)
    info = {**opts.to_json(), **({"experts": calibrate_moe.summary(experts)} if experts else {})}
    return Calibration(hessians, info)


@torch.no_grad()
def collect(model: torch.nn.Module, windows: list[list[int]], quantize: Quantizer | None = None,
            progress: Progress = lambda s: None, experts: list | None = None) -> dict[str, np.ndarray]:
    """Mean ``x^T x`` (f32 ``[K, K]``) of every distinct linear input over ``windows``, block by block,
    and of each expert's inputs in mixture-of-experts blocks (``calibrate_moe``; their
    ``ExpertStats`` are appended to ``experts`` when given).

    With ``quantize``, each block's linears are replaced by ``quantize(name, W, H)`` once its
    statistics are known, before its outputs feed the next block. ``model`` is modified then.
    """
    hidden = [model.token_embd(torch.tensor(w, dtype=torch.int64)) for w in windows]   # [T, H] each
    positions = [torch.arange(len(w), dtype=torch.int32) for w in windows]
    n_tokens = sum(len(w) for w in windows)
    out: dict[str, np.ndarray] = {}
    for i, block in enumerate(model.blk):
        progress(f"calibrating block {i + 1}/{len(model.blk)}")
        sums: dict[str, torch.Tensor] = {}
        hooks = [getattr(block, kind).register_forward_pre_hook(_accumulate(sums, names.name(names.Tensor(kind), i)))
                 for kind in _RECORDED if hasattr(block, kind)]
        stats = calibrate_moe.ExpertStats(block, model.cfg, i) if model.cfg.moe else None
        if stats is not None:
            hooks.append(block.ffn_norm.register_forward_hook(stats.hook))
        outputs = [block(h, p, model.rope_inv_freq, model.mscale) for h, p in zip(hidden, positions)]
        for hook in hooks:
            hook.remove()
        for key, s in sums.items():
            out[key] = (s / n_tokens).float().numpy()
        if stats is not None:
            out.update(stats.hessians())
            if experts is not None:
                experts.append(stats)
        if quantize is not None:
            for kind in (k for k in _LINEARS if hasattr(block, k)):
                name = names.name(names.Tensor(kind), i)
                linear = getattr(block, kind)
                deq = quantize(name, linear.weight.numpy(), out[names.input_key(name)])
                linear.weight.copy_(torch.from_numpy(deq))
            if stats is not None:
                stats.quantize(quantize, out)
            outputs = [block(h, p, model.rope_inv_freq, model.mscale) for h, p in zip(hidden, positions)]
        hidden = outputs
    sums = {}
    _accumulate(sums, names.LM_HEAD)(None, (torch.cat([model.output_norm(h) for h in hidden]),))
    out[names.LM_HEAD] = (sums[names.LM_HEAD] / n_tokens).float().numpy()
    return out


def _accumulate(sums: dict[str, torch.Tensor], key: str):
    """A forward pre-hook adding ``x^T x`` (float64) of the module's input ``x [T, K]`` to ``sums[key]``."""
    def hook(module, inputs):
        x = inputs[0].reshape(-1, inputs[0].shape[-1]).float()
        xtx = (x.T @ x).double()
        sums[key] = sums[key] + xtx if key in sums else xtx
    return hook
