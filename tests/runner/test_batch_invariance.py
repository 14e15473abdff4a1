"""Batch invariance of the CPU plan: a request's logits are bitwise the same whatever else is batched,
whichever slot it has, whichever decode graph runs, and whichever bucket its prompt was padded to."""

from __future__ import annotations

import numpy as np
import pytest

from grokc.runner import Runner, SamplingParams
from grokc.runner.cpu import matmul_rows

REQUEST = [5, 6, 7, 8, 9]
PARAMS = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=11)
FILLERS = [([40, 41, 42], SamplingParams(14, 0.7, 0, 1.0, 1)), ([90] * 9, SamplingParams(13, 0.0)),
           ([200, 3], SamplingParams(16, 1.3, 20, 1.0, 2))]


@pytest.mark.parametrize("n,k", [(96, 64), (192, 64), (64, 96), (3072, 576), (576, 1536)])
def test_matmul_rows_gives_a_row_the_same_bits_in_any_company(n, k):
    rng = np.random.default_rng(n + k)
    w = rng.standard_normal((n, k)).astype(np.float32)
    row = rng.standard_normal(k).astype(np.float32)
    alone = matmul_rows(row[None], w)[0]
    exact = w.astype(np.float64) @ row.astype(np.float64)
    np.testing.assert_allclose(alone, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())
    for m in (2, 3, 4, 7, 8, 9, 16, 33, 130):
        for at in sorted({0, m // 2, m - 1}):
            x = rng.standard_normal((m, k)).astype(np.float32)
            x[at] = row
            assert np.array_equal(matmul_rows(x, w)[at], alone), (m, at)


def run(runner: Runner, fillers: list, bucket: int | None = None, release_after: int | None = None):
    """(prefill logits, per-step decode logits, tokens) of REQUEST after ``fillers`` took slots first."""
    e = runner.engine
    busy = [e.add(p, params) for p, params in fillers]
    slot = e.add(REQUEST, PARAMS, bucket=bucket)
    first = e.ex.read(runner.plan.graphs[f"prefill_{bucket or e.bucket_for(len(REQUEST))}"].logits)[0]
    steps = []
    for step in range(PARAMS.max_new_tokens - 1):
        if step == release_after:
            for s in busy[:-1]:
                e.release(s)
        e.decode(1)
        steps.append((e.decode_graph(), e.ex.read(runner.plan.graphs[e.decode_graph()].logits)[slot]))
    tokens = e.tokens(slot)
    for s in e.busy_slots:
        e.release(s)
    return slot, first, steps, tokens


def test_a_request_gets_the_same_logits_alone_and_batched(tiny_serving_artifact):
    r = Runner(tiny_serving_artifact, device="cpu")
    slot, first, alone, tokens = run(r, [])
    assert slot == 0 and {g for g, _ in alone} == {"decode_1"}
    cases = {"slot 3 of decode_4": run(r, FILLERS), "slot 1 of decode_2": run(r, FILLERS[1:2]),
             "others leave midway": run(r, FILLERS, release_after=4),
             "other companions": run(r, [(p[::-1], SamplingParams(20, 0.5, 0, 1.0, 9)) for p, _ in FILLERS]),
             "bucket 64": run(r, [], bucket=64)}
    assert cases["slot 3 of decode_4"][0] == 3 and cases["slot 1 of decode_2"][0] == 1
    assert {g for g, _ in cases["slot 3 of decode_4"][2]} == {"decode_4"}
    for name, (_, first2, steps, tokens2) in cases.items():
        assert np.array_equal(first2, first), name
        assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(alone, steps)), name
        assert tokens2 == tokens, name
