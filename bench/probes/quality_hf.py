"""Perplexity of artifacts' weights measured by transformers, independently of grokc's model and plan.

transformers' model of the GGUF (``LlamaForCausalLM``, or ``Gemma3ForCausalLM`` for a Gemma 3
file; dequantized to fp32, Llama's q/k rows un-permuted and Gemma's norms stored as ``1 + w`` turned
back into ``w`` by transformers' own GGUF loader) is the reference. For each artifact, a copy gets every
weight replaced by what the artifact stores (int4 linears dequantized from their packed codes by
this file's own reading of the documented layout (``abi/int4.py``, ``abi/int8.py``), not by grokc's
``int4.dequantize``, plus the ``--fp16-residual`` CSR where there is one; an int8 LM head or
embedding table from its one-byte codes, code 128 = 0 unless zero-points are stored; fused q/k/v and
gate/up split back; f16 norms and embeddings; each int4 tensor's group size read from its scales'
shape), and transformers computes
the perplexity of both on held-out text: every evaluation genre grokc ships (none of them read by
calibration) and each ``--text`` file, ``--tokens`` tokens of each in windows of ``--context``
spread evenly over the text. Also reported per artifact and text: top-1 agreement of its next-token
argmax with the reference's and the mean KL(reference || artifact); per artifact, the worst text
and the largest relative (Frobenius) error of one of its weight matrices against the reference's
(f16 rounding gives ~2e-4; a q/k/v or gate/up split out of transformers' row order gives ~1). A
rotated artifact (``--rotate``, ``int4-rot``) stores weights transformers runs as they are (norms of
weight 1, an untied head: the rotation is folded exactly, so they compute the reference's logits up
to quantization); its tensors differ from the reference's by the turn, so the check reported is the
embedding table's row norms, which the turn keeps.

Families (``_FAMILIES``, by the manifest's ``model.architecture``) differ only in their norms: which
a block has and their transformers names, and how the artifact stores them. Llama stores ``w``.
Gemma 3 stores ``1 + w`` (transformers' ``Gemma3RMSNorm`` scales by ``1 + w``) for its four block
norms, the q/k head norms and the final norm; its residual stream is stored times ``s = 2**-k``
(``passes/scale_residual.py``), so its post-attention and post-feedforward norms hold
``(1 + w) * s``. ``s`` is read from the artifact's plan: its embedding launch's ``scale`` over the
manifest's ``embedding_scale`` (``sqrt(hidden)``, which transformers applies itself); the other
changes of that pass (the stream norms' ``eps`` times ``s**2``) are no weights. A Gemma artifact's
embedding table is unscaled and its head tied, as transformers has them.
grokc's own code is used only to read the artifact's files and the shipped texts.

    python bench/probes/quality_hf.py dist/int4 dist/int4-rtn ... --model SmolLM2-135M-Instruct.Q4_1.gguf \
        [--text /usr/share/common-licenses/GPL-3] [--tokens 8192] [--context 512]
    python bench/probes/quality_hf.py dist/gemma-int4 --model gemma-3-270m-q4_k_m.gguf --tokens 4096

Prints one JSON document: per text, the reference perplexity and each artifact's.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from grokc.artifacts.store import open_artifact
from grokc.compiler.text import eval_texts

# grokc's linear kinds (per block) -> transformers' modules under model.layers.<i>; every family alike.
_LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj"}


@dataclass(frozen=True)
class Family:
    """How one architecture's stored norms become transformers' (see the module docstring)."""

    model_type: str                  # transformers' config.model_type of the reference
    norms: dict[str, str]            # grokc's block norm kinds -> transformers' modules under model.layers.<i>
    norm_shift: float = 0.0          # the artifact stores norm_shift + w
    post_norms: frozenset[str] = frozenset()   # block norms adding into the residual stream: stored times s


_FAMILIES = {
    "llama": Family("llama", {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}),
    "gemma3": Family("gemma3_text",
                     {"attn_norm": "input_layernorm", "attn_q_norm": "self_attn.q_norm",
                      "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
                      "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
                     norm_shift=1.0, post_norms=frozenset({"post_attention_norm", "post_ffw_norm"})),
}
# Stored tensors that are not model weights (RoPE tables, local layers' too; the sampler's EOS ids).
_NOT_WEIGHTS = {"rope_inv_freq", "rope_table", "rope_inv_freq_local", "rope_table_local", "sampling.eos_ids"}
# abi/int4.py's layout: in each little-endian u32 word of a row, nibble j holds code _NIBBLE[j]
# of that word's 8 consecutive codes.
_NIBBLE = [0, 2, 4, 6, 1, 3, 5, 7]


def dequantize_q4(packed: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, group_size: int) -> np.ndarray:
    """f32 ``[N, K]`` = (code - zero) * scale from ``u8 [N, K/2]`` packed codes; zero 8 when symmetric."""
    n = packed.shape[0]
    words = np.ascontiguousarray(packed).view("<u4")                     # [N, K/8]
    codes = np.empty((n, words.shape[1], 8), np.float32)
    for j, e in enumerate(_NIBBLE):
        codes[:, :, e] = (words >> np.uint32(4 * j)) & np.uint32(0xF)
    codes = codes.reshape(n, -1)
    col_group = np.arange(codes.shape[1]) // (group_size or codes.shape[1])
    zero = np.float32(8) if zeros is None else np.asarray(zeros, np.float32)[:, col_group]
    return (codes - zero) * np.asarray(scales, np.float32)[:, col_group]


def dequantize_q8(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None) -> np.ndarray:
    """f32 ``[N, K]`` = (code - zero) * scale from ``u8 [N, K]`` codes, one byte each; ``scales`` (and
    ``zeros``) ``[N, G]`` for G equal groups along K (1: per row); zero 128 when symmetric."""
    k = codes.shape[1]
    col = np.arange(k) // (k // scales.shape[1])
    zero = np.float32(128) if zeros is None else np.asarray(zeros, np.float32)[:, col]
    return (np.asarray(codes, np.float32) - zero) * np.asarray(scales, np.float32)[:, col]


def family(art, cfg) -> Family:
    """The artifact's family (its manifest's architecture), checked against the reference's config."""
    arch = art.manifest.model.architecture
    fam = _FAMILIES.get(arch)
    if fam is None:
        raise SystemExit(f"{art.path}: a {arch} artifact; this script reads {', '.join(sorted(_FAMILIES))} ones")
    if cfg.model_type != fam.model_type:
        raise SystemExit(f"{art.path}: a {arch} artifact, but transformers made a {cfg.model_type} model of the GGUF")
    return fam


def residual_scale(art) -> float:
    """``s``, the residual stream's scale in the artifact (``passes/scale_residual.py``; 1 without it): the
    plan's embedding ``scale`` (``embedding_scale * s``) over the manifest's ``embedding_scale``."""
    plan = art.plan(min(art.manifest.archs))
    launch = next(la for g in plan.graphs.values() for la in g.launches if la.op == "embedding")
    s = next(a.value for a in launch.args if a.param == "scale") / art.manifest.model.embedding_scale
    if s <= 0 or 2.0 ** round(math.log2(s)) != s:   # the pass scales by a power of two, exactly
        raise SystemExit(f"{art.path}: its embedding launch scales by {s:g} times embedding_scale, not a power of two")
    return s


def artifact_state(art, cfg) -> dict[str, torch.Tensor]:
    """transformers' state-dict names -> the artifact's weights as f32 tensors. Refuses an artifact
    holding a tensor this reading does not consume (e.g. a sparse correction), rather than measure
    it without."""
    fam, s = family(art, cfg), residual_scale(art)
    path, w = art.path, art.weights()
    used = set(_NOT_WEIGHTS)

    def take(name: str) -> np.ndarray:
        used.add(name)
        return np.asarray(w[name], np.float32)

    def dense(base: str) -> np.ndarray:
        if f"{base}.q8weight" in w:  # --lm-head int8: one scale (and zero) per row
            used.update(f"{base}.{s}" for s in ("q8weight", "scales", "zeros"))
            return dequantize_q8(np.asarray(w[f"{base}.q8weight"]), np.asarray(w[f"{base}.scales"]), w.get(f"{base}.zeros"))
        if f"{base}.qweight" in w:
            used.update(f"{base}.{s}" for s in ("qweight", "scales", "zeros"))
            k, groups = w[f"{base}.qweight"].shape[1] * 2, w[f"{base}.scales"].shape[1]
            out = dequantize_q4(np.asarray(w[f"{base}.qweight"]), np.asarray(w[f"{base}.scales"]),
                                w.get(f"{base}.zeros"), 0 if groups == 1 else -(-k // groups))
            if f"{base}.residual_vals" in w:  # --fp16-residual, CSR of f16 corrections: out[row, col] += val
                roles = [f"{base}.residual_{s}" for s in ("rowptr", "cols", "vals")]
                used.update(roles)
                rowptr, cols, vals = (np.asarray(w[r]) for r in roles)
                rows = np.repeat(np.arange(out.shape[0]), np.diff(rowptr.astype(np.int64)))
                np.add.at(out, (rows, cols.astype(np.int64)), vals.astype(np.float32))
            return out
        return take(f"{base}.weight")

    def norm(name: str, post: bool = False) -> np.ndarray:
        """transformers' ``w`` of a norm stored as ``norm_shift + w``, times ``s`` for a post-norm."""
        return take(name) / np.float32(s if post else 1.0) - np.float32(fam.norm_shift)

    def embedding() -> np.ndarray:
        """--embeddings: int4 (token_embd.qweight) or int8 (token_embd.q8weight, code 128 = 0), else f16."""
        codes = next((f"token_embd.{s}" for s in ("qweight", "q8weight") if f"token_embd.{s}" in w), None)
        if codes is None:
            return take("token_embd.weight")
        used.update({codes, "token_embd.scales", "token_embd.zeros"})
        scales, zeros = np.asarray(w["token_embd.scales"]), w.get("token_embd.zeros")
        h = cfg.hidden_size
        egs = 0 if scales.shape[1] == 1 else h // scales.shape[1]  # per row unless the group divides H
        if codes.endswith(".qweight"):
            return dequantize_q4(np.asarray(w[codes]), scales, zeros, egs)
        return dequantize_q8(np.asarray(w[codes]), scales, zeros)

    q, kv, ff = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size
    table = embedding()
    out = {"model.embed_tokens.weight": table, "model.norm.weight": norm("output_norm.weight"),
           # no output.*: the head reads the table as stored (f16, or the int8 codes it shares)
           "lm_head.weight": dense("output") if any(f"output.{s}" in w for s in ("qweight", "q8weight", "weight"))
           else table}
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        qkv, gu = dense(f"blk.{i}.attn_qkv"), dense(f"blk.{i}.ffn_gate_up")
        assert qkv.shape[0] == q + 2 * kv and gu.shape[0] == 2 * ff, (qkv.shape, gu.shape)
        parts = {"attn_q": qkv[:q], "attn_k": qkv[q:q + kv], "attn_v": qkv[q + kv:], "ffn_gate": gu[:ff],
                 "ffn_up": gu[ff:], "attn_output": dense(f"blk.{i}.attn_output"),
                 "ffn_down": dense(f"blk.{i}.ffn_down")}
        out.update({pre + _LINEARS[k] + ".weight": v for k, v in parts.items()})
        out.update({pre + hf + ".weight": norm(f"blk.{i}.{k}.weight", post=k in fam.post_norms)
                    for k, hf in fam.norms.items()})
    unread = sorted(set(w) - used)
    if unread:
        raise SystemExit(f"{path}: stores {len(unread)} tensors this script does not read ({', '.join(unread[:4])}, ...); "
                         "teach artifact_state how they change the weights before measuring it")
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}


def _rotated(art) -> bool:
    """True when the artifact's weights were turned before quantizing (``--rotate``, ``int4-rot``)."""
    return bool(art.manifest.quant.recipe.get("rotate"))


def _weight_error(state: dict[str, torch.Tensor], ref_state: dict[str, torch.Tensor], rotated: bool) -> dict:
    """The largest relative (Frobenius) error of one stored matrix against the reference's; for a rotated
    artifact, whose every tensor is the reference's turned (``E Q``, ``W diag(g) Q``, ``Qᵀ W``), compared
    with what the turn keeps instead: the embedding table's row norms (``|E_i Q| = |E_i|``). The perplexity
    needs no un-rotation: the stored (rotated) weights compute the reference's logits up to quantization."""
    if rotated:
        norms = [t["model.embed_tokens.weight"].double().norm(dim=1) for t in (state, ref_state)]
        return {"rotated": True, "embedding_row_norm_rel_err": float(f"{float((norms[0] - norms[1]).norm() / norms[1].norm()):.3g}")}
    ref_w = {k: ref_state.get(k, ref_state["model.embed_tokens.weight"]) for k in state}   # a tied head
    err = {k: float((v - ref_w[k]).norm() / ref_w[k].norm()) for k, v in state.items()}
    worst = max(err, key=err.get)
    return {"max_rel_err": float(f"{err[worst]:.3g}"), "tensor": worst}


def spread(ids: list[int], tokens: int, context: int) -> list[list[int]]:
    """``tokens // context`` windows of ``context`` ids, the first at the start, the last at the end."""
    starts = np.linspace(0, len(ids) - context, tokens // context).round().astype(int)
    return [ids[s:s + context] for s in starts.tolist()]


@torch.no_grad()
def evaluate(models: dict[str, torch.nn.Module], windows: list[list[int]]) -> dict[str, dict]:
    """transformers' loss of each model (``"reference"`` first) over ``windows``: perplexity, and for the
    others top-1 agreement with the reference's argmax and mean KL(reference || model), window by window
    so that only one window's log-probabilities are held."""
    acc = {name: {"nll": 0.0, "agree": 0, "kl": 0.0} for name in models}
    n = 0
    for w in windows:
        window = torch.tensor([w])
        ref = None
        for name, model in models.items():
            out = model(input_ids=window, labels=window)     # loss: mean over the context - 1 predictions
            logp = torch.log_softmax(out.logits[0, :-1].double(), -1)
            acc[name]["nll"] += float(out.loss) * (len(w) - 1)
            if ref is None:
                ref = logp
            else:
                acc[name]["agree"] += int((logp.argmax(-1) == ref.argmax(-1)).sum())
                acc[name]["kl"] += float((ref.exp() * (ref - logp)).sum())
        n += len(w) - 1
    return {name: {"ppl": math.exp(a["nll"] / n), "top1_agreement": a["agree"] / n, "kl": a["kl"] / n}
            for name, a in acc.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifacts", nargs="+", type=Path)
    ap.add_argument("--model", required=True, type=Path, help="the GGUF the artifacts were built from")
    ap.add_argument("--text", action="append", type=Path, default=[], help="another held-out text file")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--context", type=int, default=512)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sha = hashlib.sha256(args.model.read_bytes()).hexdigest()
    arts = [open_artifact(path) for path in args.artifacts]
    for art in arts:
        if art.manifest.source.sha256 != sha:
            raise SystemExit(f"{art.path} was not built from {args.model}")
    kw = dict(gguf_file=args.model.name)
    ref = AutoModelForCausalLM.from_pretrained(str(args.model.parent), dtype=torch.float32, **kw).eval()
    tok = AutoTokenizer.from_pretrained(str(args.model.parent), **kw)
    texts = {t.name: t.text for t in eval_texts()} | {str(p): p.read_text() for p in args.text}
    wins, n_ids = {}, {}
    for name, t in texts.items():
        ids = tok(t).input_ids
        if len(ids) < args.tokens:
            raise SystemExit(f"{name} has only {len(ids)} tokens; pass --tokens {len(ids) // args.context * args.context}")
        wins[name], n_ids[name] = spread(ids, args.tokens, args.context), len(ids)
    models, result = {"reference": ref}, {}
    ref_state = {k: v.detach() for k, v in ref.state_dict().items()}
    for path, art in zip(args.artifacts, arts):
        model = copy.deepcopy(ref)
        state = artifact_state(art, ref.config)
        result.setdefault("weights", {})[path.name] = _weight_error(state, ref_state, _rotated(art))
        # A tied head quantized on its own (--lm-head int4) must not overwrite the shared embedding.
        model.lm_head.weight = torch.nn.Parameter(state.pop("lm_head.weight"), requires_grad=False)
        keys = model.load_state_dict(state, strict=False)
        assert not keys.unexpected_keys and set(keys.missing_keys) <= {"lm_head.weight"}, keys
        models[path.name] = model
    increase: dict[str, dict[str, float]] = {path.name: {} for path in args.artifacts}
    for name, w in wins.items():
        m = evaluate(models, w)
        result[name] = {"tokens": args.tokens, "context": args.context, "text_tokens": n_ids[name],
                        "reference": round(m["reference"]["ppl"], 3)}
        for art, r in list(m.items())[1:]:
            increase[art][name] = r["ppl"] / m["reference"]["ppl"] - 1
            result[name][art] = {"ppl": round(r["ppl"], 3), "increase": f"{increase[art][name]:+.1%}",
                                 "top1_agreement": round(r["top1_agreement"], 4), "kl": round(r["kl"], 4)}
    for art, inc in increase.items():
        hardest = max(inc, key=inc.get)
        result.setdefault("worst", {})[art] = {"text": hardest, "increase": f"{inc[hardest]:+.1%}"}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
