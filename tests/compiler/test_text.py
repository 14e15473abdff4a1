"""The text grokc ships (compiler/text.py, compiler/texts/): calibration and evaluation share no
paragraph, the user's files are read as given, windows are dealt and spread as documented."""

import re

import numpy as np
import pytest

from grokc.compiler import text
from grokc.compiler.calibrate import CalibrationOptions, dealt, mix_windows
from grokc.core.errors import BuildOptionError


def blocks(s: str) -> set[str]:
    """Paragraphs by this test's own reading: text between lines holding only whitespace, stripped."""
    return {p.strip() for p in re.split(r"\n\s*\n", s) if p.strip()}


def test_calibration_and_every_evaluation_text_share_no_paragraph():
    cal, ev = text.calibration_texts(), text.eval_texts()
    assert [t.name for t in cal] == list(text.CALIBRATION_GENRES) and [t.name for t in ev] == list(text.EVAL_GENRES)
    read = set().union(*(blocks(t.text) for t in cal))
    for t in ev:
        shared = blocks(t.text) & read
        assert not shared, (t.name, sorted(shared)[:3])
    # The genres are real text of some size: enough for 32 windows of 512 tokens and a 4096-token report.
    assert all(len(t.text) > 100_000 for t in cal) and all(len(t.text) > 90_000 for t in ev)


def test_shipped_calibration_files_were_made_without_the_evaluation_paragraphs():
    """scripts/make_texts.py already dropped them: the runtime filter only removes the pydoc split's
    quotations of each other (the topics quote their neighbours, e.g. "compound" holds "while")."""
    held_out = set().union(*(blocks(t.text) for t in text.eval_texts()))
    for genre in text.CALIBRATION_GENRES[1:]:
        assert not blocks(text._shipped("calibration", genre)) & held_out, genre
    assert blocks(text._shipped("calibration", "docs")) & held_out     # the pydoc topics do quote each other


def test_the_pydoc_splits_alternate_and_cover_the_topics():
    import pydoc_data.topics as topics

    ev, cal = text.pydoc_topics("eval"), text.pydoc_topics("calibration")
    assert not set(ev) & set(cal) and set(ev) | set(cal) == set(topics.topics)
    assert sorted(topics.topics)[0::2] == ev


def test_user_text_reads_a_file_or_a_folder_in_sorted_order(tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("alpha\n\nbeta\n")
    t = text.user_text(f, "--calib-text")
    assert (t.name, t.text) == (str(f), "alpha\n\nbeta\n") and len(t.sha256) == 64
    d = tmp_path / "dir"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("second")
    (d / "a.md").write_text("first")
    (d / "sub" / "c").write_text("third")
    (d / ".hidden").write_text("never read")
    assert text.user_text(d, "--calib-text").text == "first\n\nsecond\n\nthird"


@pytest.mark.parametrize("make,fragment", [
    (lambda p: p / "missing.txt", "no such file or folder"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "the folder holds no files"),
    (lambda p: (p / "bin").write_bytes(b"\xff\xfe\x00") and p / "bin", "not UTF-8 text"),
    (lambda p: (p / "blank.txt").write_text(" \n\n ") and p / "blank.txt", "the text is empty"),
])
def test_user_text_errors_name_the_option_and_the_path(tmp_path, make, fragment):
    path = make(tmp_path)
    with pytest.raises(BuildOptionError, match=f"--eval-text {re.escape(str(path))}.*{fragment}"):
        text.user_text(path, "--eval-text")


def test_windows_are_dealt_evenly_and_each_stays_in_its_source():
    assert dealt(32, 7) == [5, 5, 5, 5, 4, 4, 4] and dealt(3, 5) == [1, 1, 1, 0, 0] and sum(dealt(100, 7)) == 100
    sources = [text.Text(f"s{i}", "") for i in range(3)]
    encoded = [list(range(1000 * i, 1000 * i + 300)) for i in range(3)]
    opts = CalibrationOptions(samples=8, tokens=50, seed=1)
    wins, counts = mix_windows(encoded, sources, opts)
    assert counts == [3, 3, 2] and len(wins) == 8 and (wins, counts) == mix_windows(encoded, sources, opts)
    owner = [w[0] // 1000 for w in wins]
    assert owner == [0, 0, 0, 1, 1, 1, 2, 2]
    assert all(len(w) == 50 and w == list(range(w[0], w[0] + 50)) and w[-1] < 1000 * o + 300 for w, o in zip(wins, owner))
    with pytest.raises(BuildOptionError, match="longer than the calibration text s1 \\(20 tokens\\)"):
        mix_windows([list(range(300)), list(range(20))], sources[:2], opts)


def test_spread_windows_cover_the_text_from_start_to_end():
    ids = list(range(1000))
    wins = text.spread_windows(ids, 256, 64, "t")
    assert len(wins) == 4 and wins[0] == ids[:64] and wins[-1] == ids[-64:]
    starts = [w[0] for w in wins]
    assert np.allclose(np.diff(starts), (1000 - 64) / 3, atol=1)
    with pytest.raises(BuildOptionError, match="the evaluation text t has only 1000 tokens; ask for 960 tokens or fewer"):
        text.spread_windows(ids, 2048, 64, "t")
