"""Quality of an artifact against its unquantized source: perplexity, top-1 agreement, KL.

The reference is grokc's torch model in float32 on the source weights (the dequantized GGUF or
the HF checkpoint): the "fp16 model" of the issues, without any rounding of ours. The artifact is
measured in one of two ways:

- ``evaluate_artifact`` (``grokc eval``): its CPU plan, teacher-forced token by token through the
  decode graph (``Engine.score``), so what is measured is exactly what the runner computes, f16
  activations included; one decode step per token, so slow (minutes for 4096 tokens).
- ``build_report`` (``grokc build``): the same torch model in float32 on the weights the module
  stores (int4 codes dequantized plus any fp16 residual, everything else f16-rounded): what the
  weight recipe costs, one forward per window (seconds). On SmolLM2 the two agree to about 0.1 % in perplexity.

Text: the build report measures every held-out genre shipped with the package (``text.eval_texts``:
the pydoc evaluation split, news, fiction, dialogue, encyclopedic prose; calibration never reads
them) plus the user's ``--eval-text`` files, each on its own: ``tokens`` tokens in windows spread
evenly over the text. It reports each genre and the worst (the largest perplexity increase, the
lowest top-1 agreement, the largest KL), and ``--max-ppl-increase`` judges the worst. Every
machine evaluates the same tokens with no download.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch

from grokc.abi import int4, int8
from grokc.compiler import models
from grokc.compiler.frontends import LoadedModel
from grokc.compiler.models import transformer
from grokc.compiler.text import Text, spread_windows
from grokc.core import tensors as names
from grokc.core.config import ModelConfig
from grokc.core.errors import ArtifactError
from grokc.core.ir import Module, Node, OpKind, WeightFormat
from grokc.passes import fuse_moe, sparse_residual
from grokc.quant import residual

Progress = Callable[[str], None]


def reference_model(cfg: ModelConfig, weights: Mapping[str, np.ndarray]) -> torch.nn.Module:
    """grokc's torch model of ``cfg``'s architecture in float32 with canonically named ``weights``
    (``names.LM_HEAD``, when given, becomes a head of its own even if the config ties it to the
    embeddings)."""
    model = models.get(cfg.architecture).model(cfg).eval()
    state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in transformer.parameters(cfg, weights).items()}
    if names.LM_HEAD in state and model.output is None:
        model.output = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    model.load_state_dict(state, strict=False)
    return model


_FUSED = {"attn_qkv": ("attn_q", "attn_k", "attn_v"), "ffn_gate_up": ("ffn_gate", "ffn_up")}


def stored_weights(module: Module) -> dict[str, np.ndarray]:
    """Canonically named f32 weights as a quantized ``module`` stores them: every LINEAR's matrix as
    the kernels see it (int4 and int8 dequantized, plus any fp16 residual), fused ones (and their
    biases) split back, norms and embeddings as stored (the post-norms divided by the residual
    stream's scale, ``meta.residual_scale``: the model they compute)."""
    cfg = module.config
    g = next(iter(module.graphs.values()))
    out: dict[str, np.ndarray] = {}
    experts: dict[str, np.ndarray] = {}   # MOE_LINEAR weight name -> f32 [E', NW, K]
    for n in g.nodes:
        if n.op is OpKind.EMBEDDING:
            out[n.inputs["table"].rsplit(".", 1)[0] + ".weight"] = _dense_table(module, n)   # token_embd.weight
        if n.op is OpKind.MOE_LINEAR:
            experts[n.inputs.get("weight", n.inputs.get("qweight"))] = _dense_experts(module, n)
        if n.op is not OpKind.LINEAR:
            continue
        w = _dense(module, n)
        if n.outputs[0] in g.outputs:
            out[names.LM_HEAD] = w
            continue
        base = n.inputs.get("weight", n.inputs.get("qweight")).rsplit(".", 1)[0]   # blk.<i>.<kind>
        layer, kind = base.split(".")[1], base.split(".")[2]
        parts = _FUSED.get(kind, (kind,))
        rows = {"attn_q": cfg.q_dim, "attn_k": cfg.kv_dim, "attn_v": cfg.kv_dim}
        sizes = [rows.get(p, w.shape[0] // len(parts)) for p in parts]
        stored = {"weight": w, **({"bias": np.asarray(module.params[n.inputs["bias"]], np.float32)} if "bias" in n.inputs else {})}
        for suffix, a in stored.items():
            for p, chunk in zip(parts, np.split(a, np.cumsum(sizes)[:-1])):
                out[names.name(names.Tensor(p), int(layer), suffix)] = chunk
    # the norms adding into the residual stream, whose weights hold its scale (passes/scale_residual.py)
    post = {n.inputs["weight"] for n in g.nodes if n.op is OpKind.RMS_NORM and "residual" in n.inputs}
    for name, a in module.params.items():   # every norm weight, wherever its node reads it
        parsed = names.parse(name)
        if parsed is not None and parsed[0].is_norm:
            out[name] = np.asarray(a, np.float32) / np.float32(module.meta.residual_scale if name in post else 1.0)
    for layer in range(cfg.num_layers) if cfg.moe else ():
        base = {k: names.name(k, layer).removesuffix(".weight") for k in (names.Tensor.FFN_GATE_UP_EXPS, names.Tensor.FFN_DOWN_EXPS)}
        gate_up, down = (next(w for key, w in experts.items() if key.startswith(b + ".")) for b in base.values())
        out.update(fuse_moe.canonical_weights(layer, out.pop(names.name(names.Tensor.FFN_GATE_INP, layer)), gate_up, down,
                                              cfg.moe.n_experts, cfg.moe.shared_size))
    return transformer.unfold(cfg, out)


def _dense_experts(module: Module, n: Node) -> np.ndarray:
    """f32 ``[E', NW, K]``: a MOE_LINEAR's stacked matrices as the kernels see them."""
    p, a = module.params, n.attrs
    if a.weight_format is not WeightFormat.Q4:
        return np.asarray(p[n.inputs["weight"]], np.float32)
    q, s, z = p[n.inputs["qweight"]], p[n.inputs["scales"]], p.get(n.inputs.get("zeros", ""))
    return np.stack([int4.dequantize(q[e], s[e], None if z is None else z[e], a.group_size) for e in range(q.shape[0])])


def _dense_table(module: Module, n: Node) -> np.ndarray:
    """f32 ``[V, H]``: the embedding table as the ``embedding`` op reads it (q8/q4 codes dequantized)."""
    p, fmt = module.params, n.attrs.weight_format
    if fmt not in (WeightFormat.Q8, WeightFormat.Q4):
        return np.asarray(p[n.inputs["table"]], np.float32)
    zeros = None if "zeros" not in n.inputs else p[n.inputs["zeros"]]
    dequantize = int4.dequantize if fmt is WeightFormat.Q4 else int8.dequantize
    return dequantize(p[n.inputs["table"]], p[n.inputs["scales"]], zeros, n.attrs.group_size)


def _dense(module: Module, n: Node) -> np.ndarray:
    """f32 ``[NW, K]``: a LINEAR's matrix as the kernels see it (q4 / q8 codes dequantized, plus its fp16 residual)."""
    p, fmt = module.params, n.attrs.weight_format
    if fmt not in (WeightFormat.Q8, WeightFormat.Q4):
        return np.asarray(p[n.inputs["weight"]], np.float32)
    zeros = n.inputs.get("zeros")
    dequantize = int4.dequantize if fmt is WeightFormat.Q4 else int8.dequantize
    w = dequantize(p[n.inputs["qweight"]], p[n.inputs["scales"]], None if zeros is None else p[zeros],
                   n.attrs.group_size)
    base = n.inputs["qweight"].rsplit(".", 1)[0]
    csr = [f"{base}.{role}" for role in sparse_residual.ROLES]    # the fp16 residual, when kept
    return residual.scatter(w, *(p[c] for c in csr)) if csr[0] in p else w


@torch.no_grad()
def reference_logits(model: torch.nn.Module, window: list[int]) -> np.ndarray:
    """f32 ``[len(window), vocab]``: the logits after each token of the window."""
    ids = torch.tensor(window, dtype=torch.int32)
    return model(ids, torch.arange(len(window), dtype=torch.int32)).float().numpy()


def metrics(ref: list[np.ndarray], art: list[np.ndarray], wins: list[list[int]]) -> dict:
    """Perplexities of both, top-1 agreement and mean KL(ref || art) over all predicted positions."""
    return combine([position_stats(r, a, w) for r, a, w in zip(ref, art, wins)])


def position_stats(ref: np.ndarray, art: np.ndarray, window: list[int]) -> dict[str, np.ndarray]:
    """Per predicted position of one window: both NLLs, top-1 agreement and KL(ref || art) (float64)."""
    targets = torch.as_tensor(np.asarray(window[1:], np.int64))
    lr, la = (torch.log_softmax(torch.from_numpy(x[:-1]).double(), -1) for x in (ref, art))   # [T-1, V]
    rows = torch.arange(len(targets))
    return {"nll_ref": -lr[rows, targets].numpy(), "nll_art": -la[rows, targets].numpy(),
            "agree": ref[:-1].argmax(-1) == art[:-1].argmax(-1), "kl": (lr.exp() * (lr - la)).sum(-1).numpy()}


def combine(stats: list[dict[str, np.ndarray]]) -> dict:
    """``metrics`` from the ``position_stats`` of every window."""
    cat = {k: np.concatenate([s[k] for s in stats]) for k in stats[0]}
    ppl_ref = float(np.exp(cat["nll_ref"].mean()))
    ppl_art = float(np.exp(cat["nll_art"].mean()))
    return {
        "positions": int(cat["nll_ref"].size),
        "ppl_reference": ppl_ref,
        "ppl_artifact": ppl_art,
        "ppl_increase": ppl_art / ppl_ref - 1,
        "top1_agreement": float(cat["agree"].mean()),
        "kl_mean": float(cat["kl"].mean()),
    }


def report_windows(tokenizer_json: str, texts: list[Text], tokens: int, context: int) -> dict[str, list[list[int]]]:
    """Each text's evaluation windows (``spread_windows``), by name: tokenized before the build's long
    steps, so a text too short for ``tokens`` fails at once."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    return {t.name: spread_windows(tokenizer.encode(t.text).ids, tokens, context, t.name) for t in texts}


def build_report(loaded: LoadedModel, module: Module, texts: list[Text], windows: dict[str, list[list[int]]],
                 progress: Progress = lambda s: None) -> dict:
    """The build's quality report: ``metrics`` of the weights ``module`` stores (float32 torch model)
    against the source weights on each text's ``windows`` (``report_windows``), and the worst of them,
    rounded to 4 significant digits so that builds stay byte-identical."""
    ref_model = reference_model(loaded.config, loaded.weights)
    art_model = reference_model(loaded.config, stored_weights(module))
    genres = {}
    for t in texts:
        wins = windows[t.name]
        progress(f"quality: {t.name}, {len(wins)} windows of {len(wins[0])} tokens")
        stats = [position_stats(reference_logits(ref_model, w), reference_logits(art_model, w), w) for w in wins]
        genres[t.name] = {k: _rounded(v) for k, v in combine(stats).items()} | ({"sha256": t.sha256} if t.sha256 else {})
    worst = max(genres, key=lambda g: genres[g]["ppl_increase"])
    first = windows[texts[0].name]
    return {"measured_with": "torch float32 on the stored weights", "tokens": len(first) * len(first[0]),
            "context": len(first[0]),
            "genres": genres,
            "worst": {"genre": worst, "ppl_increase": genres[worst]["ppl_increase"],
                      "top1_agreement": min(r["top1_agreement"] for r in genres.values()),
                      "kl_mean": max(r["kl_mean"] for r in genres.values())}}


def _rounded(v):
    return v if isinstance(v, int) else float(f"{v:.4g}")


def check_source(built_from: str, sha256: str, model: Path) -> None:
    """Refuse a source model whose hash is not ``built_from``, the hash the artifact records."""
    if built_from != sha256:
        raise ArtifactError(f"the artifact was built from a different model (sha256 {built_from[:12]}…), "
                            f"not {model} ({sha256[:12]}…); pass the model it was built from")
