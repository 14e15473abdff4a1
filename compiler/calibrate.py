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
embedding table is dequantized before block 0 for the same reason. The stored forms computed on
the way go to the quantize pass with the statistics (``Calibration.quantized``), which then has no
GPTQ left to run on the block linears. (Quantizing each linear group as soon as its statistics are
known, within the block, saves the second pass but measured worse on SmolLM2 rotated: worst
held-out genre +18.3 against +16.1 %.)

Cost (SmolLM2-135M, 32 windows of 512 tokens): per dense block, one pass in four stages over all
windows (``_dense_block``: no hooks; one f32 matmul per statistic, ``_second_moment``), one GPTQ
per fused linear, one more pass on the quantized weights.
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
from grokc.quant.calibration import Calibration, weight_key
from grokc.quant.recipe import QuantRecipe
from grokc.quant.weights import dequantize_weight, dequantized_embedding, dequantized_weight, quantize_weight

Progress = Callable[[str], None]
Quantizer = Callable[[str, np.ndarray, np.ndarray], np.ndarray]  # (weight name, W f32, H) -> dequantized W

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
    """The statistics the quantize pass needs for ``recipe``, measured on the calibration texts (with
    ``opts.sequential``, also the stored forms of the block linears they quantized on the way)."""
    sources = opts.sources()
    tokenizer = Tokenizer.from_str(loaded.tokenizer_json)
    wins, counts = mix_windows([tokenizer.encode(t.text).ids for t in sources], sources, opts)
    progress(f"calibration text: {', '.join(f'{t.name} ({n})' for t, n in zip(sources, counts))}")
    model = reference_model(loaded.config, loaded.weights).requires_grad_(False)
    quantize = None
    stored: dict[str, tuple] = {}   # weight_key -> quantize_weight's result, handed to the quantize pass
    if opts.sequential:
        def quantize(name: str, w: np.ndarray, h: np.ndarray) -> np.ndarray:
            if names.parse(name)[0] in _STACKED:   # experts keep no fp16 residual; quantize_moe quantizes them itself
                return dequantized_weight(w, replace(recipe, fp16_residual=0.0), h)
            r = recipe.for_weight(name)
            done = quantize_weight(w, r, h)
            stored[weight_key(w, r.to_json(), h)] = done
            return dequantize_weight(done, r)

        if recipe.embeddings is not WeightFormat.F16:   # block 0 sees the embedding rows the artifact holds
            table = model.token_embd.weight
            table.copy_(torch.from_numpy(dequantized_embedding(table.numpy(), recipe)))
    experts: list[calibrate_moe.ExpertStats] = []
    hessians = collect(model, wins, quantize, progress, experts)
    info = {**opts.to_json(sources, counts), **({"experts": calibrate_moe.summary(experts)} if experts else {})}
    return Calibration(hessians, info, stored)


@torch.no_grad()
def collect(model: torch.nn.Module, windows: list[list[int]], quantize: Quantizer | None = None,
            progress: Progress = lambda s: None, experts: list | None = None) -> dict[str, np.ndarray]:
    """Mean ``x^T x`` (f32 ``[K, K]``) of every distinct linear input over ``windows``, block by block,
    and of each expert's inputs in mixture-of-experts blocks (``calibrate_moe``; their
    ``ExpertStats`` are appended to ``experts`` when given).

    With ``quantize``, each block's linears are replaced by ``quantize(name, W, H)`` once its
    statistics are known, before its outputs feed the next block (q/k/v and gate/up
    row-concatenated under their fused names, as the quantize pass sees them). ``model`` is
    modified then.
    """
    hidden = [model.token_embd(torch.tensor(w, dtype=torch.int64)) for w in windows]   # [T, H] each
    positions = [torch.arange(len(w), dtype=torch.int32) for w in windows]
    out: dict[str, np.ndarray] = {}
    for i in range(len(model.blk)):
        progress(f"calibrating block {i + 1}/{len(model.blk)}")
        if model.cfg.moe is None:
            hidden = _dense_block(model, i, hidden, positions, quantize, out)
        else:
            hidden = _moe_block(model, i, hidden, positions, quantize, out, experts)
    out[names.LM_HEAD] = _second_moment([model.output_norm(h) for h in hidden])
    return out


# The linears of a dense block by the input they share, in the order the block reads them, and the
# name the quantize pass gives each group's rows concatenated (passes/fuse_attention.py, fuse_mlp.py).
_T = names.Tensor
_GROUPS = {_T.ATTN_QKV: (_T.ATTN_Q, _T.ATTN_K, _T.ATTN_V), _T.ATTN_OUTPUT: (_T.ATTN_OUTPUT,),
           _T.FFN_GATE_UP: (_T.FFN_GATE, _T.FFN_UP), _T.FFN_DOWN: (_T.FFN_DOWN,)}


def _dense_block(model: torch.nn.Module, i: int, hidden: list[torch.Tensor], positions: list[torch.Tensor],
                 quantize: Quantizer | None, out: dict[str, np.ndarray]) -> list[torch.Tensor]:
    """Block ``i``'s outputs for every window, its statistics in ``out``: the block runs stage by stage
    over all windows (each stage's output is one group of linears' input); with ``quantize``, every
    group is then replaced and the block runs again on the quantized weights."""
    block, rope = model.blk[i], model.rope_args(i)

    def feeds(fused: names.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        out[names.name(_GROUPS[fused][0], i)] = _second_moment(inputs)
        return inputs

    x = feeds(_T.ATTN_QKV, [block.attn_norm(h) for h in hidden])                               # [T, H] each
    a = feeds(_T.ATTN_OUTPUT, [block.attention_mix(x_, p, rope) for x_, p in zip(x, positions)])  # [T, NH*D]
    mid = [block.attention_out(h, a_) for h, a_ in zip(hidden, a)]
    x = feeds(_T.FFN_GATE_UP, [block.ffn_norm(h) for h in mid])
    m = feeds(_T.FFN_DOWN, [block.ffn_mix(x_) for x_ in x])                                    # [T, I]
    if quantize is None:
        return [block.ffn_out(h, m_) for h, m_ in zip(mid, m)]
    del x, a, m, mid
    _quantize_groups(block, i, (_T.ATTN_QKV, _T.ATTN_OUTPUT, _T.FFN_GATE_UP, _T.FFN_DOWN), quantize, out)
    return [model.forward_block(i, h, p) for h, p in zip(hidden, positions)]


def _quantize_groups(block: torch.nn.Module, i: int, groups: tuple[names.Tensor, ...], quantize: Quantizer,
                     out: dict[str, np.ndarray]) -> None:
    """Replace each group's linears by ``quantize`` of their rows concatenated, under the fused name."""
    for fused in groups:
        kinds = _GROUPS[fused]
        linears = [getattr(block, k.value) for k in kinds]
        deq = quantize(names.name(fused, i), np.concatenate([lin.weight.numpy() for lin in linears]),
                       out[names.name(kinds[0], i)])
        for lin, rows in zip(linears, np.split(deq, np.cumsum([lin.out_features for lin in linears])[:-1])):
            lin.weight.copy_(torch.from_numpy(rows))


def _moe_block(model: torch.nn.Module, i: int, hidden: list[torch.Tensor], positions: list[torch.Tensor],
               quantize: Quantizer | None, out: dict[str, np.ndarray], experts: list | None) -> list[torch.Tensor]:
    """Block ``i`` of a mixture-of-experts model: its statistics from one pass over every window (hooks on
    the attention's linears, ``calibrate_moe.ExpertStats`` on the experts), then, with ``quantize``,
    its linears replaced and its outputs computed again."""
    block = model.blk[i]
    inputs: dict[str, list[torch.Tensor]] = {}
    hooks = [getattr(block, kind.value).register_forward_pre_hook(
        lambda mod, args, key=names.name(kind, i): inputs.setdefault(key, []).append(args[0]))
        for kind in (_T.ATTN_Q, _T.ATTN_OUTPUT)]
    stats = calibrate_moe.ExpertStats(block, model.cfg, i)
    hooks.append(block.ffn_norm.register_forward_hook(stats.hook))
    outputs = [model.forward_block(i, h, p) for h, p in zip(hidden, positions)]
    for hook in hooks:
        hook.remove()
    for key, xs in inputs.items():
        out[key] = _second_moment(xs)
    out.update(stats.hessians())
    if experts is not None:
        experts.append(stats)
    if quantize is None:
        return outputs
    _quantize_groups(block, i, (_T.ATTN_QKV, _T.ATTN_OUTPUT), quantize, out)
    stats.quantize(quantize, out)
    return [model.forward_block(i, h, p) for h, p in zip(hidden, positions)]


def _second_moment(inputs: list[torch.Tensor]) -> np.ndarray:
    """Mean ``x^T x`` (f32 ``[K, K]``, symmetric) over the rows of every ``x [T, K]`` in ``inputs``: one f32 matmul."""
    x = torch.cat([t.reshape(-1, t.shape[-1]) for t in inputs]).float()   # [sum T, K]
    h = (x.T @ x).div_(x.shape[0])
    return ((h + h.T) * 0.5).numpy()
