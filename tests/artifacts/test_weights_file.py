"""The weights file (artifacts/safetensors_io.py): the safetensors library reads what grokc writes,
grokc's checked reader agrees with it, and headers that break the format are refused in one line."""

import json
import struct

import numpy as np
import pytest
from safetensors import safe_open

from grokc.artifacts import safetensors_io
from grokc.core.errors import ArtifactError

TENSORS = {
    "b.scales": np.arange(6, dtype=np.float16).reshape(2, 3),
    "a.qweight": np.arange(10, dtype=np.uint8).reshape(2, 5),      # odd sizes: nothing lands aligned by luck
    "c.table": np.linspace(-1, 1, 7, dtype=np.float32),
    "d.ids": np.array([3, -1], np.int32),
}


def test_the_library_opens_the_file_and_both_readers_agree(tmp_path):
    path = tmp_path / "w.safetensors"
    safetensors_io.save(path, TENSORS)
    ours = safetensors_io.load(path)
    with safe_open(str(path), framework="numpy") as f:
        assert sorted(f.keys()) == sorted(TENSORS)
        for name, want in TENSORS.items():
            theirs = f.get_tensor(name)
            assert theirs.dtype == want.dtype and np.array_equal(theirs, want), name
            assert np.array_equal(ours[name], want) and not ours[name].flags.writeable, name


def test_same_tensors_same_bytes(tmp_path):
    safetensors_io.save(tmp_path / "a", TENSORS)
    safetensors_io.save(tmp_path / "b", dict(reversed(list(TENSORS.items()))))
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


def rewrite(tmp_path, edit) -> object:
    """The file with its header edited by ``edit(header dict)`` (data bytes unchanged)."""
    path = tmp_path / "w.safetensors"
    safetensors_io.save(path, TENSORS)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n:])
    return path


def _set(name, key, value):
    def edit(h):
        h[name][key] = value
    return edit


@pytest.mark.parametrize("edit,needle", [
    (_set("a.qweight", "data_offsets", [-10, 0]), "data_offsets"),
    (_set("a.qweight", "shape", [3, 5]), "needs 15 bytes"),
    (_set("a.qweight", "shape", [2, -5]), "shape"),
    (_set("a.qweight", "dtype", "F8_E4M3"), "dtype"),
    (_set("d.ids", "data_offsets", [24, 32]), "starts at byte"),             # overlaps c.table [0, 28)
    (lambda h: h.pop("b.scales"), "starts at byte"),                          # a hole
    (lambda h: h.update({"e": {"dtype": "U8", "shape": [10**9], "data_offsets": [0, 10**9]}}), "starts at byte"),
    (lambda h: h.update({"e": "not a dict"}), "no dtype, shape and data_offsets"),
])
def test_broken_headers_are_refused_in_one_line(tmp_path, edit, needle):
    path = rewrite(tmp_path, edit)
    with pytest.raises(ArtifactError) as err:
        safetensors_io.load(path)
    message = str(err.value)
    assert needle in message and "\n" not in message and "rebuild the artifact" in message


@pytest.mark.parametrize("raw", [b"", b"\x01\x00", struct.pack("<Q", 1 << 40) + b"{}", struct.pack("<Q", 2) + b"[]",
                                 struct.pack("<Q", 3) + b"{x}"])
def test_files_that_are_not_safetensors_are_refused(tmp_path, raw):
    path = tmp_path / "w.safetensors"
    path.write_bytes(raw)
    with pytest.raises(ArtifactError, match="not a valid safetensors file"):
        safetensors_io.load(path)


def test_a_truncated_file_is_refused(tmp_path):
    path = tmp_path / "w.safetensors"
    safetensors_io.save(path, TENSORS)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ArtifactError, match="tensors end at byte"):
        safetensors_io.load(path)
