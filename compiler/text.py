"""Text that ships with Python, for calibration and held-out evaluation.

The standard library's ``pydoc_data.topics`` (English technical prose), split by topic: sorted by
name, the topics at even positions are the evaluation split, those at odd positions the
calibration split, less every paragraph that an evaluation topic also holds. Evaluation never
reads calibration text, and every machine reads the same tokens with no download.
"""

from __future__ import annotations

from grokc.core.errors import ArtifactError

SPLITS = ("eval", "calibration")


def pydoc_topics(split: str) -> list[str]:
    """Names of the pydoc topics of ``split``: sorted, even positions for "eval", odd for "calibration"."""
    import pydoc_data.topics as topics

    if split not in SPLITS:
        raise ValueError(f"unknown text split {split!r}; choose one of {SPLITS}")
    keys = sorted(topics.topics)
    return keys[0::2] if split == "eval" else keys[1::2]


def pydoc_text(split: str = "eval") -> str:
    """The text of ``split``: the evaluation topics whole (~250K characters); the calibration topics
    without any paragraph that also occurs in an evaluation topic (~135K; the topics quote each
    other, e.g. "compound" holds "while")."""
    import pydoc_data.topics as topics

    def paragraphs(s: str) -> list[str]:
        return [p for k in pydoc_topics(s) for p in topics.topics[k].split("\n\n")]

    if split == "eval":
        return "\n\n".join(topics.topics[k] for k in pydoc_topics("eval"))
    held_out = {p.strip() for p in paragraphs("eval")}
    return "\n\n".join(p for p in paragraphs(split) if p.strip() not in held_out)


def windows(token_ids: list[int], n_tokens: int, context: int) -> list[list[int]]:
    """``n_tokens`` tokens cut into consecutive windows of ``context`` tokens."""
    if len(token_ids) < n_tokens:
        raise ArtifactError(f"the evaluation text has only {len(token_ids)} tokens; ask for --tokens {len(token_ids)} or fewer")
    return [token_ids[i:i + context] for i in range(0, n_tokens - context + 1, context)]
