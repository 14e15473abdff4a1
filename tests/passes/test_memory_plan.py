"""Memory planning: live tensors never overlap, dead ones are reused, state stays put."""

import numpy as np
from tiny_llama import tiny_config

from grokc.artifacts.plan import ARENA_ALIGN
from grokc.core.ir import DType, Graph, Module, Node, OpKind, TensorType
from grokc.passes import memory_plan


def chain_graph(sizes: list[int]) -> Graph:
    """t0 -> t1 -> ... with every node also reading t0 (so t0 lives to the end)."""
    tensors = {f"t{i}": TensorType((s,), DType.F16) for i, s in enumerate(sizes)}
    nodes = [Node(OpKind.ADD, f"n{i}", {"a": f"t{i - 1}", "b": "t0"}, (f"t{i}",)) for i in range(1, len(sizes))]
    nodes.insert(0, Node(OpKind.SILU, "n0", {"x": "in"}, ("t0",)))
    return Graph("g", tuple(nodes), (), (f"t{len(sizes) - 1}",), {**tensors, "in": TensorType((1,), DType.F16)})


def live_ranges(g: Graph) -> dict[str, tuple[int, int]]:
    first = {o: i for i, n in enumerate(g.nodes) for o in n.outputs}
    last = {}
    for i, n in enumerate(g.nodes):
        for s in n.inputs.values():
            last[s] = i
    return {t: (first[t], len(g.nodes) if t in g.outputs else last.get(t, first[t])) for t in first}


def test_no_overlap_of_live_tensors_and_reuse():
    rng = np.random.default_rng(0)
    g = chain_graph([int(s) for s in rng.integers(100, 5000, 12)])
    state = {"io.x": TensorType((10,), DType.I32)}
    m = memory_plan.run(Module(config=tiny_config(), graphs={"g": g}, params={}, state=state))
    plan = m.meta.memory
    places = plan.scratch["g"]
    ranges = live_ranges(g)
    for a in places:
        pa = places[a]
        assert pa.offset % ARENA_ALIGN == 0
        assert pa.offset >= plan.state["io.x"].offset + 256   # scratch after the state
        for b in places:
            if a >= b:
                continue
            (s1, e1), (s2, e2) = ranges[a], ranges[b]
            live_together = s1 <= e2 and s2 <= e1
            disjoint = pa.offset + g.tensors[a].nbytes <= places[b].offset or \
                places[b].offset + g.tensors[b].nbytes <= pa.offset
            assert disjoint or not live_together, f"{a} and {b} overlap while both live"
    assert plan.arena_bytes - 256 < plan.scratch_naive_bytes   # reuse happened
