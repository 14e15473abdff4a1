"""The command line on the real test model: build, determinism, inspect, run, verify, eval, errors.

Every user mistake must end with exit status 1 and exactly one error line on stderr,
``grokc: error: ...``, naming the problem (after any ``[grokc] ...`` progress lines).
"""

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grokc.cli.app import app

cli = CliRunner()


def grokc(*args: str):
    return cli.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, *fragments: str):
    """Exit 1, no traceback, and one error line (progress lines ``[grokc] ...`` may precede it)."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("[grokc] ")]
    assert len(lines) == 1 and lines[0].startswith("grokc: error: "), result.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


CHEAP_CALIBRATION = ("--calib-samples", "4", "--calib-tokens", "256", "--no-sequential")


def hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory, smollm2_gguf):
    """SmolLM2 built twice by the CLI into different folders, for sm80 and sm90 (the default recipe, with a
    small calibration and quality report to keep the test short; the report is part of the manifest)."""
    root = tmp_path_factory.mktemp("cli")
    outs = []
    for name in ("a", "b"):
        with pytest.MonkeyPatch.context() as mp:   # each build runs nvcc itself: a fresh kernel cache
            mp.setenv("GROKC_KERNEL_CACHE", str(root / f"kernel-cache-{name}"))
            r = grokc("build", smollm2_gguf, "--arch", "sm80", "--arch", "sm90", "-o", root / name, "--max-seq", "1024",
                      *CHEAP_CALIBRATION, "--quality-tokens", "1024", "--quality-context", "256")
        assert r.exit_code == 0, r.output
        outs.append(root / name)
    return outs


def test_build_is_deterministic(built):
    a, b = (hashes(p) for p in built)
    assert a == b
    assert {"manifest.json", "weights.safetensors", "tokenizer.json", "sm80/plan.json", "sm80/kernels.cubin",
            "sm90/plan.json", "sm90/kernels.cubin"} <= set(a)


def test_cubins_name_their_arch(built):
    for arch, sm in (("sm80", 80), ("sm90", 90)):
        elf = (built[0] / arch / "kernels.cubin").read_bytes()
        assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 190   # EM_CUDA
        flags = int.from_bytes(elf[48:52], "little")
        assert sm in (flags & 0xFF, (flags >> 8) & 0xFF), hex(flags)


def test_inspect_shows_the_manifest(built):
    r = grokc("inspect", built[0], "--json")
    assert r.exit_code == 0
    info = json.loads(r.stdout)
    assert info["archs"] == ["sm80", "sm90"] and info["quant"]["name"] == "int4"
    assert info["quant"]["quality"]["tokens"] == 1024 and info["quant"]["calibration"]["samples"] == 4
    assert info["model"]["num_layers"] == 30 and info["shapes"]["buckets"] == [128, 512]
    assert set(info["plans"]["sm90"]["graphs"]) == {"prefill_128", "prefill_512", "decode_1", "decode_2", "decode_4"}
    text = grokc("inspect", built[0]).stdout
    assert "decode" in text and "int4" in text


def test_run_on_cpu_continues_the_prompt(built):
    r = grokc("run", built[0], "--device", "cpu", "--prompt", "The capital of France is", "-n", "4")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("The capital of France is") and "Paris" in r.stdout


def test_verify_clean_and_with_model(built, smollm2_gguf):
    r = grokc("verify", built[0], "--model", smollm2_gguf)
    assert r.exit_code == 0, r.output
    assert "ok: numerics" in r.stdout


@pytest.mark.parametrize("victim", ["weights.safetensors", "sm90/plan.json", "sm80/kernels.cubin", "tokenizer.json",
                                    "manifest.json"])
def test_verify_names_a_tampered_file(built, tmp_path, victim):
    import shutil

    art = tmp_path / "art"
    shutil.copytree(built[1], art)
    data = bytearray((art / victim).read_bytes())
    data[len(data) // 2] ^= 0x01
    (art / victim).write_bytes(bytes(data))
    assert_one_line_error(grokc("verify", art), victim)


def test_eval_reports_perplexity_and_agreement(built, smollm2_gguf):
    r = grokc("eval", built[0], "--model", smollm2_gguf, "--tokens", "128", "--context", "64",
              "--genre", "docs", "--genre", "fiction")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert sorted(out["genres"]) == ["docs", "fiction"]
    for m in out["genres"].values():
        assert m["positions"] == 2 * 63
        assert 1 < m["ppl_reference"] < m["ppl_artifact"] < 3 * m["ppl_reference"]
        assert 0.35 < m["top1_agreement"] <= 1
    worst = max(out["genres"], key=lambda g: out["genres"][g]["ppl_increase"])
    assert out["worst"] == {"genre": worst, "ppl_increase": out["genres"][worst]["ppl_increase"]}


# -- user errors ----------------------------------------------------------------------------------

def test_missing_model_file(tmp_path):
    assert_one_line_error(grokc("build", tmp_path / "nope.gguf", "-o", tmp_path / "o"), "nope.gguf")


def test_truncated_gguf(tmp_path, smollm2_gguf):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2_gguf.read_bytes()[: 1 << 20])
    assert_one_line_error(grokc("build", cut, "-o", tmp_path / "o"), "cut.gguf")


def test_unsupported_architecture(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    assert_one_line_error(grokc("build", folder, "-o", tmp_path / "o"), "gpt2")


def test_unknown_arch(tmp_path, smollm2_gguf):
    assert_one_line_error(grokc("build", smollm2_gguf, "--arch", "sm42", "-o", tmp_path / "o"), "sm42", "--arch")


@pytest.mark.parametrize("option", ["--lm-head", "--embeddings"])
def test_unknown_weight_format(tmp_path, option):
    (tmp_path / "config.json").write_text("{}")
    result = grokc("build", tmp_path / "config.json", "--synthetic-weights", option, "int2", "-o", tmp_path / "o")
    assert_one_line_error(result, f"unknown {option} 'int2'; choose one of: fp16, int8, int4")
    assert not (tmp_path / "o").exists()


def test_bucket_larger_than_max_seq(tmp_path, smollm2_gguf):
    assert_one_line_error(grokc("build", smollm2_gguf, "--buckets", "128,4096", "--max-seq", "2048", "-o", tmp_path / "o"),
                          "4096", "--max-seq")


def test_prompt_longer_than_largest_bucket(built):
    long_prompt = "word " * 600
    assert_one_line_error(grokc("run", built[0], "--device", "cpu", "--prompt", long_prompt), "bucket")


def test_not_an_artifact(tmp_path):
    assert_one_line_error(grokc("run", tmp_path, "--prompt", "hi"), "not a grokc artifact")
