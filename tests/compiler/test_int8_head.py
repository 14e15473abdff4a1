"""``--lm-head int8`` end to end on the tiny Llama (tied head: the 256 x 64 embedding table, ~N(0, 1)).

Two checks of the CPU plan's logits:

- against the build whose head is f16 and whose body is the same: the hidden states entering the
  head are then identical, so the logits differ by ``h @ (W8 - W)^T`` only. Round to nearest per
  row leaves each weight an error uniform in ``[-s/2, s/2]`` (``s`` the row's step), so the
  difference has an RMS of about ``|h| * rms(s) / sqrt(12)`` against logits of RMS about
  ``|h| * rms(W)``: the expected ratio is ``rms(s) / sqrt(12) / rms(W)``, computed here from the
  source table (about 6e-3). The measured ratio must lie within a factor of 2 of it (below: not
  int8 codes; above: a wrong zero, scale or row);
- against grokc's torch model on the weights the artifact stores, the head dequantized here from
  ``output.q8weight`` with numpy: within ``TOL`` of the logits' RMS, the plan's f16 activations,
  as in ``test_plan_vs_torch.py``.
"""

import json

import numpy as np
import pytest
from conftest import TINY_OPTS
from test_plan_vs_torch import TOL, stored_weights

from grokc.cli.inspect import describe, render
from grokc.compiler.build import BuildOptions, build, build_loaded
from grokc.compiler.quality import reference_logits, reference_model
from grokc.runner import Runner

BUILDS = {  # name: (BuildOptions fields, the build with the same body and an f16 head)
    "fp16": (dict(quant="fp16"), None),
    "fp16-head8": (dict(quant="fp16", lm_head="int8"), "fp16"),
    "int4a": (dict(quant="int4-rtn", symmetric=False), None),
    "int4a-head8": (dict(quant="int4-rtn", symmetric=False, lm_head="int8"), "int4a"),   # zero-points
    "fp16-e8": (dict(quant="fp16", embeddings="int8"), None),
    "fp16-e8-head8": (dict(quant="fp16", embeddings="int8", lm_head="int8"), "fp16-e8"),  # shares the table's codes
}
SHARED = {"fp16-e8-head8"}


@pytest.fixture(scope="module")
def head8_artifacts(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("head8")
    for name, (kw, _) in BUILDS.items():
        build_loaded(tiny_model, root / name, BuildOptions(**kw, **TINY_OPTS))
    return root


def sequences() -> list[list[int]]:
    return [list(np.random.default_rng(s).integers(3, 256, 40)) for s in range(4)]   # 4 > batch: two waves


def int8_head(art) -> np.ndarray:
    """f32 [V, H]: (code - zero) * scale per row, zero 128 unless output.zeros is stored."""
    codes = np.asarray(art["output.q8weight"]).astype(np.float64)
    zero = np.asarray(art["output.zeros"], np.float64) if "output.zeros" in art else 128.0
    return ((codes - zero) * np.asarray(art["output.scales"], np.float64)).astype(np.float32)


def expected_ratio(table: np.ndarray, symmetric: bool) -> float:
    """rms(step) / sqrt(12) / rms(W) of round-to-nearest per row: absmax / 127 or range / 255 steps."""
    span = np.abs(table).max(1) / 127 if symmetric else (np.maximum(table.max(1), 0) - np.minimum(table.min(1), 0)) / 255
    return float(np.sqrt((span ** 2).mean() / 12) / np.sqrt((table ** 2).mean()))


@pytest.mark.parametrize("name", [n for n, (_, base) in BUILDS.items() if base])
def test_int8_head_logits_differ_from_the_f16_heads_by_the_int8_step(head8_artifacts, tiny_model, name):
    kw, base = BUILDS[name]
    got = np.stack(Runner(head8_artifacts / name, device="cpu").engine.score(sequences()))
    f16 = np.stack(Runner(head8_artifacts / base, device="cpu").engine.score(sequences()))
    ratio = np.sqrt(((got - f16) ** 2).mean() / (f16 ** 2).mean())
    want = expected_ratio(tiny_model.weights["token_embd.weight"], kw.get("symmetric", True))
    assert want / 2 < ratio < 2 * want, f"{name}: logits moved {ratio:.3g} of their RMS, int8 steps predict {want:.3g}"
    assert (got.argmax(-1) == f16.argmax(-1)).mean() > 0.95


@pytest.mark.parametrize("name", [n for n, (_, base) in BUILDS.items() if base and n not in SHARED])
def test_int8_head_plan_matches_torch_on_the_stored_codes(head8_artifacts, tiny_model, name):
    runner = Runner(head8_artifacts / name, device="cpu")
    art = runner.artifact.weights()
    assert runner.artifact.manifest.quant.recipe["lm_head"] == "q8" and "output.weight" not in art
    assert ("output.zeros" in art) == (name == "int4a-head8")
    assert "token_embd.weight" in art                 # the embedding keeps its f16 table
    heads = [l for l in runner.plan.graphs[f"decode_{TINY_OPTS['batch']}"].launches
             if any(a.weight == "output.q8weight" for a in l.args)]
    assert len(heads) == 1 and heads[0].attrs["weight_format"] == "q8" and heads[0].kernel.startswith("linear_gemv2_q8_")
    weights = stored_weights(runner, tiny_model)
    weights["output.weight"] = int8_head(art)
    model = reference_model(tiny_model.config, weights)
    for seq, g in zip(sequences(), runner.engine.score(sequences())):
        want = reference_logits(model, seq)
        err = np.abs(g - want).max() / np.sqrt((want ** 2).mean())
        assert err < TOL, f"{name}: max error {err:.3g} of the logits' RMS"


@pytest.mark.parametrize("name", sorted(SHARED))
def test_a_symmetric_int8_head_of_an_int8_table_reads_the_tables_codes(head8_artifacts, name):
    runner = Runner(head8_artifacts / name, device="cpu")
    assert not any(w.startswith("output.") for w in runner.artifact.weights())
    heads = [l for l in runner.plan.graphs[f"decode_{TINY_OPTS['batch']}"].launches
             if l.op == "linear" and l.attrs["weight_format"] == "q8"]
    assert len(heads) == 1
    assert (heads[0].arg("weight").weight, heads[0].arg("scales").weight) == ("token_embd.q8weight", "token_embd.scales")


def test_inspect_names_the_int8_head(head8_artifacts):
    assert "LM head q8" in render(describe(head8_artifacts / "fp16-head8"))


def test_synthetic_build_with_int8_head_runs(tmp_path):
    """--synthetic-weights --lm-head int8 with the default (asymmetric) recipe: codes filled as bytes,
    zero-points at the midpoint 128, so the head's logits are finite and spread."""
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 256,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    manifest = build(tmp_path / "config.json", tmp_path / "art", BuildOptions(lm_head="int8", synthetic_seed=3, **TINY_OPTS))
    tensors = manifest.weights.synthetic.to_json()["tensors"]
    assert tensors["output.q8weight"]["fill"] == "bytes" and tensors["output.q8weight"]["shape"] == [300, 64]
    assert tensors["output.zeros"] == {**tensors["output.zeros"], "fill": "constant", "scale": 128.0}
    logits = Runner(tmp_path / "art", device="cpu").engine.score([list(range(5, 17))])[0]
    assert np.all(np.isfinite(logits)) and 0.2 < logits.std() < 5   # weights ~ 1/sqrt(K): logits of unit scale
