"""Quality of an artifact against its unquantized source: perplexity, top-1 agreement, KL.

The reference is grokc's torch Llama in float32 on the source weights (the dequantized GGUF or
the HF checkpoint): the "fp16 model" of the issues, without any rounding of ours. The artifact is
run by its CPU plan, teacher-forced token by token through the decode graph (``Engine.score``),
so what is measured is exactly what the runner computes.

Text: a fixed slice of the standard library's ``pydoc_data.topics`` (English prose shipped with
Python), so every machine evaluates the same tokens with no download.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch

from grokc.artifacts.errors import ArtifactError
from grokc.artifacts.store import open_artifact

from . import names
from .config import ModelConfig
from .frontends import load_model
from .models.llama import Llama

Progress = Callable[[str], None]


def pydoc_text(start_topic: int = 0) -> str:
    """The pydoc topics from ``start_topic`` on (sorted by name), joined: ~465K characters."""
    import pydoc_data.topics as topics

    keys = sorted(topics.topics)[start_topic:]
    return "\n\n".join(topics.topics[k] for k in keys)


def windows(token_ids: list[int], n_tokens: int, context: int) -> list[list[int]]:
    """``n_tokens`` tokens cut into consecutive windows of ``context`` tokens."""
    if len(token_ids) < n_tokens:
        raise ArtifactError(f"the evaluation text has only {len(token_ids)} tokens; ask for --tokens {len(token_ids)} or fewer")
    return [token_ids[i:i + context] for i in range(0, n_tokens - context + 1, context)]


def reference_model(cfg: ModelConfig, hf_weights: dict[str, np.ndarray]) -> Llama:
    model = Llama(cfg).eval()
    state = {names.from_hf(k): torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in hf_weights.items()
             if names.from_hf(k) is not None}
    model.load_state_dict(state, strict=False)
    return model


@torch.no_grad()
def reference_logits(model: Llama, window: list[int]) -> np.ndarray:
    """f32 ``[len(window), vocab]``: the logits after each token of the window."""
    ids = torch.tensor(window, dtype=torch.int32)
    return model(ids, torch.arange(len(window), dtype=torch.int32)).float().numpy()


def metrics(ref: list[np.ndarray], art: list[np.ndarray], wins: list[list[int]]) -> dict:
    """Perplexities of both, top-1 agreement and mean KL(ref || art) over all predicted positions."""
    nll_ref, nll_art, agree, kl = [], [], [], []
    for r, a, w in zip(ref, art, wins):
        targets = np.asarray(w[1:])
        lr, la = _log_softmax(r[:-1]), _log_softmax(a[:-1])
        rows = np.arange(len(targets))
        nll_ref.append(-lr[rows, targets])
        nll_art.append(-la[rows, targets])
        agree.append(r[:-1].argmax(-1) == a[:-1].argmax(-1))
        kl.append((np.exp(lr) * (lr - la)).sum(-1))
    ppl_ref = float(np.exp(np.concatenate(nll_ref).mean()))
    ppl_art = float(np.exp(np.concatenate(nll_art).mean()))
    return {
        "positions": int(sum(len(x) for x in nll_ref)),
        "ppl_reference": ppl_ref,
        "ppl_artifact": ppl_art,
        "ppl_increase": ppl_art / ppl_ref - 1,
        "top1_agreement": float(np.concatenate(agree).mean()),
        "kl_mean": float(np.concatenate(kl).mean()),
    }


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def evaluate_artifact(artifact: Path, model: Path, tokens: int = 1024, context: int = 256,
                      progress: Progress = lambda s: None) -> dict:
    """Quality metrics of ``artifact`` against the source ``model`` on the pydoc slice."""
    from grokc.runner import Runner

    runner = Runner(artifact, device="cpu")
    loaded = load_model(model, progress=progress)
    check_source(runner.artifact.manifest.source, loaded.source_sha256, model)
    wins = windows(runner.encode(pydoc_text()), tokens, context)
    progress(f"reference: {len(wins)} windows of {context} tokens")
    ref_model = reference_model(loaded.config, loaded.weights)
    ref = [reference_logits(ref_model, w) for w in wins]
    progress("artifact: teacher-forced decode on the CPU plan")
    art = runner.engine.score(wins)
    return {"quant": runner.artifact.manifest.quant, "tokens": tokens, "context": context, **metrics(ref, art, wins)}


def check_source(source: dict, sha256: str, model: Path) -> None:
    if source["sha256"] != sha256:
        raise ArtifactError(f"the artifact was built from a different model (sha256 {source['sha256'][:12]}…), "
                            f"not {model} ({sha256[:12]}…); pass the model it was built from")
