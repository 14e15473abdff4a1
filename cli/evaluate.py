"""``grokc eval``: the artifact's CPU plan, teacher-forced token by token through the decode graph
(``Engine.score``), against the unquantized torch model on the evaluation text: exactly what the
runner computes, f16 activations included; one decode step per token, so slow (minutes for 4096
tokens). ``compiler/quality.py``'s build report measures the stored weights instead (seconds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from grokc.compiler.frontends import load_model
from grokc.compiler.quality import check_source, metrics, reference_logits, reference_model
from grokc.compiler.text import pydoc_text, windows

Progress = Callable[[str], None]


def evaluate_artifact(artifact: Path, model: Path, tokens: int = 1024, context: int = 256,
                      progress: Progress = lambda s: None, tokenizer: Path | None = None) -> dict:
    """Quality metrics of ``artifact`` (its CPU plan) against the source ``model`` on the evaluation split."""
    from grokc.runner import Runner

    runner = Runner(artifact, device="cpu")
    loaded = load_model(model, progress=progress, tokenizer=tokenizer)
    check_source(runner.artifact.manifest.source.sha256, loaded.source_sha256, model)
    wins = windows(runner.encode(pydoc_text("eval")), tokens, context)
    # The plan (numpy) runs before the reference (torch): once torch's thread pool has run, its idle
    # threads slow numpy's BLAS several-fold on a machine with few cores.
    progress(f"artifact: teacher-forced decode on the CPU plan, {len(wins)} windows of {context} tokens")
    art = runner.engine.score(wins)
    progress("reference: the unquantized torch model")
    ref_model = reference_model(loaded.config, loaded.weights)
    ref = [reference_logits(ref_model, w) for w in wins]
    return {"quant": runner.artifact.manifest.quant.to_json(), "tokens": tokens, "context": context, **metrics(ref, art, wins)}
