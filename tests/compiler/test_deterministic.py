"""``--deterministic`` builds (BuildOptions.deterministic): one decode graph at the build's batch,
and only kernels whose sums do not depend on the order work finishes in, so a request's logits are
the same bits whatever else is batched beside it and whichever slot it takes."""

import json

import numpy as np
import pytest
from tiny_llama import tiny_config, tiny_loaded

from grokc.compiler.build import BuildOptions, build_loaded
from grokc.runner import Runner, SamplingParams

# hidden 256 / intermediate 128: the sm90 split-K MLP would take these shapes in a normal build
CFG = tiny_config(hidden_size=256, intermediate_size=128, num_heads=4, num_kv_heads=2, head_dim=64)
OPTS = dict(quant="int4-rtn", batch=4, buckets=(16,), max_seq=64)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    loaded = tiny_loaded(CFG, seed=2)
    for name, det in (("fast", False), ("det", True)):
        build_loaded(loaded, root / name, BuildOptions(archs=("sm80", "sm90"), deterministic=det, **OPTS))
    return root


def plan(root, name, arch):
    return json.loads((root / name / arch / "plan.json").read_text())


def test_one_decode_graph_and_no_order_dependent_kernels(builds):
    manifest = json.loads((builds / "det" / "manifest.json").read_text())
    assert manifest["shapes"]["decode_batches"] == [4]
    fast = json.loads((builds / "fast" / "manifest.json").read_text())
    assert fast["shapes"]["decode_batches"] == [1, 2, 4]
    for arch in ("sm80", "sm90"):
        assert manifest["archs"][arch]["deterministic"] is True and fast["archs"][arch]["deterministic"] is False
        graphs = plan(builds, "det", arch)["graphs"]
        assert sorted(g for g in graphs if g.startswith("decode")) == ["decode_4"]
        kernels = {launch["kernel"] for g in graphs.values() for launch in g["launches"]}
        # mlp_decode adds split-K sums with vector atomics; gemv meets its sums of squares by atomics
        assert not any(k.startswith(("mlp_decode", "linear_gemv_")) for k in kernels), kernels
    assert "fuse_decode_mlp" not in manifest["archs"]["sm90"]["passes"]
    assert "fuse_decode_mlp" in fast["archs"]["sm90"]["passes"]     # the same model fuses in a normal build


def decode_logits(runner: Runner, prompts: list[list[int]], steps: int) -> dict[int, list[np.ndarray]]:
    """Per request, the logits of each of ``steps`` greedy decode steps, the requests batched together."""
    engine = runner.engine
    slots = [engine.add(p, SamplingParams(max_new_tokens=steps + 1)) for p in prompts]
    out = {s: [] for s in slots}
    graph = runner.plan.graphs[engine.decode_graph()]
    for _ in range(steps):
        engine.decode(1)
        logits = runner.executor.read(graph.logits)
        for s in slots:
            out[s].append(logits[s].copy())
    for s in slots:
        engine.release(s)
    return {i: out[s] for i, s in enumerate(slots)}


def test_a_request_decodes_the_same_bits_alone_and_batched(builds):
    runner = Runner(builds / "det", device="cpu")
    mine = [5, 9, 17, 33, 2, 8]
    others = [[7, 7, 7], [100, 3, 56, 19, 4, 4, 4, 4], [201, 12]]
    alone = decode_logits(runner, [mine], 5)[0]
    batched = decode_logits(runner, [others[0], others[1], mine, others[2]], 5)[2]   # another slot, too
    for a, b in zip(alone, batched):
        assert a.tobytes() == b.tobytes()
