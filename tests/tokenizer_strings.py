"""The strings every family's tokenizer is compared on: 300 of them, deterministic, mixing prose,
code, digits, unicode (accents, CJK, Greek, Cyrillic, emoji), runs of spaces, tabs and newlines,
chat markup and each family's special tokens, plus the edge cases (empty, a space, spaces only)."""

from __future__ import annotations

import numpy as np

FRAGMENTS = [
    "The", "the", " quick", " brown fox", "jumps", " over", "lazy", "dog.", "Paris", " is", " the capital",
    "of France", "Once upon a time", "café", " naïve", "Zürich", "東京", "日本語", "Ελληνικά", "русский", "한국어",
    "🤖", "🚀🚀", "∑∫√", "ﬁ", "e\u0301", "def fibonacci(n):", "\n    return n", " if n < 2 else", "x ** 2",
    "# comment", "{\"key\": [1, 2]}", "for i in range(10):", "print('hi')", "12345", "3.14159", "-17", "1e-5",
    "2024", "don't", "it's", "we're", "I'll", "THEY'VE", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", " ", "  ",
    "   ", "    ", "        ", "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>",
    "user", "assistant", "!?", "...", "(brackets)", "[x]", "@#$%^&*", "~`|\\",
]
EDGES = ["", " ", "  ", "\n", "a", " a", "a ", "  two leading", "trailing two  ", "\t\ttabs", "a" * 200,
         " " * 17, "\n" * 9, "東京" * 20, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]


def strings(n: int = 300, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    out = list(EDGES)
    while len(out) < n:
        k = int(rng.integers(1, 9))
        picks = rng.choice(len(FRAGMENTS), k)
        joins = rng.choice(["", " ", "  ", "\n", "\t"], k)
        out.append("".join(FRAGMENTS[i] + j for i, j in zip(picks, joins)))
    return out
