"""``grokc eval``: the artifact's CPU plan, teacher-forced token by token through the decode graph
(``Engine.score``), against the unquantized torch model on held-out text: exactly what the runner
computes, f16 activations included; one decode step per token, so slow (minutes per 1024 tokens).
Each genre is measured on its own (the shipped ones of ``text.EVAL_GENRES``, or those asked for,
and any ``--eval-text``), windows spread evenly over its text as in the build's report, and the worst
is reported beside them. ``compiler/quality.py``'s build report measures the stored weights instead (seconds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from grokc.compiler.frontends import load_model
from grokc.compiler.quality import check_source, metrics, reference_logits, reference_model
from grokc.compiler.text import EVAL_GENRES, eval_texts, spread_windows, user_text
from grokc.core.errors import BuildOptionError

Progress = Callable[[str], None]


def evaluate_artifact(artifact: Path, model: Path, tokens: int = 1024, context: int = 256,
                      genres: tuple[str, ...] = EVAL_GENRES, extra: tuple[Path, ...] = (),
                      progress: Progress = lambda s: None, tokenizer: Path | None = None) -> dict:
    """Quality metrics of ``artifact`` (its CPU plan) against the source ``model`` on each of ``genres``
    (shipped) and ``extra`` (the user's files), and the worst genre."""
    from grokc.runner import Runner

    unknown = sorted(set(genres) - set(EVAL_GENRES))
    if unknown:
        raise BuildOptionError(f"--genre {unknown[0]} is not a shipped evaluation genre; choose from {', '.join(EVAL_GENRES)}")
    texts = [t for t in eval_texts() if t.name in genres] + [user_text(p, "--eval-text") for p in extra]
    runner = Runner(artifact, device="cpu")
    loaded = load_model(model, progress=progress, tokenizer=tokenizer)
    check_source(runner.artifact.manifest.source.sha256, loaded.source_sha256, model)
    wins = {t.name: spread_windows(runner.encode(t.text), tokens, context, t.name) for t in texts}
    # The plan (numpy) runs before the reference (torch): once torch's thread pool has run, its idle
    # threads slow numpy's BLAS several-fold on a machine with few cores.
    art = {}
    for name, w in wins.items():
        progress(f"artifact: teacher-forced decode on the CPU plan, {name}, {len(w)} windows of {context} tokens")
        art[name] = runner.engine.score(w)
    progress("reference: the unquantized torch model")
    ref_model = reference_model(loaded.config, loaded.weights)
    result = {name: metrics([reference_logits(ref_model, x) for x in w], art[name], w) for name, w in wins.items()}
    worst = max(result, key=lambda g: result[g]["ppl_increase"])
    return {"quant": runner.artifact.manifest.quant.to_json(), "tokens": tokens, "context": context,
            "genres": result, "worst": {"genre": worst, "ppl_increase": result[worst]["ppl_increase"]}}
