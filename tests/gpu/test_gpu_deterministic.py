"""``--deterministic`` on the GPU, in a model with the 1B shape's hidden size and heads (3 layers,
random weights) at batch 4: a request's decode logits are the same bits run after run, alone or
batched, in any slot."""

import numpy as np
import pytest
from tiny_llama import tiny_config, tiny_loaded

from grokc.compiler.build import BuildOptions, build_loaded
from grokc.runner import Runner, SamplingParams

CFG = tiny_config(hidden_size=2048, intermediate_size=1024, num_layers=3, num_heads=32, num_kv_heads=8,
                  head_dim=64, vocab_size=512)
MINE = [5, 9, 17, 33, 2, 8, 99, 100]
OTHERS = [[7, 7, 7], [100, 3, 56, 19, 4, 4, 4, 4], [201, 12]]


@pytest.fixture(scope="module")
def det(tmp_path_factory, sm):
    out = tmp_path_factory.mktemp("det") / "a"
    build_loaded(tiny_loaded(CFG, seed=5), out, BuildOptions(archs=(f"sm{sm}",), quant="int4-rtn", batch=4,
                                                              buckets=(16,), max_seq=128, deterministic=True))
    return Runner(out, device="cuda")


def decode_logits(runner: Runner, prompts: list[list[int]], who: int, steps: int = 8) -> bytes:
    engine = runner.engine
    slots = [engine.add(p, SamplingParams(max_new_tokens=steps + 1)) for p in prompts]
    graph = runner.plan.graphs[engine.decode_graph()]
    rows = []
    for _ in range(steps):
        engine.decode(1)
        rows.append(runner.executor.read(graph.logits)[slots[who]].copy())
    for s in slots:
        engine.release(s)
    return np.stack(rows).tobytes()


def test_replays_are_bitwise_the_same(det):
    first = decode_logits(det, [MINE], 0)
    assert all(decode_logits(det, [MINE], 0) == first for _ in range(3))


def test_a_request_is_the_same_bits_alone_and_batched_in_another_slot(det):
    alone = decode_logits(det, [MINE], 0)
    assert decode_logits(det, [OTHERS[0], OTHERS[1], MINE, OTHERS[2]], 2) == alone
    assert decode_logits(det, [OTHERS[2], MINE], 1) == alone
