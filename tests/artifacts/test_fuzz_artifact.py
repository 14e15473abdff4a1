"""Fuzzing the artifact's readers (tests/fuzzing.py): manifest.json, plan.json and the safetensors
header rewritten at random by an attacker who also rewrites the hashes. Opening the artifact,
reading every plan and running a plan that passed its checks on the CPU executor may succeed or
raise grokc's error in one line; nothing else, nothing slow, and nothing outside the temp folder
opened or changed."""

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest
from fuzzing import FUZZ, mutate, only_grokc_errors
from hypothesis import given
from hypothesis import strategies as st
from tamper import file_accesses, outside, write_manifest

from grokc.artifacts import safetensors_io
from grokc.artifacts.store import open_artifact
from grokc.runner.cpu import CpuExecutor


class Fuzzed:
    """The temp folder nothing outside of may be touched, the artifact rewritten for each case, and
    its pristine files (kept out of the repr Hypothesis prints for a failing case)."""

    def __init__(self, root: Path, copy: Path, files: dict[str, bytes]):
        self.root, self.copy, self.files = root, copy, files

    def __repr__(self) -> str:
        return f"Fuzzed({str(self.copy)!r})"


@pytest.fixture(scope="module")
def art(tiny_artifact, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    copy = root / "art"
    shutil.copytree(tiny_artifact, copy)
    return Fuzzed(root, copy, {p.relative_to(copy).as_posix(): p.read_bytes() for p in copy.rglob("*") if p.is_file()})


def restore(art: Fuzzed) -> None:
    """Put back every file a case may have changed (only the manifest and the plan are rewritten)."""
    for rel in ("manifest.json", "sm90/plan.json"):
        (art.copy / rel).write_bytes(art.files[rel])


def open_and_run(path):
    a = open_artifact(path, verify=True)
    a.tokenizer_json()
    for arch in a.manifest.archs:
        plan = a.plan(arch)
        ex = CpuExecutor(plan, {**a.weights(), **a.synthetic()})
        for graph in ("init", "decode_1"):
            if graph in plan.graphs:
                ex.replay(graph)


def checked(root, call):
    with file_accesses() as seen:
        only_grokc_errors(call)
    assert outside(seen, root) == [], outside(seen, root)


@FUZZ
@given(data=st.data())
def test_fuzzed_manifests(art, data):
    restore(art)
    write_manifest(art.copy, mutate(data, json.loads(art.files["manifest.json"])))
    checked(art.root, lambda: open_and_run(art.copy))


@FUZZ
@given(data=st.data())
def test_fuzzed_plans(art, data):
    restore(art)
    raw = json.dumps(mutate(data, json.loads(art.files["sm90/plan.json"]))).encode()
    (art.copy / "sm90/plan.json").write_bytes(raw)
    body = json.loads(art.files["manifest.json"])
    body["files"]["sm90/plan.json"] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    write_manifest(art.copy, body)
    checked(art.root, lambda: open_and_run(art.copy))


@FUZZ
@given(data=st.data())
def test_fuzzed_safetensors_headers(art, data):
    """The weights file's JSON header mutated (the same data bytes after it), or its bytes flipped."""
    raw = art.files["weights.safetensors"]
    (n,) = struct.unpack("<Q", raw[:8])
    if data.draw(st.booleans(), label="json edit"):
        header = mutate(data, json.loads(raw[8:8 + n]))
        text = json.dumps(header).encode()
        new = struct.pack("<Q", len(text)) + text + raw[8 + n:]
    else:
        new = bytearray(raw)
        for _ in range(data.draw(st.integers(1, 8), label="flips")):
            new[data.draw(st.integers(0, 8 + n - 1))] = data.draw(st.integers(0, 255))
        new = bytes(new)
    path = art.root / "w.safetensors"
    path.write_bytes(new)
    checked(art.root, lambda: safetensors_io.load(path))
