"""The pure parts of the server: text deltas with stop strings (serve/detok.py) and the limits with
their config file (serve/limits.py)."""

from __future__ import annotations

import pytest

from grokc.core.meta import Shapes
from grokc.serve.detok import TextStream
from grokc.serve.limits import Limits, ServeConfigError, load_limits

PIECES = ["He", "llo", " wo", "rld", " ST", "OP", " more", "\ufffd"]
SHAPES = Shapes(batch=4, buckets=(16, 64), max_seq=128, decode_batches=(1, 2, 4), kv_block_size=16, kv_blocks=10,
                max_blocks_per_seq=8)


def deltas(stop: tuple[str, ...], pieces=PIECES) -> tuple[list[str], bool]:
    ts, out = TextStream(lambda ids: "".join(pieces[i] for i in ids), stop), []
    for n in range(1, len(pieces) + 1):
        out.append(ts.feed(list(range(n)), final=n == len(pieces)))
        if ts.stopped:
            break
    assert "".join(out) == ts.out
    return out, ts.stopped


def test_text_is_held_back_while_it_may_begin_a_stop_string():
    out, stopped = deltas(("STOP", "rld!"))
    assert out == ["He", "llo", " wo", "", "rld ", ""] and stopped      # "rld" might have become "rld!"


def test_without_stop_strings_everything_but_a_split_character_goes_at_once():
    out, stopped = deltas(())
    assert out == PIECES[:-1] + ["\ufffd"] and not stopped              # U+FFFD goes only with the last


def test_a_stop_string_split_over_many_tokens_and_the_earliest_of_two():
    out, stopped = deltas(("o wor", "ld ST"), ["Hell", "o", " w", "or", "ld"])
    assert "".join(out) == "Hell" and stopped


def test_limits_fill_from_the_artifact_and_refuse_what_it_cannot_serve():
    limits = Limits().resolve(SHAPES)
    assert (limits.max_prompt_tokens, limits.max_new_tokens) == (64, 127)
    with pytest.raises(ServeConfigError, match="largest bucket"):
        Limits(max_prompt_tokens=65).resolve(SHAPES)
    with pytest.raises(ServeConfigError, match="context of 128"):
        Limits(max_new_tokens=128).resolve(SHAPES)
    with pytest.raises(ServeConfigError, match="must be positive"):
        Limits(max_queue=0).resolve(SHAPES)
    with pytest.raises(ServeConfigError, match="whole number"):
        Limits(max_queue=2.5).resolve(SHAPES)


def test_config_files_toml_and_json_flags_win(tmp_path):
    toml = tmp_path / "limits.toml"
    toml.write_text("[limits]\nmax_queue = 3\nrequest_timeout_s = 5.5\n")
    assert load_limits(toml, {"max_queue": 7, "max_body_bytes": None}) == Limits(max_queue=7, request_timeout_s=5.5)
    js = tmp_path / "limits.json"
    js.write_text('{"limits": {"max_stop": 2}}')
    assert load_limits(js, {}).max_stop == 2
    for text, fragment in (("[limits]\nmax_qeue = 3\n", "unknown limits ['max_qeue']"),
                           ("[server]\nport = 1\n", "one table, limits"), ("max_queue = ", "not valid TOML")):
        toml.write_text(text)
        with pytest.raises(ServeConfigError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
            load_limits(toml, {})
    with pytest.raises(ServeConfigError, match="cannot read"):
        load_limits(tmp_path / "missing.toml", {})
