"""bench/probes/trace_plan.py's grouping of block records into launches and its per-block dump (pure numpy; no GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import trace_plan  # bench/probes/, on the path by conftest.py


def launch(kernel: str, blocks: int) -> SimpleNamespace:
    return SimpleNamespace(kernel=kernel, grid=(blocks, 1, 1))


def records(launches, symbols, replays, rng) -> tuple[np.ndarray, list]:
    """Block records of `replays` replays, launches 10 us apart, blocks starting within 2 us; shuffled.
    Returns them and, per replay and launch, the (start, block) pairs that belong to it."""
    rows, truth, t = [], [], 0
    for _ in range(replays):
        per_launch = []
        for ln in launches:
            n = ln.grid[0]
            starts = t + np.sort(rng.integers(0, 2000, n))
            per_launch.append(sorted(zip(starts.tolist(), rng.permutation(n).tolist())))
            rows += [(s, s + 100, s + 500, (0,) * trace_plan.MARKS, symbols.index(ln.kernel), b, 0, 0)
                     for s, b in per_launch[-1]]
            t += 10_000
        truth.append(per_launch)
    out = np.array(rows, dtype=trace_plan.RECORD)
    rng.shuffle(out)
    return out, truth


def test_records_are_cut_into_launches_by_start_and_grid():
    # the same kernel at several places of the graph (like one GEMV per layer), with other kernels between
    launches = [launch("embed", 1), launch("gemv", 96), launch("attn", 8), launch("gemv", 96), launch("head", 7)]
    symbols = sorted({ln.kernel for ln in launches})
    rng = np.random.default_rng(0)
    recs, truth = records(launches, symbols, 3, rng)
    got = trace_plan.instances(recs, launches, symbols, 3)
    for rep in range(3):
        for i in range(len(launches)):
            assert sorted(zip(got[rep][i]["start"].tolist(), got[rep][i]["block"].tolist())) == truth[rep][i]


def test_a_missing_block_record_is_an_error():
    launches = [launch("gemv", 4), launch("attn", 2)]
    symbols = ["attn", "gemv"]
    recs, _ = records(launches, symbols, 2, np.random.default_rng(1))
    one_gemv_block_lost = np.delete(recs, np.flatnonzero(recs["kernel"] == symbols.index("gemv"))[0])
    with pytest.raises(SystemExit, match="gemv: 7 block records, expected 8"):
        trace_plan.instances(one_gemv_block_lost, launches, symbols, 2)


def test_block_times_are_microseconds_after_t0_with_unset_marks_as_nan():
    recs = np.zeros(2, trace_plan.RECORD)
    recs["start"] = [10_000, 12_000]
    recs["wait"] = [0, 15_000]           # the first block never waited
    recs["end"] = [20_000, 21_500]
    recs["marks"] = [[0, 0, 0], [16_000, 0, 18_500]]
    recs["smid"] = [7, 131]
    got = trace_plan.block_times(recs, 9_000)
    want = np.array([[1.0, 1.0, 11.0, np.nan, np.nan, np.nan, 7],
                     [3.0, 6.0, 12.5, 7.0, np.nan, 9.5, 131]])
    np.testing.assert_array_equal(got, want)
