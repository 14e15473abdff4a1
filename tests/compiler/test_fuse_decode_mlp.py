"""The batch-1 decode graph's MLPs as ``mlp_decode`` launches (``passes/fuse_decode_mlp.py``, lowering).

Models with Llama-3.2-1B's hidden size (2048; the kernel takes 256..2048) and random weights, built
once for sm90 (which has the split-K kernel) and once for sm80 (which does not):

- sm90's ``decode_1`` has one ``mlp_decode`` per layer in place of gate_up and down, the next layer's
  qkv and o and the LM head reading the f32 sums (``x32`` / ``r32`` kernels, o letting the next
  launch in at its entry); its ``init`` graph packs each layer's two weights into the tiles that
  layer's launch reads; every other graph, and every graph of sm80 or of a build for both, is
  unchanged;
- on the CPU executor both plans give bit-identical logits and tokens over 12 greedy steps after a
  prompt (the sums are f32 additions of the same values in the same order there), with an even and
  an odd layer count (two or three alternating sum buffers, cleared across steps);
- the tiny test model (hidden 64) stays unfused; ``grokc bench`` counts the same bytes either way.
"""

from __future__ import annotations

import numpy as np
import pytest
from tiny_llama import tiny_config, tiny_loaded

from grokc.artifacts.store import open_artifact
from grokc.cli.bench import decode_bytes
from grokc.compiler.build import BuildOptions, build_loaded
from grokc.runner.engine import Engine, SamplingParams
from grokc.runner.session import Backend, make_executor
from grokc.targets import rules_mlp

SHAPES = dict(hidden_size=2048, intermediate_size=512, num_heads=32, num_kv_heads=8, head_dim=64, vocab_size=256)


def _build(tmp, layers: int, archs: tuple[str, ...]):
    out = tmp / f"l{layers}_{'_'.join(archs)}"
    build_loaded(tiny_loaded(tiny_config(num_layers=layers, **SHAPES), seed=3), out,
                 BuildOptions(archs=archs, quant="int4-rtn", batch=2, buckets=(16,), max_seq=256))
    return open_artifact(out)


@pytest.fixture(scope="module", params=[2, 3], ids=["even", "odd"])
def pair(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlp")
    return request.param, _build(tmp, request.param, ("sm90",)), _build(tmp, request.param, ("sm80",))


def test_decode_1_takes_one_mlp_launch_a_layer_on_sm90(pair):
    layers, sm90, sm80 = pair
    fused = sm90.plan("sm90").graphs["decode_1"].launches
    assert [l.op for l in fused].count("mlp_decode") == layers
    assert [l.op for l in fused].count("linear") == 2 * layers + 1  # qkv and o a layer, the head
    assert {l.kernel for l in fused if l.op == "mlp_decode"} == {rules_mlp.symbol(2048)}
    # the layer sums are read as f32: the qkv of layers 1.., every o but the first, the head
    x32 = [l for l in fused if l.op == "linear" and l.attrs.get("x_dtype") == "f32"]
    r32 = [l for l in fused if l.op == "linear" and l.attrs.get("residual_dtype") == "f32"]
    assert len(x32) == layers and len(r32) == layers - 1
    assert all(l.kernel.endswith(("_x32", "_r32")) for l in x32 + r32)
    accs = [l.arg("acc").buffer for l in fused if l.op == "mlp_decode"]
    clears = [l.arg("clear").buffer for l in fused if l.op == "mlp_decode"]
    assert clears == accs[1:] + accs[:1] and all(a != c for a, c in zip(accs, clears))
    # the o projections adding an f32 sum let mlp_decode in at their entry; the others keep the rule's t1
    o_kernels = [l.kernel for l in fused if l.op == "linear" and l.attrs.get("residual_dtype") == "f32"]
    assert o_kernels and not any("t1_" in k or k.endswith("t1") for k in o_kernels)
    # each layer's tiles are packed at load from that layer's stored weights, then read by its launch
    init = sm90.plan("sm90").graphs["init"].launches
    packs = {l.arg("out").buffer: l.arg("weight").weight for l in init if l.op == "pack_mlp_tiles"}
    assert len(packs) == 2 * layers
    read = [(l.arg("gate_up_tiles").buffer, l.arg("down_tiles").buffer) for l in fused if l.op == "mlp_decode"]
    assert [(packs[g], packs[d]) for g, d in read] == [(f"blk.{i}.ffn_gate_up.qweight", f"blk.{i}.ffn_down.qweight")
                                                       for i in range(layers)]
    assert "init" not in sm80.plan("sm80").graphs
    unfused = sm80.plan("sm80").graphs["decode_1"].launches
    assert "mlp_decode" not in {l.op for l in unfused}
    for name in ("prefill_16", "decode_2"):  # the same launches (kernels differ by arch: sampling's clusters)
        other = sm90.plan("sm90").graphs[name].launches
        assert [(l.op, l.attrs) for l in other] == [(l.op, l.attrs) for l in sm80.plan("sm80").graphs[name].launches]
        assert not any(l.attrs.get("x_dtype") or l.attrs.get("residual_dtype") for l in other)


def greedy(artifact, arch: str) -> tuple[list[int], np.ndarray]:
    plan = artifact.plan(arch)
    executor = make_executor(artifact, Backend("cpu", arch))
    engine = Engine(executor, plan, artifact.manifest.shapes)
    slot = engine.add([5, 17, 99, 3, 42], SamplingParams(max_new_tokens=13))
    engine.decode(12)
    return engine.tokens(slot), executor.read(plan.graphs["decode_1"].logits)


def test_fused_plan_matches_unfused_bit_for_bit_on_cpu(pair):
    _, sm90, sm80 = pair
    tokens90, logits90 = greedy(sm90, "sm90")
    tokens80, logits80 = greedy(sm80, "sm80")
    assert len(tokens90) == 13
    assert tokens90 == tokens80
    np.testing.assert_array_equal(logits90, logits80)


def test_bench_counts_the_same_bytes_fused_or_not(pair):
    _, sm90, sm80 = pair
    counts = []
    for artifact, arch in ((sm90, "sm90"), (sm80, "sm80")):
        sizes = {n: a.nbytes for n, a in artifact.weights().items()}
        counts.append(decode_bytes(artifact.plan(arch), sizes, artifact.manifest.model, 1, 100))
    assert counts[0] == counts[1]


def test_a_target_without_the_kernel_stays_unfused_beside_one_that_has_it(tmp_path):
    both = _build(tmp_path, 2, ("sm80", "sm90"))
    assert "mlp_decode" not in {l.op for l in both.plan("sm80").graphs["decode_1"].launches}
    assert "mlp_decode" in {l.op for l in both.plan("sm90").graphs["decode_1"].launches}


def test_shapes_the_kernel_does_not_take_stay_unfused(tiny_model, tmp_path):
    build_loaded(tiny_model, tmp_path / "t", BuildOptions(archs=("sm90",), batch=2, buckets=(16,), max_seq=64))
    ops = [l.op for l in open_artifact(tmp_path / "t").plan("sm90").graphs["decode_1"].launches]
    assert "mlp_decode" not in ops and ops.count("linear") > 3
