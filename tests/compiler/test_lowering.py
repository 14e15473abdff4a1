"""Lowering decisions visible in the plan: decode graphs per batch size, programmatic launches."""

import json

from grokc.artifacts.plan import Plan
from grokc.compiler.build import BuildOptions, build_loaded
from grokc.runner import Runner, SamplingParams


def test_decode_graph_per_batch_size_and_engine_picks_the_smallest(tiny_artifacts):
    r = Runner(tiny_artifacts["fp16"], device="cpu")
    graphs = r.plan.graphs
    assert {n for n in graphs if n.startswith("decode_")} == {"decode_1", "decode_2", "decode_3"}
    for b in (1, 2, 3):
        g = graphs[f"decode_{b}"]
        assert g.tokens == b
        linear = next(l for l in g.launches if l.op == "linear")
        assert linear.arg("M").value == b
    first = r.engine.add([5, 6, 7], SamplingParams(max_new_tokens=4))
    assert r.engine.decode_graph() == "decode_1"
    second = r.engine.add([5, 6], SamplingParams(max_new_tokens=4))
    assert r.engine.decode_graph() == "decode_2"
    third = r.engine.add([9], SamplingParams(max_new_tokens=4))
    r.engine.release(second)
    assert r.engine.decode_graph() == "decode_3"   # slot 2 is still busy
    r.engine.release(third)
    assert r.engine.decode_graph() == "decode_1"
    r.engine.release(first)


def test_programmatic_launches_only_into_sm90_gemvs(tiny_model, tmp_path):
    build_loaded(tiny_model, tmp_path / "a", BuildOptions(archs=("sm80", "sm90"), batch=2, buckets=(16,), max_seq=64))
    for arch in ("sm80", "sm90"):
        plan = Plan.from_json(json.loads((tmp_path / "a" / arch / "plan.json").read_text()))
        for g in plan.graphs.values():
            for launch in g.launches:
                gemv = launch.rule == "linear.gemv2"
                assert launch.pdl is (gemv and arch == "sm90"), (arch, g.name, launch.node, launch.rule)
        decode = plan.graphs["decode_1"].launches
        assert any(l.rule == "linear.gemv2" for l in decode)
