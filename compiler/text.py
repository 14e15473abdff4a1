"""Text for calibration and held-out evaluation: the shipped genres, the pydoc split, the user's own files.

Shipped with the package (``compiler/texts/``, made by ``scripts/make_texts.py`` from public-domain
and permissively licensed texts packaged on PyPI; ``compiler/texts/ATTRIBUTION.md`` credits each):

- calibration (``CALIBRATION_GENRES``): technical docs (the calibration split of Python's own
  ``pydoc_data.topics``), Python code, expository prose (country backgrounds), drama (Shakespeare),
  report prose (a 1992 workshop's proceedings), the UDHR preamble in ~200 languages, and chat in
  27 languages other than English;
- evaluation (``EVAL_GENRES``): the evaluation split of the pydoc topics (the in-genre control),
  news (State of the Union addresses 2000-2026), fiction (Alice in Wonderland, Botchan), English
  dialogue and encyclopedic prose (the 1911 Britannica): four genres calibration never reads.

The pydoc topics, sorted by name, alternate between the splits (even positions: evaluation). Every
calibration text is read less every paragraph (a blank-line-separated block) that an evaluation
text holds, so the two share no paragraph on any Python version. ``user_text`` reads the user's
``--calib-text`` / ``--eval-text``: a file, or every file under a folder in sorted order.
"""

from __future__ import annotations

import hashlib
import lzma
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from grokc.core.errors import ArtifactError, BuildOptionError

SPLITS = ("eval", "calibration")
TEXTS = Path(__file__).resolve().parent / "texts"
CALIBRATION_GENRES = ("docs", "code", "expository", "drama", "report", "multilingual", "chat")
EVAL_GENRES = ("docs", "news", "fiction", "dialogue", "encyclopedic")


@dataclass(frozen=True)
class Text:
    """One source of text: ``name`` is how the manifest and the quality report call it."""

    name: str
    text: str
    sha256: str | None = None   # of a user's file(s); None for shipped text

    def describe(self) -> dict:
        return {"name": self.name, **({"sha256": self.sha256} if self.sha256 else {})}


def pydoc_topics(split: str) -> list[str]:
    """Names of the pydoc topics of ``split``: sorted, even positions for "eval", odd for "calibration"."""
    import pydoc_data.topics as topics

    if split not in SPLITS:
        raise ValueError(f"unknown text split {split!r}; choose one of {SPLITS}")
    keys = sorted(topics.topics)
    return keys[0::2] if split == "eval" else keys[1::2]


def pydoc_text(split: str = "eval") -> str:
    """The pydoc topics of ``split``, whole (~250K characters for "eval", ~160K for "calibration")."""
    import pydoc_data.topics as topics

    return "\n\n".join(topics.topics[k] for k in pydoc_topics(split))


_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")


def paragraphs(text: str) -> set[str]:
    """The blocks of ``text`` between blank lines, stripped, empty ones left out."""
    return {p.strip() for p in _BLANK_LINE.split(text)} - {""}


def without(text: str, held_out: set[str]) -> str:
    """``text`` less every paragraph in ``held_out``."""
    return "\n\n".join(p for p in _BLANK_LINE.split(text) if p.strip() not in held_out)


@cache
def _shipped(split: str, genre: str) -> str:
    if genre == "docs":
        return pydoc_text("eval" if split == "eval" else "calibration")
    return lzma.decompress((TEXTS / split / f"{genre}.txt.xz").read_bytes()).decode("utf-8")


def eval_texts() -> list[Text]:
    """The held-out genres of ``EVAL_GENRES``, in that order."""
    return [Text(g, _shipped("eval", g)) for g in EVAL_GENRES]


def calibration_texts() -> list[Text]:
    """The default calibration mix: ``CALIBRATION_GENRES``, each less the paragraphs of every evaluation text."""
    held_out = set().union(*(paragraphs(t.text) for t in eval_texts()))
    return [Text(g, without(_shipped("calibration", g), held_out)) for g in CALIBRATION_GENRES]


def user_text(path: Path, option: str) -> Text:
    """The text of ``path`` (a UTF-8 file, or every file under a folder, sorted by path, joined by a blank
    line), named by the path as given; ``option`` names the command-line option in errors."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.parts))
        if not files:
            raise BuildOptionError(f"{option} {path}: the folder holds no files; point it at text files")
    elif path.is_file():
        files = [path]
    else:
        raise BuildOptionError(f"{option} {path}: no such file or folder")
    parts = []
    for f in files:
        try:
            parts.append(f.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise BuildOptionError(f"{option} {f}: not UTF-8 text ({e.reason} at byte {e.start}); "
                                   "convert it or leave it out") from None
    text = "\n\n".join(parts)
    if not text.strip():
        raise BuildOptionError(f"{option} {path}: the text is empty")
    return Text(str(path), text, hashlib.sha256(text.encode("utf-8")).hexdigest())


def spread_windows(token_ids: list[int], n_tokens: int, context: int, name: str) -> list[list[int]]:
    """``n_tokens // context`` windows of ``context`` tokens at evenly spaced offsets over the whole text
    (the first at its start, the last at its end), so a report samples all of a genre."""
    if len(token_ids) < n_tokens:
        raise BuildOptionError(f"the evaluation text {name} has only {len(token_ids)} tokens; ask for "
                            f"{len(token_ids) // context * context or context} tokens or fewer, or give a longer text")
    starts = np.linspace(0, len(token_ids) - context, n_tokens // context).round().astype(int)
    return [token_ids[s:s + context] for s in starts.tolist()]


def windows(token_ids: list[int], n_tokens: int, context: int) -> list[list[int]]:
    """``n_tokens`` tokens cut into consecutive windows of ``context`` tokens."""
    if len(token_ids) < n_tokens:
        raise ArtifactError(f"the evaluation text has only {len(token_ids)} tokens; ask for --tokens {len(token_ids)} or fewer")
    return [token_ids[i:i + context] for i in range(0, n_tokens - context + 1, context)]
