"""Calibration statistics (compiler/calibrate.py) on the tiny model, and how the quantize pass uses them."""

import hashlib

import numpy as np
import pytest
import torch
from calib_tiny import byte_loaded
from tokenizers import Tokenizer

from grokc.abi import int4
from grokc.compiler.build import compile_loaded
from grokc.compiler.calibrate import (
    CalibrationOptions,
    calibrate,
    calibration_windows,
    collect,
)
from grokc.compiler.pipeline import CompileOptions
from grokc.compiler.quality import reference_model
from grokc.core import tensors as names
from grokc.core.errors import BuildOptionError
from grokc.core.ir import OpKind
from grokc.passes.static_shapes import StaticShapes
from grokc.quant.calibration import Calibration
from grokc.quant.gptq import quantize_gptq
from grokc.quant.recipe import QUANT

TOKENS = list(range(1000))


def test_windows_are_seeded_sorted_and_inside_the_text():
    wins = calibration_windows(TOKENS, 5, 100, np.random.default_rng(3), "t")
    assert wins == calibration_windows(TOKENS, 5, 100, np.random.default_rng(3), "t")
    assert wins != calibration_windows(TOKENS, 5, 100, np.random.default_rng(4), "t")
    assert len(wins) == 5 and all(len(w) == 100 for w in wins)
    starts = [w[0] for w in wins]
    assert starts == sorted(starts) and all(w == list(range(w[0], w[0] + 100)) for w in wins)


@pytest.mark.parametrize("kwargs,fragment", [({"samples": 0}, "--calib-samples 0"), ({"tokens": 1}, "--calib-tokens 1")])
def test_bad_options_are_one_sentence(kwargs, fragment):
    with pytest.raises(BuildOptionError, match=fragment):
        CalibrationOptions(**kwargs)


def test_window_longer_than_the_text_is_refused():
    with pytest.raises(BuildOptionError, match="--calib-tokens 2000 is longer than the calibration text t"):
        calibration_windows(TOKENS, 1, 2000, np.random.default_rng(0), "t")


def test_calib_text_is_all_that_calibration_reads(tmp_path, monkeypatch):
    """With --calib-text, the shipped text is never opened, and the statistics are those of the given
    text: a file exactly one window long (byte tokens: one per byte) gives the second moments of that
    window alone."""
    from grokc.compiler import text
    from grokc.compiler.build import BuildOptions, build_loaded

    def no_shipped(split, genre):
        raise AssertionError(f"read the shipped {split} text {genre}")

    monkeypatch.setattr(text, "_shipped", no_shipped)
    mine = tmp_path / "mine.txt"
    mine.write_text("The quick brown fox jumps over the lazy dog; then it naps by the old wall.")
    n = len(mine.read_bytes())
    tiny = byte_loaded(seed=1)
    calib = calibrate(tiny, QUANT["int4"], CalibrationOptions(samples=3, tokens=n, sequential=False, texts=(mine,)))
    assert calib.info["text"] == [{"name": str(mine), "sha256": hashlib.sha256(mine.read_bytes()).hexdigest(),
                                   "windows": 3}]
    ids = Tokenizer.from_str(tiny.tokenizer_json).encode(mine.read_text()).ids
    assert len(ids) == n
    want = collect(reference_model(tiny.config, tiny.weights).requires_grad_(False), [ids])
    assert set(calib.hessians) == set(want)
    for key, h in want.items():
        np.testing.assert_allclose(calib.hessians[key], h, rtol=1e-5, atol=1e-7, err_msg=key)
    opts = BuildOptions(batch=1, buckets=(16,), max_seq=128, calibration=CalibrationOptions(2, n, 0, False, (mine,)))
    manifest = build_loaded(tiny, tmp_path / "a", opts)
    assert manifest.quant.calibration["text"] == [{**calib.info["text"][0], "windows": 2}]


@pytest.fixture(scope="module")
def tiny():
    return byte_loaded(seed=1)


def test_hessians_are_the_second_moments_of_each_linear_input(tiny):
    model = reference_model(tiny.config, tiny.weights).requires_grad_(False)
    rng = np.random.default_rng(0)
    wins = [rng.integers(0, 256, 24).tolist() for _ in range(3)]
    got = collect(model, wins)
    n_layers = tiny.config.num_layers
    kinds = ("attn_q", "attn_output", "ffn_gate", "ffn_down")
    assert set(got) == {names.name(names.Tensor(k), i) for i in range(n_layers) for k in kinds} | {names.LM_HEAD}
    # Block 0's q/k/v input and the LM head's input, computed here without hooks.
    with torch.no_grad():
        h = [model.token_embd(torch.tensor(w)) for w in wins]
        x0 = torch.cat([model.blk[0].attn_norm(x) for x in h]).double()
        for i in range(len(model.blk)):
            h = [model.forward_block(i, x, torch.arange(len(x), dtype=torch.int32)) for x in h]
        xh = torch.cat([model.output_norm(x) for x in h]).double()
    np.testing.assert_allclose(got[names.name(names.Tensor("attn_q"), 0)], (x0.T @ x0 / len(x0)).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[names.LM_HEAD], (xh.T @ xh / len(xh)).numpy(), rtol=1e-5, atol=1e-6)
    for key, hess in got.items():
        assert hess.dtype == np.float32 and np.allclose(hess, hess.T) and np.all(np.diag(hess) >= 0), key


def test_sequential_sees_the_quantized_blocks_before(tiny):
    wins = [np.random.default_rng(1).integers(0, 256, 32).tolist()]
    plain = collect(reference_model(tiny.config, tiny.weights).requires_grad_(False), wins)
    coarse = lambda name, w, h: np.round(w * 4) / 4   # a crude "quantizer", to see it propagate
    seq = collect(reference_model(tiny.config, tiny.weights).requires_grad_(False), wins, coarse)
    first = names.name(names.Tensor("attn_q"), 0)
    np.testing.assert_array_equal(seq[first], plain[first])   # block 0 reads the embeddings either way
    assert not np.allclose(seq[names.name(names.Tensor("attn_q"), 1)], plain[names.name(names.Tensor("attn_q"), 1)])


def test_the_pass_quantizes_fused_weights_with_the_shared_input_statistics(tiny):
    recipe = QUANT["int4"]
    calib = calibrate(tiny, recipe, CalibrationOptions(samples=2, tokens=64, sequential=False))
    assert calib.info["samples"] == 2 and not calib.info["sequential"]
    module = compile_loaded(tiny, CompileOptions(StaticShapes(2, (16,), 64, 0), recipe, calib))
    assert module.meta.quant.calibration == dict(calib.info)
    params, w = module.params, tiny.weights
    qkv = np.concatenate([w[f"blk.1.attn_{p}.weight"] for p in "qkv"])
    codes, scales, zeros = quantize_gptq(qkv, calib.hessians[names.name(names.Tensor("attn_q"), 1)], 0, False,
                                         act_order=True, clip_search=True)
    np.testing.assert_array_equal(params["blk.1.attn_qkv.scales"], scales)
    np.testing.assert_array_equal(params["blk.1.attn_qkv.zeros"], zeros)
    np.testing.assert_array_equal(int4.unpack(params["blk.1.attn_qkv.qweight"]), codes)
    linears = [n for g in module.graphs.values() for n in g.nodes if n.op is OpKind.LINEAR]
    assert {n.attrs.weight_format.value for n in linears} == {"q4", "f16"}   # the LM head stays f16


def test_a_calibrated_recipe_without_statistics_is_refused(tiny):
    with pytest.raises(BuildOptionError, match="no calibration statistics"):
        compile_loaded(tiny, CompileOptions(StaticShapes(2, (16,), 64, 0), QUANT["int4"]))
    short = Calibration({names.name(names.Tensor("attn_q"), 0): np.eye(64, dtype=np.float32)})
    with pytest.raises(BuildOptionError, match="lack"):
        compile_loaded(tiny, CompileOptions(StaticShapes(2, (16,), 64, 0), QUANT["int4"], short))


def test_int4_lm_head_is_calibrated_on_the_final_norm_output(tiny):
    from dataclasses import replace

    from grokc.compiler.quality import stored_weights
    from grokc.core.ir import WeightFormat

    recipe = replace(QUANT["int4"], lm_head=WeightFormat.Q4)
    calib = calibrate(tiny, recipe, CalibrationOptions(samples=2, tokens=64, sequential=False))
    module = compile_loaded(tiny, CompileOptions(StaticShapes(2, (16,), 64, 0), recipe, calib))
    head = [n for g in module.graphs.values() for n in g.nodes if n.op is OpKind.LINEAR and n.outputs[0] in g.outputs]
    assert head and all(n.attrs.weight_format is WeightFormat.Q4 and n.inputs["qweight"] == "output.qweight" for n in head)
    assert module.params["token_embd.weight"].dtype == np.float16   # the embedding table stays f16 (tied head)
    codes, scales, zeros = quantize_gptq(tiny.weights["token_embd.weight"], calib.hessians[names.LM_HEAD], 0,
                                         False, act_order=True, clip_search=True)
    np.testing.assert_array_equal(int4.unpack(module.params["output.qweight"]), codes)
    w = stored_weights(module)
    assert not np.array_equal(w[names.LM_HEAD], w["token_embd.weight"])


def test_kernels_compile_before_calibration_and_once(monkeypatch, tmp_path):
    """A calibrated build runs nvcc before calibrating (a toolchain failure costs seconds, not the
    calibration's minutes), and reuses that cubin: one nvcc run per arch."""
    from grokc.compiler import build as build_mod
    from grokc.core.errors import TargetError

    events: list[str] = []
    real_cubin, real_calibrate = build_mod.build_kernels, build_mod.calibrate
    monkeypatch.setattr(build_mod, "build_kernels", lambda kernels, target: events.append(f"nvcc {target.name}")
                        or real_cubin(kernels, target))
    monkeypatch.setattr(build_mod, "calibrate", lambda *a, **k: events.append("calibrate") or real_calibrate(*a, **k))
    opts = build_mod.BuildOptions(archs=("sm80", "sm90"), batch=1, buckets=(16,), max_seq=64,
                                  calibration=CalibrationOptions(samples=2, tokens=64))
    build_mod.build_loaded(byte_loaded(), tmp_path / "a", opts)
    assert events == ["nvcc sm80", "nvcc sm90", "calibrate"]

    def broken_nvcc(kernels, target):
        raise TargetError("nvcc failed")

    events.clear()
    monkeypatch.setattr(build_mod, "build_kernels", broken_nvcc)
    with pytest.raises(TargetError, match="nvcc failed"):
        build_mod.build_loaded(byte_loaded(), tmp_path / "b", opts)
    assert events == []
