"""The CPU oracle's mixture-of-experts ops (``runner/cpu.py``) against the ABI's words
(``abi/ops.py``), written out again here with plain Python loops:

- ``moe_route``: top-k by logit (ties: lower index), softmax weights over the routed logits
  (renormalised or not), shared slots with a sigmoid gate, padding rows, and the grouping (rows by
  expert, then by token; ``slot_rows``, ``row_token``, ``offsets``, ``active``);
- ``moe_gather`` (the normed rows of each entry's token), ``moe_linear`` (each row times its
  expert's matrix, rows past the last untouched), ``moe_combine`` (the weighted sum plus residual);
- corrupt routing buffers are an ``ArtifactError``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from grokc.abi import int4
from grokc.core.errors import ArtifactError
from grokc.runner.cpu import OPS

F16, F32, I32 = np.float16, np.float32, np.int32


def _route(logits, n_real, e, k, c, norm, gate):
    t, s = logits.shape[0], k + c
    args = {"weights": np.full((t, s), np.nan, F32), "slot_rows": np.full((t, s), 7, I32),
            "row_token": np.full(t * s, 7, I32), "offsets": np.full(e + c + 1, 7, I32),
            "active": np.full(e + c + 1, 7, I32), "logits": logits.astype(F32),
            "n_real": None if n_real is None else np.array([n_real], I32), "T": t, "n_experts": e, "top_k": k,
            "n_shared": c, "norm_top_k": int(norm), "shared_gate": int(gate)}
    OPS["moe_route"](args, {})
    return args


def _expected_route(logits, n, e, k, c, norm, gate):
    """The ABI's moe_route, entry by entry."""
    t, s = logits.shape[0], k + c
    experts, weights = np.full((t, s), -1), np.zeros((t, s))
    for i in range(n):
        row = [float(v) for v in logits[i, :e]]
        order = sorted(range(e), key=lambda j: (-row[j], j))[:k]
        top = max(row)
        denom = sum(math.exp(v - top) for v in row)
        p = [math.exp(row[j] - top) / denom for j in order]
        if norm:
            p = [v / sum(p) for v in p]
        g = 1 / (1 + math.exp(-float(logits[i, e]))) if gate else 1.0
        experts[i] = order + [e + j for j in range(c)]
        weights[i] = p + [g] * c
    entries = sorted((experts[i, j], i, j) for i in range(n) for j in range(s))
    slot_rows, row_token = np.full((t, s), -1), np.zeros(t * s, int)
    for r, (_, i, j) in enumerate(entries):
        slot_rows[i, j], row_token[r] = r, i
    counts = [sum(1 for x, _, _ in entries if x == q) for q in range(e + c)]
    used = [q for q in range(e + c) if counts[q]]
    return weights, slot_rows, row_token, np.concatenate([[0], np.cumsum(counts)]), [len(used)] + used


@pytest.mark.parametrize("e,k,c,norm,gate,n_real", [(4, 2, 0, True, False, None), (6, 3, 2, False, True, 5),
                                                    (8, 1, 1, False, False, 0), (5, 5, 0, True, False, 3)])
def test_route_is_the_abi(e, k, c, norm, gate, n_real):
    rng = np.random.default_rng(e * 10 + k)
    logits = rng.standard_normal((7, e + gate)).astype(F32)
    got = _route(logits, n_real, e, k, c, norm, gate)
    n = 7 if n_real is None else n_real
    weights, slot_rows, row_token, offsets, active = _expected_route(logits, n, e, k, c, norm, gate)
    np.testing.assert_allclose(got["weights"], weights, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(got["slot_rows"], slot_rows)
    np.testing.assert_array_equal(got["row_token"][:n * (k + c)], row_token[:n * (k + c)])
    np.testing.assert_array_equal(got["offsets"], offsets)
    np.testing.assert_array_equal(got["active"][:len(active)], active)


def test_route_ties_go_to_the_lower_expert():
    logits = np.array([[1.0, 3.0, 3.0, 3.0, 0.0]], F32)
    got = _route(logits, None, 5, 2, 0, True, False)
    np.testing.assert_array_equal(got["offsets"], [0, 0, 1, 2, 2, 2])   # experts 1 and 2, not 3
    np.testing.assert_allclose(got["weights"], [[0.5, 0.5]], atol=1e-7)


def _rms(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


def _grouped(rng, t, s, e):
    """offsets / active of ``t`` tokens with ``s`` slots over ``e`` experts, some experts idle."""
    counts = np.zeros(e, int)
    for _ in range(t):
        counts[rng.choice(e, s, replace=False)] += 1
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(I32)
    used = np.flatnonzero(counts)
    return offsets, np.concatenate([[used.size], used, np.zeros(e - used.size, int)]).astype(I32)


def test_gather_normalises_each_rows_token():
    rng = np.random.default_rng(1)
    t, s, h = 5, 2, 32
    x, norm = rng.standard_normal((t, h)).astype(F16), rng.uniform(0.5, 1.5, h).astype(F16)
    offsets, _ = _grouped(rng, t, s, 3)
    row_token = rng.integers(0, t, t * s).astype(I32)
    out = np.full((t * s, h), np.nan, F16)
    OPS["moe_gather"]({"out": out, "x": x, "norm": norm, "row_token": row_token, "offsets": offsets, "T": t,
                       "R": t * s, "hidden": h, "n_experts": 3, "eps": 1e-5}, {})
    want = _rms(x, norm, 1e-5)[row_token]
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("fmt,act", [("q4", "silu_mul"), ("f16", "none")])
def test_linear_multiplies_each_row_by_its_expert(fmt, act):
    rng = np.random.default_rng(2)
    t, s, e, n, k = 6, 2, 4, 16, 32
    nw = 2 * n if act == "silu_mul" else n
    offsets, active = _grouped(rng, t - 1, s, e)          # one token's rows left unused at the end
    total = int(offsets[-1])
    x = rng.standard_normal((t * s, k)).astype(F16)
    args = {"x": x, "offsets": offsets, "active": active, "T": t, "R": t * s, "N": n, "K": k, "group_size": 0,
            "n_experts": e, "out": np.full((t * s, n), np.nan, F16), "zeros": None}
    if fmt == "q4":
        codes = rng.integers(0, 16, (e, nw, k)).astype(np.uint8)
        scales = rng.uniform(0.01, 0.02, (e, nw, 1)).astype(F16)
        args |= {"weight": np.stack([int4.pack(c) for c in codes]), "scales": scales}
        dense = (codes.astype(np.float64) - 8) * scales.astype(np.float64)
    else:
        args |= {"weight": (rng.standard_normal((e, nw, k)) * 0.1).astype(F16), "scales": None}
        dense = args["weight"].astype(np.float64)
    OPS["moe_linear"](args, {"weight_format": fmt, "act": act, "out_dtype": "f16"})
    for r in range(total):
        expert = int(np.searchsorted(offsets, r, side="right") - 1)
        y = dense[expert] @ x[r].astype(np.float64)
        if act == "silu_mul":
            y = y[:n] / (1 + np.exp(-y[:n])) * y[n:]
        np.testing.assert_allclose(args["out"][r].astype(np.float64), y, rtol=2e-3, atol=2e-3)
    assert np.isnan(args["out"][total:]).all()           # later rows are not written


def test_combine_is_the_weighted_sum_plus_residual():
    rng = np.random.default_rng(3)
    t, s, h = 4, 3, 8
    y = rng.standard_normal((t * s, h)).astype(F32)
    weights = rng.uniform(0, 1, (t, s)).astype(F32)
    slot_rows = rng.permutation(t * s).reshape(t, s).astype(I32)
    slot_rows[3] = -1                                     # a padding token
    residual = rng.standard_normal((t, h)).astype(F16)
    out = np.full((t, h), np.nan, F16)
    OPS["moe_combine"]({"out": out, "y": y, "weights": weights, "slot_rows": slot_rows, "residual": residual,
                        "T": t, "hidden": h, "S": s}, {})
    for i in range(t):
        want = residual[i].astype(np.float64) + sum(weights[i, j] * y[slot_rows[i, j]].astype(np.float64)
                                                    for j in range(s) if slot_rows[i, j] >= 0)
        np.testing.assert_allclose(out[i].astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_corrupt_offsets_are_an_artifact_error():
    args = {"out": np.zeros((4, 8), F16), "x": np.zeros((2, 8), F16), "norm": None,
            "row_token": np.zeros(4, I32), "offsets": np.array([0, 3, 2], I32), "T": 2, "R": 4, "hidden": 8,
            "n_experts": 2, "eps": 0.0}
    with pytest.raises(ArtifactError, match="offsets"):
        OPS["moe_gather"](args, {})
