"""``--embeddings int8|int4`` end to end on the tiny Llama: the CPU plan computes the torch model fed the
dequantized table; a tied f16 head keeps the f16 table; synthetic builds; inspect; the bytes a decode step
reads; determinism.

The reference dequantizes the stored codes here, with its own unpacking (the nibble order of
``abi/int4.py``'s docstring), and feeds them to grokc's torch model in f32; logits must agree to
``TOL`` of their RMS (the plan's f16 activations), as in ``test_plan_vs_torch.py``.
"""

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_OPTS
from test_plan_vs_torch import (
    stored_weights,  # the linears, as the artifact stores them
)

from grokc.cli.bench import decode_bytes
from grokc.cli.inspect import describe, render
from grokc.compiler.build import BuildOptions, build, build_loaded
from grokc.compiler.quality import reference_logits, reference_model
from grokc.runner import Runner

TOL = 2e-2
BUILDS = {  # name: (BuildOptions fields)
    "emb-int4": dict(quant="fp16", embeddings="int4", group_size=32, symmetric=False),
    "emb-int8": dict(quant="int4-rtn", embeddings="int8"),
}


@pytest.fixture(scope="module")
def emb_artifacts(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("emb")
    for name, kw in BUILDS.items():
        build_loaded(tiny_model, root / name, BuildOptions(**kw, **TINY_OPTS))
    return root


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """Codes [V, H] from u8 [V, H/2]: little-endian 32-bit words, nibble j holds code [0,2,4,6,1,3,5,7][j]."""
    words = packed.astype(np.uint32).reshape(packed.shape[0], -1, 4)
    words = words[..., 0] | words[..., 1] << 8 | words[..., 2] << 16 | words[..., 3] << 24   # [V, H/8]
    codes = np.empty((packed.shape[0], words.shape[1], 8), np.int64)
    for j, c in enumerate([0, 2, 4, 6, 1, 3, 5, 7]):
        codes[:, :, c] = (words >> (4 * j)) & 0xF
    return codes.reshape(packed.shape[0], -1)


def stored_table(art: dict, gs: int) -> np.ndarray:
    """f32 [V, H]: the embedding table the artifact stores, dequantized by the ABI formula."""
    if "token_embd.qweight" in art:
        codes, midpoint = unpack_int4(np.asarray(art["token_embd.qweight"])), 8
    else:
        codes, midpoint = np.asarray(art["token_embd.q8weight"]).astype(np.int64), 128
    h = codes.shape[1]
    group = np.arange(h) // (gs or h)
    scales = np.asarray(art["token_embd.scales"], np.float64)[:, group]
    zero = np.asarray(art["token_embd.zeros"], np.float64)[:, group] if "token_embd.zeros" in art else midpoint
    return ((codes - zero) * scales).astype(np.float32)


def reference(runner: Runner, loaded, table: np.ndarray):
    """grokc's torch model on the weights the artifact stores, with ``table`` as the embedding."""
    art = runner.artifact.weights()
    linears = replace(loaded, weights={k: v for k, v in loaded.weights.items() if k != "token_embd.weight"})
    weights = stored_weights(runner, linears)
    weights["token_embd.weight"] = table
    weights["output.weight"] = np.asarray(art["output.weight"], np.float32)   # the tied head's own f16 copy
    return reference_model(loaded.config, weights)


def max_rel_err(runner: Runner, model) -> float:
    seqs = [list(np.random.default_rng(s).integers(3, 256, 40)) for s in range(4)]
    errs = []
    for seq, got in zip(seqs, runner.engine.score(seqs)):
        want = reference_logits(model, seq)
        errs.append(np.abs(got - want).max() / np.sqrt((want ** 2).mean()))
    return max(errs)


@pytest.mark.parametrize("name", list(BUILDS))
def test_plan_logits_match_torch_on_the_dequantized_table(emb_artifacts, tiny_model, name):
    runner = Runner(emb_artifacts / name, device="cpu")
    art = runner.artifact.weights()
    quant = runner.artifact.manifest.quant.to_json()
    assert quant["embeddings"] == {"emb-int4": "q4", "emb-int8": "q8"}[name]
    assert "token_embd.weight" not in art           # the embedding reads codes only
    table = stored_table(art, 32 if name == "emb-int4" else 0)
    source = tiny_model.weights["token_embd.weight"]
    np.testing.assert_array_equal(art["output.weight"], source.astype(np.float16))   # tied head: f16 table
    step = {"emb-int4": 15, "emb-int8": 127}[name]
    assert np.abs(table - source).max() < 2 * np.abs(source).max() / step            # codes of the source table
    assert max_rel_err(runner, reference(runner, tiny_model, table)) < TOL


def test_the_check_sees_the_quantized_table(emb_artifacts, tiny_model):
    """Fed the f16 source table instead, the reference is far from what the int4-embedding plan computes."""
    runner = Runner(emb_artifacts / "emb-int4", device="cpu")
    f16 = tiny_model.weights["token_embd.weight"].astype(np.float16).astype(np.float32)
    assert max_rel_err(runner, reference(runner, tiny_model, f16)) > 5 * TOL


def test_inspect_and_decode_bytes(emb_artifacts):
    info = describe(emb_artifacts / "emb-int4")
    assert info["quant"]["embeddings"] == "q4"
    assert "embeddings q4" in render(info)
    runner = Runner(emb_artifacts / "emb-int4", device="cpu")
    sizes = {n: a.nbytes for n, a in runner.artifact.weights().items()}
    plan, batch = runner.plan, TINY_OPTS["batch"]
    mc = runner.artifact.manifest.model
    others = sum(sizes[a.weight] // (l.arg("table_len").value if a.param == "rope_table" else 1)
                 for l in plan.graphs[f"decode_{batch}"].launches if l.op != "embedding"
                 for a in l.args if a.weight is not None)
    kv = mc.num_layers * 2 * batch * 100 * mc.kv_dim * 2
    row = 64 // 2 + 2 * (64 // 32) * 2          # int4 codes, f16 scales and zeros of 2 groups
    assert decode_bytes(plan, sizes, mc, batch, 100) == others + batch * row + kv


def hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_build_is_deterministic(emb_artifacts, tiny_model, tmp_path):
    build_loaded(tiny_model, tmp_path / "again", BuildOptions(**BUILDS["emb-int4"], **TINY_OPTS))
    assert hashes(tmp_path / "again") == hashes(emb_artifacts / "emb-int4")


@pytest.mark.parametrize("embeddings,codes", [("int4", "token_embd.qweight"), ("int8", "token_embd.q8weight")])
def test_synthetic_build_with_quantized_embeddings_runs(tmp_path, embeddings, codes):
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 256,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    manifest = build(tmp_path / "config.json", tmp_path / "art",
                     BuildOptions(quant="int4-rtn", embeddings=embeddings, synthetic_seed=3, **TINY_OPTS))
    tensors = manifest.weights.synthetic.to_json()["tensors"]
    assert tensors[codes]["fill"] == "bytes" and tensors["token_embd.scales"]["fill"] == "positive"
    runner = Runner(tmp_path / "art", device="cpu")
    seq = [int(t) for t in np.random.default_rng(1).integers(0, 300, 12)]
    logits = runner.engine.score([seq])[0]
    assert np.all(np.isfinite(logits)) and logits.std() > 0   # all-zero embedding rows would give flat logits
