"""A hostile ``.pt2`` is refused before ``torch.export.load`` could run anything in it: pickles that
would call a function (a sample input, a weight saved with ``use_pickle``), AOTInductor code, a
member outside the archive, a symbolic shape that is Python code. Each payload, were it loaded,
makes a folder (the sentinel) in the test's temp folder; the test checks that it does not exist."""

from __future__ import annotations

import json
import os
import zipfile

import pytest
import torch

from grokc.compiler.frontends.torch_export import load_pt2
from grokc.compiler.frontends.torch_export.archive import check_archive
from grokc.core.errors import UnsupportedModel


class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) * x.shape[0]


class _MakesADir:
    """Unpickled, calls ``os.mkdir(path)``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """A program with a dynamic dimension (so its JSON holds symbolic expressions)."""
    path = tmp_path_factory.mktemp("pt2") / "small.pt2"
    ep = torch.export.export(_Small(), (torch.randn(3, 4),), dynamic_shapes=({0: torch.export.Dim("b", min=2)},))
    torch.export.save(ep, str(path))
    return path


def _rewrite(src, dst, change):
    """Copy the zip ``src`` to ``dst``, each member's bytes through ``change(record, data)`` (None drops it;
    a dict of extra ``{record: bytes}`` under the key ``None`` is added)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        top = zin.namelist()[0].split("/", 1)[0]
        for name in zin.namelist():
            data = change(name.split("/", 1)[1], zin.read(name))
            if data is not None:
                zout.writestr(name, data)
        for record, data in (change(None, None) or {}).items():
            zout.writestr(record if record.startswith("/") or record.startswith("..") else f"{top}/{record}", data)
    return dst


def _pickle(tmp_path):
    import io
    buf = io.BytesIO()
    torch.save(_MakesADir(tmp_path / "sentinel"), buf)
    return buf.getvalue()


def test_the_program_as_saved_passes(program):
    check_archive(program)   # a plain torch.export.save, symbolic expressions and all
    assert b"expr_str" in zipfile.ZipFile(program).read(next(n for n in zipfile.ZipFile(program).namelist()
                                                               if n.endswith("models/model.json")))


def test_the_payload_runs_when_torch_loads_it(program, tmp_path):
    """The check below could fail: torch.export.load itself runs the payload."""
    bad = _rewrite(program, tmp_path / "bad.pt2",
                   lambda rec, data: _pickle(tmp_path) if rec == "data/sample_inputs/model.pt" else data)
    try:
        torch.export.load(str(bad))
    except Exception:  # noqa: BLE001, S110  the payload ran first, or torch refused after it ran
        pass
    assert (tmp_path / "sentinel").is_dir()


def _pickled_weight(tmp_path):
    def change(rec, data):
        if rec == "data/weights/model_weights_config.json":
            config = json.loads(data)
            next(iter(config["config"].values()))["use_pickle"] = True
            return json.dumps(config).encode()
        if rec == "data/weights/weight_0":
            return _pickle(tmp_path)
        return data
    return change


def _expr(code):
    def change(rec, data):
        if rec == "models/model.json":
            text = data.decode()
            i = text.index('"expr_str": "') + len('"expr_str": "')
            return (text[:i] + code + text[text.index('"', i):]).encode()
        return data
    return change


@pytest.mark.parametrize("case, says", [
    ("sample_inputs", "holds '.*data/sample_inputs/model.pt', a pickle that torch.load\\(weights_only=True\\) refuses"),
    ("pickled_weight", "for 'lin.weight'\\), a pickle that torch.load\\(weights_only=True\\) refuses"),
    ("aotinductor", "holds '.*data/aotinductor/model/x.so', AOTInductor code"),
    ("outside", "holds '../escape.txt', a member that is not a plain relative path"),
    ("expr_code", "whose symbolic shape expression '__import__"),
    ("expr_names", "whose symbolic shape expression 'chr\\(47\\)"),
    ("expr_power", "whose symbolic shape expression '9\\*\\*9\\*\\*9"),
    ("not_json", "holds '.*models/model.json', which is not JSON"),
])
def test_a_hostile_archive_is_refused_before_anything_runs(program, tmp_path, case, says):
    mkdir = f"__import__('os').mkdir('{tmp_path / 'sentinel'}')"
    change = {
        "sample_inputs": lambda rec, data: _pickle(tmp_path) if rec == "data/sample_inputs/model.pt" else data,
        "pickled_weight": _pickled_weight(tmp_path),
        "aotinductor": lambda rec, data: {"data/aotinductor/model/x.so": b"\x7fELF"} if rec is None else data,
        "outside": lambda rec, data: {"../escape.txt": b"x"} if rec is None else data,
        "expr_code": _expr(mkdir.replace("'", "\\u0027")),
        "expr_names": _expr("chr(47)+s0"),
        "expr_power": _expr("9**9**9**9"),
        "not_json": lambda rec, data: data[:-5] if rec == "models/model.json" else data,
    }[case]
    bad = _rewrite(program, tmp_path / "bad.pt2", change)
    with pytest.raises(UnsupportedModel, match=says) as err:
        load_pt2(bad, tokenizer=tmp_path / "no-tokenizer.json")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "sentinel").exists()
