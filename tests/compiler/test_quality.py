"""The quality report and gate (compiler/quality.py, compiler/build.py): held-out text, stored weights,
teacher forcing through EOS, and the one-line error of ``--max-ppl-increase``."""

import json
from dataclasses import replace

import numpy as np
import pytest
from calib_tiny import byte_loaded
from frontends.frontends_tiny import write_tiny_gguf
from tokenizers import Tokenizer
from typer.testing import CliRunner

from grokc.cli.app import app
from grokc.compiler import calibrate, quality, text
from grokc.compiler.build import BuildOptions, _quality_gate, compile_loaded
from grokc.compiler.calibrate import CalibrationOptions
from grokc.compiler.pipeline import CompileOptions
from grokc.core import tensors as names
from grokc.core.errors import BuildOptionError, QualityError
from grokc.passes.static_shapes import StaticShapes
from grokc.quant.recipe import QUANT
from grokc.runner import Runner

SHAPES = StaticShapes(2, (16,), 64, 0)


def test_evaluation_and_calibration_splits_are_disjoint_and_cover_the_topics():
    import pydoc_data.topics as topics

    ev, cal = set(text.pydoc_topics("eval")), set(text.pydoc_topics("calibration"))
    assert ev and cal and not ev & cal and ev | cal == set(topics.topics)
    ev_text, cal_text = text.pydoc_text("eval"), text.pydoc_text("calibration")
    shared = [p for p in cal_text.split("\n\n") if len(p.strip()) > 80 and p.strip() in ev_text]
    assert not shared, shared[0]   # the topics quote each other: the calibration text drops those paragraphs
    assert len(cal_text) > 100_000 and len(ev_text) > 200_000


def test_report_reads_only_the_eval_split_and_calibration_only_the_other(monkeypatch):
    tiny = byte_loaded()
    seen = []
    for module in (quality, calibrate):
        real = module.pydoc_text
        monkeypatch.setattr(module, "pydoc_text", lambda split="eval", real=real: seen.append(split) or real(split))
    calib = calibrate.calibrate(tiny, QUANT["int4"], CalibrationOptions(samples=2, tokens=32, sequential=False))
    assert seen == ["calibration"]
    module = compile_loaded(tiny, CompileOptions(SHAPES, QUANT["int4"], calib))
    quality.build_report(tiny, module, tokens=128, context=64)
    assert seen == ["calibration", "eval"]


def test_stored_weights_are_what_the_module_stores():
    tiny = byte_loaded()
    fp16 = compile_loaded(tiny, CompileOptions(SHAPES, QUANT["fp16"]))
    stored = quality.stored_weights(fp16)
    want = dict(tiny.weights)
    assert set(stored) == set(want) | {names.LM_HEAD}
    for name, w in want.items():
        np.testing.assert_array_equal(stored[name], w.astype(np.float16).astype(np.float32), err_msg=name)
    np.testing.assert_array_equal(stored[names.LM_HEAD], stored["token_embd.weight"])   # tied


def test_report_is_rounded_and_shows_what_int4_costs():
    tiny = byte_loaded()
    reports = {}
    for recipe in ("fp16", "int4-rtn"):
        module = compile_loaded(tiny, CompileOptions(SHAPES, QUANT[recipe]))
        reports[recipe] = quality.build_report(tiny, module, tokens=256, context=64)
    fp16, rtn = reports["fp16"], reports["int4-rtn"]
    assert fp16["positions"] == 4 * 63 and fp16["top1_agreement"] > 0.97 and abs(fp16["ppl_increase"]) < 1e-2
    # (a random model's perplexity may move either way: its target tokens sit far in the tails)
    assert rtn["kl_mean"] > 10 * fp16["kl_mean"]
    for v in rtn.values():
        if isinstance(v, float):
            assert v == float(f"{v:.4g}")


REPORT = {"tokens": 128, "ppl_reference": 10.0, "ppl_artifact": 12.5, "ppl_increase": 0.25, "top1_agreement": 0.8,
          "kl_mean": 0.1}


def test_gate_passes_within_the_limit_and_records_the_report(monkeypatch):
    monkeypatch.setattr(quality, "build_report", lambda *a, **k: dict(REPORT))
    tiny = byte_loaded()
    module = compile_loaded(tiny, CompileOptions(SHAPES, QUANT["int4-rtn"]))
    gated = _quality_gate(tiny, module, BuildOptions(quality_tokens=128, quality_context=64, max_ppl_increase=0.25), lambda s: None)
    assert gated.meta.quant.quality == REPORT and gated.meta.quant.name == "int4-rtn"
    with pytest.raises(QualityError, match=r"perplexity rose 25\.0% \(10\.0 -> 12\.5 on 128 held-out tokens\), "
                                           r"more than --max-ppl-increase 24\.9% allows"):
        _quality_gate(tiny, module, BuildOptions(quality_tokens=128, quality_context=64, max_ppl_increase=0.249), lambda s: None)


def test_gate_needs_the_report():
    with pytest.raises(BuildOptionError, match="--max-ppl-increase needs the quality report"):
        BuildOptions(max_ppl_increase=0.1)


def test_cli_gate_fails_the_build_with_one_line(tmp_path, monkeypatch):
    """Exit 1 and one error line naming the measured and allowed values; nothing is written."""
    monkeypatch.setattr(quality, "build_report", lambda *a, **k: dict(REPORT))
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    r = CliRunner().invoke(app, ["build", str(model), "-o", str(tmp_path / "out"), "--quant", "int4-rtn",
                                 "--quality-tokens", "128", "--quality-context", "64", "--max-ppl-increase", "10%",
                                 "--max-seq", "256", "--buckets", "64"])
    assert r.exit_code == 1, r.output
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("[grokc] ")]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("grokc: error: perplexity rose 25.0% (10.0 -> 12.5") and "--max-ppl-increase 10.0%" in lines[0]
    assert not (tmp_path / "out").exists()


def test_cli_refuses_a_malformed_limit(tmp_path):
    r = CliRunner().invoke(app, ["build", str(tmp_path / "m.gguf"), "--max-ppl-increase", "ten"])
    assert r.exit_code == 1 and "--max-ppl-increase 'ten'" in r.stderr


def test_teacher_forcing_survives_a_sampled_eos(tiny_artifacts, tiny_model):
    """The tiny model (tied embeddings) mostly predicts the token it just read, so feeding it the EOS id
    mid-sequence makes the plan sample EOS there: every later row must still be scored."""
    ref = quality.reference_model(tiny_model.config, tiny_model.weights)
    eos = tiny_model.config.eos_token_ids[0]
    seq = np.random.default_rng(0).integers(3, 256, 24).tolist()
    seq[8] = eos
    want = quality.reference_logits(ref, seq)
    assert want[8].argmax() == eos
    got = Runner(tiny_artifacts["fp16"], device="cpu").engine.score([seq])[0]
    err = np.abs(got[9:] - want[9:]).max() / np.sqrt((want ** 2).mean())
    assert err < 0.05, f"rows after the sampled EOS differ by {err:.3g} of the logits' RMS"


@pytest.mark.parametrize("recipe", ["int4-rtn", "int4"])
def test_fp16_residual_lowers_weight_and_logit_error(recipe):
    """A 2% residual brings every stored linear closer to the source weights, in the output error
    ``trace(E H E^T)`` (``E`` = stored - source, ``H`` = calibration second moment; what GPTQ
    minimises) and, after round-to-nearest, plainly; and the logits of the stored weights closer to
    the unquantized model's, as the RMS of their difference over 1024 held-out tokens. (On gaussian
    weights the 2% worst entries hold a few % of the squared error, so the logits move ~5 %: the
    RMS sees that on every seed tried, while KL and top-1 over so few tokens are noisier than it.)"""
    tiny = byte_loaded()
    base = QUANT[recipe]
    calib = calibrate.calibrate(tiny, QUANT["int4"], CalibrationOptions(4, 64, 0, False))
    source = dict(tiny.weights)
    wins = text.windows(Tokenizer.from_str(tiny.tokenizer_json).encode(text.pydoc_text("eval")).ids, 1024, 64)
    reference = quality.reference_model(tiny.config, source)
    want = np.concatenate([quality.reference_logits(reference, w) for w in wins])
    errors, logit_err = {}, {}
    for budget in (0.0, 0.02):
        module = compile_loaded(tiny, CompileOptions(SHAPES, replace(base, fp16_residual=budget),
                                                     calib if base.calibrated else None))
        stored = quality.stored_weights(module)
        errors[budget] = {}
        for k, w in source.items():
            if k.startswith("blk.") and not k.endswith("norm.weight"):
                e = (stored[k] - w).astype(np.float64)
                h = calib.hessians[names.input_key(k)].astype(np.float64)
                errors[budget][k] = (np.einsum("nk,kl,nl->", e, h, e), np.linalg.norm(e))
        model = quality.reference_model(tiny.config, stored)
        got = np.concatenate([quality.reference_logits(model, w) for w in wins])
        logit_err[budget] = float(np.sqrt(((got - want) ** 2).mean() / (want ** 2).mean()))
    for name, (out_err, fro) in errors[0.02].items():
        assert out_err < errors[0.0][name][0], (recipe, name, errors[0.0][name], out_err)
        if not base.calibrated:
            assert fro < errors[0.0][name][1], (recipe, name, errors[0.0][name], fro)
    assert logit_err[0.02] < 0.99 * logit_err[0.0], logit_err


def test_cli_fp16_residual_errors_are_one_line(tmp_path):
    """A malformed, out-of-range or pointless --fp16-residual stops the build before any work."""
    model = tmp_path / "m.gguf"
    for args, fragment in ((["--fp16-residual", "half"], "--fp16-residual 'half' must be a percentage"),
                           (["--fp16-residual", "20%"], "--fp16-residual 0.2 is outside [0, 10%]"),
                           (["--fp16-residual", "-0.01"], "--fp16-residual -0.01 is outside"),
                           (["--quant", "fp16", "--fp16-residual", "1%"], "--fp16-residual corrects int4 weights")):
        r = CliRunner().invoke(app, ["build", str(model), "-o", str(tmp_path / "o"), *args])
        assert r.exit_code == 1, r.output
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("grokc: error: ") and fragment in lines[0], r.stderr


def test_cli_fp16_residual_zero_builds_the_same_bytes(tmp_path):
    """--fp16-residual 0% is the build without the option, byte for byte; 0.5% adds the residual."""
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    common = ["--quant", "int4-rtn", "--quality-tokens", "0", "--max-seq", "256", "--buckets", "64", "--batch", "2"]
    outs = {}
    for name, extra in (("plain", []), ("zero", ["--fp16-residual", "0%"]), ("half", ["--fp16-residual", "0.5%"])):
        r = CliRunner().invoke(app, ["build", str(model), "-o", str(tmp_path / name), *common, *extra])
        assert r.exit_code == 0, r.output
        outs[name] = {p.relative_to(tmp_path / name).as_posix(): p.read_bytes()
                      for p in sorted((tmp_path / name).rglob("*")) if p.is_file()}
    assert outs["plain"] == outs["zero"]
    manifest = json.loads(outs["half"]["manifest.json"])
    assert manifest["quant"]["fp16_residual"] == 0.005 and "sparse_residual" in manifest["passes"]
    assert outs["half"]["weights.safetensors"] != outs["plain"]["weights.safetensors"]
    shown = CliRunner().invoke(app, ["inspect", str(tmp_path / "half")])
    assert shown.exit_code == 0 and "fp16 residual 0.005 of the int4 weights" in shown.output, shown.output
    assert "fp16 residual" not in CliRunner().invoke(app, ["inspect", str(tmp_path / "plain")]).output
