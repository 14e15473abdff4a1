"""Calibration: the second moment ``E[x^T x]`` of every linear's input, on text the evaluation never sees.

What: ``calibrate(loaded, recipe, opts)`` runs grokc's torch model in float32 on the source
weights over ``opts.samples`` windows of ``opts.tokens`` tokens of calibration text and returns a
``quant.calibration.Calibration``: plain f32 ``[K, K]`` arrays keyed by ``names.input_key`` (one
per distinct input: q/k/v share one, gate/up another, then o_proj's and down_proj's, and
``names.LM_HEAD`` for the LM head's normed input). The quantize pass turns them into GPTQ
codes; it never runs the model itself.

Text: the shipped calibration mix (``text.calibration_texts()``: seven genres, none of them one the
quality report measures, and no paragraph of any evaluation text), or only the user's
``--calib-text`` files and folders (``opts.texts``). The ``opts.samples`` windows are dealt out
evenly over the sources (the first ones get one more when they do not divide), so a long source
does not swamp a short one; each source's windows start at offsets drawn, source after source, by
``numpy.random.default_rng(opts.seed)``, so the statistics are a function of the inputs.

Sequential (``opts.sequential``): the blocks are calibrated one after another, and each block's
outputs are recomputed with its weights already quantized (by the same function the pass uses),
so a block's statistics see the errors of the blocks before it, as at inference; a quantized
embedding table is dequantized before block 0 for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tokenizers import Tokenizer

from grokc.compiler import calibrate_moe
from grokc.compiler.frontends import LoadedModel
from grokc.compiler.quality import reference_model
from grokc.compiler.text import Text, calibration_texts, user_text
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
    texts: tuple[Path, ...] = ()  # --calib-text: the user's files or folders; empty: the shipped mix

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise BuildOptionError(f"--calib-samples {self.samples} must be at least 1")
        if self.tokens < 2:
            raise BuildOptionError(f"--calib-tokens {self.tokens} must be at least 2")

    def sources(self) -> list[Text]:
        """The texts calibration reads: the user's when given, else the shipped mix."""
        return [user_text(Path(p), "--calib-text") for p in self.texts] if self.texts else calibration_texts()

    def to_json(self, sources: list[Text], counts: list[int]) -> dict:
        return {"text": [{**t.describe(), "windows": n} for t, n in zip(sources, counts)], "samples": self.samples,
                "tokens": self.tokens, "seed": self.seed, "sequential": self.sequential}


def dealt(samples: int, sources: int) -> list[int]:
    """``samples`` windows dealt out over ``sources``: evenly, one more for the first ``samples % sources``."""
    return [samples // sources + (i < samples % sources) for i in range(sources)]


def calibration_windows(token_ids: list[int], n: int, tokens: int, rng: np.random.Generator,
                        name: str) -> list[list[int]]:
    """``n`` windows of ``tokens`` tokens of one source at offsets drawn by ``rng``, in text order."""
    span = len(token_ids) - tokens
    if span < 0:
        raise BuildOptionError(f"--calib-tokens {tokens} is longer than the calibration text {name} "
                               f"({len(token_ids)} tokens); use at most {len(token_ids)} or give more text")
    starts = np.sort(rng.integers(0, span + 1, n))
    return [token_ids[s:s + tokens] for s in starts.tolist()]


def mix_windows(encoded: list[list[int]], sources: list[Text], opts: CalibrationOptions) -> tuple[list[list[int]], list[int]]:
    """Every source's windows (``dealt`` counts), source after source, and the counts."""
    counts = dealt(opts.samples, len(sources))
    rng = np.random.default_rng(opts.seed)
    wins = [w for ids, t, n in zip(encoded, sources, counts) for w in calibration_windows(ids, n, opts.tokens, rng, t.name)]
    return wins, counts


def calibrate(loaded: LoadedModel, recipe: QuantRecipe, opts: CalibrationOptions,
              progress: Progress = lambda s: None) -> Calibration:
    """The statistics the quantize pass needs for ``recipe``, measured on the calibration texts."""
    sources = opts.sources()
    tokenizer = Tokenizer.from_str(loaded.tokenizer_json)
    wins, counts = mix_windows([tokenizer.encode(t.text).ids for t in sources], sources, opts)
    progress(f"calibration text: {', '.join(f'{t.name} ({n})' for t, n in zip(sources, counts))}")
    model = reference_model(loaded.config, loaded.weights).requires_grad_(False)
    quantize = None
    if opts.sequential:
        def quantize(name: str, w: np.ndarray, h: np.ndarray) -> np.ndarray:
            expert = names.parse(name)[0] in _STACKED   # experts keep no fp16 residual
            return dequantized_weight(w, replace(recipe, fp16_residual=0.0) if expert else recipe.for_weight(name), h)

        if recipe.embeddings is not WeightFormat.F16:   # block 0 sees the embedding rows the artifact holds
            table = model.token_embd.weight
            table.copy_(torch.from_numpy(dequantized_embedding(table.numpy(), recipe)))
    experts: list[calibrate_moe.ExpertStats] = []
    hessians = collect(model, wins, quantize, progress, experts)
    info = {**opts.to_json(sources, counts), **({"experts": calibrate_moe.summary(experts)} if experts else {})}
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
        outputs = [model.forward_block(i, h, p) for h, p in zip(hidden, positions)]
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
            outputs = [model.forward_block(i, h, p) for h, p in zip(hidden, positions)]
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
