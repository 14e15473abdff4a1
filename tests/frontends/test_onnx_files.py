"""ONNX files: external data past 4 GiB read as ``onnx`` reads it; and those grokc must refuse with
one line: a graph with a node no pattern covers (the Erf of an exact GELU in a Llama MLP, exported by
torch at opset 18), a truncated file, a missing or truncated external-data file, an opset outside
the range grokc reads; and the command line's one error line.
"""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from graph_exports import export_torch, hf_folder
from onnx import numpy_helper
from onnx.external_data_helper import uses_external_data
from typer.testing import CliRunner

from grokc.cli.app import app
from grokc.compiler.frontends import load_model
from grokc.compiler.frontends.onnx.reader import read_model, to_opgraph
from grokc.core.errors import UnsupportedModel


@pytest.fixture(scope="module")
def gelu(tmp_path_factory):
    """A Llama whose MLP is ``down(gelu(gate(x)) * up(x))`` with the exact (Erf) GELU."""
    root = tmp_path_factory.mktemp("gelu")
    folder = hf_folder(root / "hf", seed=31, hidden_act="gelu")
    return folder, export_torch(folder, root / "gelu.onnx", cache=False, opset=18)


def test_external_data_past_4_gib(gelu, tmp_path):
    """Every external tensor moved 4.5 GiB further into a sparse copy of the data file (as in a model
    of that size): grokc's constants are the arrays ``onnx.load`` gives for the original."""
    folder, path = gelu
    shift = 9 << 29
    model = onnx.load(str(path), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data if uses_external_data(t) else ():
            if e.key == "offset":
                e.value = str(int(e.value) + shift)
    big = tmp_path / "big.onnx"
    onnx.save(model, str(big))
    data = path.with_name(path.name + ".data").read_bytes()
    with open(tmp_path / f"{path.name}.data", "wb") as f:
        f.seek(shift)
        f.write(data)
    want = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    graph = to_opgraph(read_model(big)[0], big)
    assert sum(uses_external_data(t) for t in model.graph.initializer) >= 10
    for name, w in want.items():
        np.testing.assert_array_equal(graph.constants[name], w, err_msg=name)


def test_unsupported_node_is_named(gelu):
    folder, path = gelu
    erf = [n for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == "Erf"]
    assert len(erf) == 2   # one per layer; the first is the one named
    with pytest.raises(UnsupportedModel) as err:
        load_model(path, tokenizer=folder)
    msg = str(err.value)
    assert f"node '{erf[0].name}' (Erf) matches no pattern grokc reads" in msg, msg
    assert "expected there: " in msg and "\n" not in msg


def test_truncated_file(gelu, tmp_path):
    folder, path = gelu
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(UnsupportedModel, match=r"cannot read ONNX model .*cut\.onnx.*truncated or not an ONNX model"):
        load_model(cut, tokenizer=folder)


def test_missing_external_data(gelu, tmp_path):
    folder, path = gelu
    shutil.copy(path, tmp_path / "alone.onnx")
    with pytest.raises(UnsupportedModel, match=rf"in '{path.name}.data', which is missing; keep the external-data"):
        load_model(tmp_path / "alone.onnx", tokenizer=folder)


def test_truncated_external_data(gelu, tmp_path):
    folder, path = gelu
    shutil.copy(path, tmp_path / path.name)
    data = path.with_name(path.name + ".data")
    (tmp_path / data.name).write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(UnsupportedModel, match=rf"external-data file '{data.name}' .* does not hold tensor"):
        load_model(tmp_path / path.name, tokenizer=folder)


@pytest.mark.parametrize("version", [13, 24])
def test_opset_out_of_range(gelu, version):
    folder, path = gelu
    model = onnx.load(str(path), load_external_data=False)
    next(i for i in model.opset_import if i.domain in ("", "ai.onnx")).version = version
    other = path.with_name(f"opset{version}.onnx")   # beside the original, so its external data resolves
    onnx.save(model, str(other))
    with pytest.raises(UnsupportedModel, match=rf"uses opset {version} of ai.onnx; grokc reads ai.onnx opsets 14 to 23"):
        load_model(other, tokenizer=folder)


def test_cli_prints_one_error_line(gelu, tmp_path):
    folder, path = gelu
    result = CliRunner().invoke(app, ["build", str(path), "--tokenizer", str(folder), "-o", str(tmp_path / "o")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = [x for x in result.stderr.strip().splitlines() if not x.startswith("[grokc] ")]
    assert len(lines) == 1 and lines[0].startswith("grokc: error: ") and "(Erf) matches no pattern" in lines[0], lines
    assert not (tmp_path / "o").exists()


def test_cli_help_names_the_graph_inputs():
    out = CliRunner().invoke(app, ["build", "--help"]).output
    assert ".onnx" in out and ".pt2" in out and "--tokenizer" in out


def _relocated(path, folder, location=None, **entries):
    """A copy of ``path`` in ``folder`` whose first external tensor's entries are replaced (``location``
    of every external tensor, when given): the tensor's name and the copy's path."""
    model = onnx.load(str(path), load_external_data=False)
    external = [t for t in model.graph.initializer if uses_external_data(t)]
    for t in external:
        for e in t.external_data:
            if e.key == "location" and location is not None:
                e.value = location
    first = external[0]
    for key, value in entries.items():
        kept = [e for e in first.external_data if e.key != key]
        del first.external_data[:]
        first.external_data.extend(kept)
        if value is not None:
            first.external_data.add(key=key, value=value)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "m.onnx"))
    return first.name, folder / "m.onnx"


@pytest.fixture
def outside(gelu, tmp_path):
    """A valid copy of the model's external data outside the model's folder (``tmp_path/model``): a
    loader that followed a location there would read it and succeed."""
    data = gelu[1].with_name(gelu[1].name + ".data")
    (tmp_path / "elsewhere").mkdir()
    return shutil.copy(data, tmp_path / "elsewhere" / "weights.data")


@pytest.mark.parametrize("location", ["../elsewhere/weights.data", "sub/../../elsewhere/weights.data", "ABS",
                                      "..\\elsewhere\\weights.data", ""])
def test_external_data_outside_the_folder_is_refused(gelu, tmp_path, outside, location):
    location = str(outside) if location == "ABS" else location
    (tmp_path / "model" / "sub").mkdir(parents=True)
    name, model = _relocated(gelu[1], tmp_path / "model", location)
    with pytest.raises(UnsupportedModel) as err:
        read_model(model)
    msg = str(err.value)
    assert f"keeps tensor '{name}' in '{location}', which is not a plain relative path inside the model's folder" \
        in msg and "\n" not in msg, msg


def test_external_data_through_a_link_leaving_the_folder_is_refused(gelu, tmp_path, outside):
    name, model = _relocated(gelu[1], tmp_path / "model", "weights.data")
    (tmp_path / "model" / "weights.data").symlink_to(outside)
    with pytest.raises(UnsupportedModel, match=rf"keeps tensor '{name}' in 'weights.data', which is a symbolic link "
                                               rf"to '{outside}' outside the model's folder"):
        read_model(model)
    (tmp_path / "model" / "weights.data").unlink()
    (tmp_path / "model" / "weights.data").symlink_to("../elsewhere/weights.data")
    with pytest.raises(UnsupportedModel, match="which is a symbolic link to"):
        read_model(model)


def test_external_data_linked_inside_the_folder_or_beside_the_linked_graph_reads(gelu, tmp_path):
    """The Hugging Face cache's layout: the graph and its data are links into one blobs folder."""
    data = gelu[1].with_name(gelu[1].name + ".data")
    blobs = tmp_path / "blobs"
    name, model = _relocated(gelu[1], blobs, "weights.data")
    shutil.copy(data, blobs / "weights.data")
    (tmp_path / "snapshot").mkdir()
    (tmp_path / "snapshot" / "m.onnx").symlink_to(model)
    (tmp_path / "snapshot" / "weights.data").symlink_to(blobs / "weights.data")
    want = numpy_helper.to_array(next(t for t in onnx.load(str(gelu[1])).graph.initializer if t.name == name))
    graph = to_opgraph(read_model(tmp_path / "snapshot" / "m.onnx")[0], tmp_path / "snapshot" / "m.onnx")
    np.testing.assert_array_equal(graph.constants[name], want)


@pytest.mark.parametrize("entries, says", [
    ({"offset": "-8"}, "with offset '-8', which is not a byte count"),
    ({"offset": "0x10"}, "with offset '0x10', which is not a byte count"),
    ({"length": "1e3"}, "with length '1e3', which is not a byte count"),
    ({"length": "4"}, "does not hold tensor"),
    ({"offset": str(1 << 40)}, "does not hold tensor"),
])
def test_external_data_entries_out_of_range_are_refused(gelu, tmp_path, entries, says):
    data = gelu[1].with_name(gelu[1].name + ".data")
    name, model = _relocated(gelu[1], tmp_path, **entries)
    shutil.copy(data, tmp_path / data.name)
    with pytest.raises(UnsupportedModel) as err:
        read_model(model)
    assert says in str(err.value) and f"'{name}'" in str(err.value), str(err.value)
