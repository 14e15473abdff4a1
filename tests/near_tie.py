"""Greedy tokens that a logit tolerance cannot flip: the test helpers that compare greedy paths of two
executors (or grokc and transformers) share this margin."""

import numpy as np


def clear_prefix(steps: np.ndarray, tol: float) -> int:
    """How many leading rows of ``steps`` (logits ``[n, vocab]``, one row per greedy step) have a top-1
    lead of at least ``2 * tol`` of the row's RMS. Where the other side's logits are within ``tol`` of
    these (max over the row, relative to its RMS), none of those choices can flip."""
    top2 = np.sort(steps, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= 2 * tol * np.sqrt((steps ** 2).mean(axis=1))
    return len(steps) if clear.all() else int(np.argmin(clear))
