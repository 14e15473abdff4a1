"""``grokc verify``: integrity of every file, and optionally numerics against the source model.

Integrity: every file's SHA-256 against the manifest (and the manifest's own checksum), then each
arch's plan through the check the executors make (``Artifact.plan``); the first mismatch is an
``ArtifactError`` naming the file.

Numerics (``--model``): the source file must be the one the artifact was built from (same
SHA-256); then one window of the pydoc text is scored by the artifact's CPU plan and by the
unquantized torch reference, and the check fails when top-1 agreement falls under the recipe's
floor: 0.9 for fp16 weights (only rounding differs), 0.35 for int4 (round-to-nearest per-channel int4 changes about half the
argmaxes of a 135M model; a broken kernel or plan agrees on almost nothing, about 0.01).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

from grokc.artifacts.store import open_artifact
from grokc.compiler.frontends import load_model
from grokc.compiler.quality import check_source, metrics, reference_logits, reference_model
from grokc.compiler.text import pydoc_text, windows
from grokc.core.errors import ArtifactError

MIN_TOP1 = {"f16": 0.9, "q4": 0.35}
CHECK_TOKENS = 64


def verify_artifact(path: Path, model: Path | None, progress: Callable[[str], None] = lambda s: None,
                    tokenizer: Path | None = None) -> Iterator[str]:
    art = open_artifact(path, verify=True)
    for arch in art.manifest.archs:
        art.plan(arch)     # the check both executors make before they run it
    yield (f"ok: {len(art.manifest.files)} files match their SHA-256, and the plans check "
           f"({', '.join(art.manifest.archs)})")
    if model is None:
        return
    from grokc.runner import Runner

    loaded = load_model(model, progress=progress, tokenizer=tokenizer)
    check_source(art.manifest.source.sha256, loaded.source_sha256, model)
    yield f"ok: built from {Path(model).name} (sha256 {loaded.source_sha256[:12]}…)"
    runner = Runner(path, device="cpu", verify=False)
    wins = windows(runner.encode(pydoc_text()), CHECK_TOKENS, CHECK_TOKENS)
    ref = [reference_logits(reference_model(loaded.config, loaded.weights), w) for w in wins]
    m = metrics(ref, runner.engine.score(wins), wins)
    floor = MIN_TOP1[art.manifest.quant.weight_format]
    summary = (f"top-1 agreement {m['top1_agreement']:.3f} (floor {floor}), perplexity {m['ppl_artifact']:.2f} vs "
               f"{m['ppl_reference']:.2f} unquantized, KL {m['kl_mean']:.4f} over {m['positions']} positions")
    if m["top1_agreement"] < floor:
        raise ArtifactError(f"numerics check failed: {summary}; rebuild the artifact or report a grokc bug")
    yield f"ok: numerics: {summary}"
