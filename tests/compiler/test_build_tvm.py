"""``grokc build --kernels tvm`` (BuildOptions.kernels): the tiny model's plan puts Apache TVM's kernels
where they cover a linear and the hand-written ones elsewhere, means the same launches as the default
build (the CPU executor, which runs each op by its semantics, gives the same logits), and the
artifact is byte-identical when built again with TVM generating its kernels afresh. Skipped without
TVM (pip install 'grokc[tvm]')."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_llama import tiny_loaded

from grokc.compiler.build import BuildOptions, build_loaded
from grokc.core.errors import BuildOptionError
from grokc.runner import Runner, SamplingParams
from grokc.targets import rules_tvm

pytest.importorskip("tvm", reason="Apache TVM is not installed (pip install 'grokc[tvm]')")

OPTS = dict(archs=("sm90",), quant="int4-rtn", batch=2, buckets=(16,), max_seq=64, quality_tokens=0)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("tvm")
    loaded = tiny_loaded(seed=3)
    for name, kernels in (("auto", "auto"), ("tvm", "tvm"), ("tvm2", "tvm")):
        rules_tvm._LOADED.clear()   # the second TVM build generates its kernels again
        build_loaded(loaded, root / name, BuildOptions(kernels=kernels, **OPTS))
    return root


def launches(root, name):
    plan = json.loads((root / name / "sm90" / "plan.json").read_text())
    return {g: gp["launches"] for g, gp in plan["graphs"].items()}


def test_tvm_kernels_take_what_they_cover(builds):
    auto, tvm = launches(builds, "auto"), launches(builds, "tvm")
    assert not any(launch["rule"].startswith("linear.tvm") for ls in auto.values() for launch in ls)
    for graph, ls in tvm.items():
        for launch in (x for x in ls if x["op"] == "linear"):
            args = {a["param"]: a for a in launch["args"]}
            m = args["M"]["value"]
            covered = (launch["attrs"]["act"] == "none" and "x_dtype" not in launch["attrs"]
                       and "residual_dtype" not in launch["attrs"] and (m == 1 or m >= 16)
                       and not any(len(args[p]) > 1 for p in ("norm", "addend", "bias")))
            where = (graph, launch["node"], launch["rule"])
            if covered:
                assert launch["rule"] == ("linear.tvm_gemv" if m == 1 else "linear.tvm_gemm"), where
            else:
                assert not launch["rule"].startswith("linear.tvm"), where
    rules = {launch["rule"] for ls in tvm.values() for launch in ls}
    assert {"linear.tvm_gemv", "linear.tvm_gemm"} <= rules and "linear.gemv2" in rules   # o/down vs qkv/gate_up


def test_the_plans_mean_the_same_launches(builds):
    auto, tvm = launches(builds, "auto"), launches(builds, "tvm")
    assert auto.keys() == tvm.keys()
    for graph in auto:
        strip = [[{k: v for k, v in x.items() if k not in ("kernel", "grid", "block", "smem", "rule", "pdl")} for x in ls]
                 for ls in (auto[graph], tvm[graph])]
        assert strip[0] == strip[1], graph


def test_cpu_outputs_equal_the_default_builds(builds):
    prompt = [5, 9, 17, 33, 2, 8, 40]
    out = {}
    for name in ("auto", "tvm"):
        runner = Runner(builds / name, device="cpu")
        engine = runner.engine
        slot = engine.add(prompt, SamplingParams(max_new_tokens=5))
        graph = runner.plan.graphs[engine.decode_graph()]
        logits = []
        for _ in range(4):
            engine.decode(1)
            logits.append(runner.executor.read(graph.logits)[slot].copy())
        out[name] = (engine.tokens(slot), np.stack(logits))
        engine.release(slot)
    assert out["auto"][0] == out["tvm"][0]
    np.testing.assert_array_equal(out["auto"][1], out["tvm"][1])


def test_a_tvm_build_is_byte_identical_when_repeated(builds):
    files = sorted(p.relative_to(builds / "tvm") for p in (builds / "tvm").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(builds / "tvm2") for p in (builds / "tvm2").rglob("*") if p.is_file())
    for f in files:
        assert (builds / "tvm" / f).read_bytes() == (builds / "tvm2" / f).read_bytes(), f


def test_unknown_kernels_option_is_refused():
    with pytest.raises(BuildOptionError, match="unknown --kernels 'cutlass'; choose one of: auto, tvm"):
        BuildOptions(kernels="cutlass")
