"""What a new user (or a careless script) does wrong with `grokc build`, run through the CLI on a tiny
Hugging Face Llama folder: each case must end in exit status 1 (2 for a usage error) and one line
`grokc: error: ...` naming the problem, and every file that was there before must still be there,
byte for byte."""

import hashlib
import json
import os
from pathlib import Path

import pytest
from frontends.frontends_tiny import tiny_hf_config, write_tiny_hf
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

from grokc.cli.app import app

cli = CliRunner()
FAST = ("--arch", "sm90", "--quant", "fp16", "--quality-tokens", "0", "--max-seq", "64", "--buckets", "16",
        "--batch", "1")


def grokc(*args) -> "object":
    return cli.invoke(app, [str(a) for a in args])


def one_line_error(result, *fragments: str, code: int = 1) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("[grokc] ")]
    assert len(lines) == 1 and lines[0].startswith("grokc: error: "), result.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (links not followed) and its SHA-256."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture
def model(tmp_path) -> Path:
    return write_tiny_hf(tmp_path / "in" / "tiny")


# -- never deleting what grokc did not write ------------------------------------------------------

def test_an_output_folder_holding_the_users_files_is_refused_and_kept(model, tmp_path):
    mine = tmp_path / "out" / "mydata"
    mine.mkdir(parents=True)
    (mine / "thesis.tex").write_text("four years of work")
    (mine / "sub").mkdir()
    (mine / "sub" / "data.csv").write_text("1,2,3")
    before = snapshot(mine)
    one_line_error(grokc("build", model, "-o", mine, *FAST), str(mine), "not part of a grokc artifact")
    assert snapshot(mine) == before


@pytest.mark.parametrize("where", ["model", "parent"])
def test_the_source_models_folder_or_its_parent_is_refused(model, where):
    out = model if where == "model" else model.parent
    before = snapshot(model.parent)
    one_line_error(grokc("build", model, "-o", out, *FAST), "source model")
    assert snapshot(model.parent) == before


def test_the_working_directory_is_refused(model, tmp_path, monkeypatch):
    d = tmp_path / "d"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    monkeypatch.chdir(d)
    one_line_error(grokc("build", os.path.relpath(model, d), "-o", ".", *FAST), "working directory")
    assert snapshot(d) == {"notes.txt": hashlib.sha256(b"mine").hexdigest()}


def test_an_existing_file_a_symlink_and_a_system_path_are_refused(model, tmp_path):
    f = tmp_path / "file"
    f.write_text("keep")
    one_line_error(grokc("build", model, "-o", f, *FAST), "existing file")
    assert f.read_text() == "keep"
    target = tmp_path / "real"
    target.mkdir()
    (target / "x").write_text("keep")
    (tmp_path / "link").symlink_to(target)
    one_line_error(grokc("build", model, "-o", tmp_path / "link", *FAST), "symbolic link")
    assert snapshot(target) == {"x": hashlib.sha256(b"keep").hexdigest()}
    one_line_error(grokc("build", model, "-o", "/proc/grokc-out", *FAST), "/proc")


def test_a_rebuild_over_an_artifact_replaces_it_with_identical_bytes(model, tmp_path):
    out = tmp_path / "art"
    assert grokc("build", model, "-o", out, *FAST).exit_code == 0
    first = snapshot(out)
    assert grokc("build", model, "-o", out, *FAST).exit_code == 0
    assert snapshot(out) == first
    (out / "extra.txt").write_text("the user's note inside the artifact")
    one_line_error(grokc("build", model, "-o", out, *FAST), "extra.txt")
    assert (out / "extra.txt").read_text() == "the user's note inside the artifact"
    assert grokc("verify", out).exit_code == 1   # the note is not part of the artifact either


# -- the model's files ---------------------------------------------------------------------------

@pytest.mark.parametrize("edit,fragments", [
    ({"hidden_size": None}, ("'hidden_size'",)),
    ({"num_attention_heads": 0}, ("num_attention_heads", "at least 1")),
    ({"num_hidden_layers": "2"}, ("num_hidden_layers", "'2'", "integer")),
    ({"rms_norm_eps": "1e-5"}, ("rms_norm_eps",)),
    ({"vocab_size": 2.5}, ("vocab_size",)),
    ({"hidden_size": 62, "head_dim": None}, ("hidden_size 62", "num_attention_heads 4")),
    ({"rope_theta": -1.0}, ("theta",)),
    ({"eos_token_id": 10**6}, ("10000", "vocabulary")),
])
def test_a_bad_config_json_is_one_line(model, tmp_path, edit, fragments):
    (model / "config.json").write_text(json.dumps(tiny_hf_config(**edit)))   # None: the key left out
    one_line_error(grokc("build", model, "-o", tmp_path / "art", *FAST), "config.json", *fragments)
    assert not (tmp_path / "art").exists()


def test_an_invalid_tokenizer_is_refused_at_build(model, tmp_path):
    (model / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 7}}')
    one_line_error(grokc("build", model, "-o", tmp_path / "art", *FAST), "tokenizer")
    assert not (tmp_path / "art").exists()


def test_non_finite_weights_are_refused_naming_the_tensor(model, tmp_path):
    weights = load_file(str(model / "model.safetensors"))
    name = "model.layers.1.mlp.up_proj.weight"
    weights[name][3, 5] = float("nan")
    save_file(weights, str(model / "model.safetensors"))
    one_line_error(grokc("build", model, "-o", tmp_path / "art", *FAST), "blk.1.ffn_up.weight", "NaN")   # its grokc name


# -- options ------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,fragments", [
    (("--batch", "100000"), ("--batch 100000", "65535")),
    (("--batch", "64", "--max-seq", "256", "--max-memory", "2MiB"), ("KV cache", "--max-memory", "2.0 MiB")),
    (("--max-memory", "10kB"), ("--max-memory", "budget")),
    (("--max-memory", "lots"), ("--max-memory 'lots'",)),
    (("--group-size", "64"), ("--group-size 64", "fp16")),
    (("--calib-samples", "8"), ("--calib-samples", "not calibrated")),
    (("--seed", "3"), ("--seed", "--synthetic-weights")),
])
def test_options_that_cannot_apply_or_do_not_fit_are_refused(model, tmp_path, args, fragments):
    one_line_error(grokc("build", model, "-o", tmp_path / "art", *FAST, *args), *fragments)
    assert not (tmp_path / "art").exists()


@pytest.mark.parametrize("args,fragment", [
    (("build", "x", "--batch", "abc"), "--batch"),
    (("build", "x", "--no-such-option"), "--no-such-option"),
    (("build",), "'model'"),
    (("no-such-command",), "no-such-command"),
])
def test_usage_errors_are_one_line_with_exit_status_2(args, fragment):
    one_line_error(grokc(*args), fragment, code=2)


def test_grokc_alone_still_prints_the_help():
    result = grokc()
    assert "Usage" in result.output and "build" in result.output and "grokc: error" not in result.output
