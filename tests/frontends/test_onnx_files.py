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
