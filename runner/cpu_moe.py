"""The CPU oracle of a mixture of experts' routing, gathering and combining (the ABI's ``moe_route``,
``moe_gather``, ``moe_combine``), as ``runner/cpu.py`` runs its other ops; the experts' matmuls are
``moe_linear``, beside ``linear`` in ``runner/cpu.py`` whose weight reading it shares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from grokc.core.errors import ArtifactError
from grokc.runner.cpu_params import F16, F32, I32
from grokc.runner.cpu_params import arr as _arr
from grokc.runner.cpu_params import opt as _opt
from grokc.runner.cpu_params import prologue as _prologue


def moe_route(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    """Top-k routing and the grouping of the entries by expert (the ABI's ``moe_route``)."""
    t_all, e, k, c, gate = args["T"], args["n_experts"], args["top_k"], args["n_shared"], args["shared_gate"] != 0
    if not 1 <= k <= e or c < 0:
        raise ArtifactError(f"moe_route with {e} experts, top_k {k}, {c} shared: need 1 <= top_k <= n_experts "
                            "and n_shared >= 0; rebuild the artifact")
    slots, stacked = k + c, e + c
    logits = _arr(args, "logits", F32, t_all, e + gate)         # [T, E (+1)]
    n = t_all if (n_real := _opt(args, "n_real", I32, 1)) is None else int(n_real[0])
    if not 0 <= n <= t_all:
        raise ValueError(f"moe_route: n_real={n} is outside [0, {t_all}]")
    lg = logits[:n, :e]                                        # [n, E]
    chosen = np.argsort(-lg, axis=1, kind="stable")[:, :k]     # [n, k]: largest first, ties by index
    ex = np.exp(lg - lg.max(axis=1, keepdims=True))
    w = np.take_along_axis(ex, chosen, axis=1) / ex.sum(axis=1, keepdims=True)   # [n, k]: softmax probabilities
    w = w / w.sum(axis=1, keepdims=True) if args["norm_top_k"] else w
    shared_w = F32(1) / (F32(1) + np.exp(-logits[:n, e])) if gate else np.ones(n, F32)   # [n]
    experts = np.concatenate([chosen, np.broadcast_to(e + np.arange(c), (n, c))], axis=1)  # [n, S]
    entries = np.argsort(experts.reshape(-1), kind="stable")   # [n*S]: by expert, then by token
    rows = np.empty(n * slots, np.int64)
    rows[entries] = np.arange(n * slots)
    counts = np.bincount(experts.reshape(-1), minlength=stacked)    # [E']
    used = np.flatnonzero(counts)
    outputs = {"weights": ((t_all, slots), 0, np.concatenate([w, np.repeat(shared_w[:, None], c, 1)], 1)),
               "slot_rows": ((t_all, slots), -1, rows.reshape(n, slots)),   # past n_real: -1, no row
               "row_token": ((t_all * slots,), 0, entries // slots),
               "offsets": ((stacked + 1,), 0, np.concatenate([[0], np.cumsum(counts)])),
               "active": ((stacked + 1,), 0, np.concatenate([[used.size], used]))}
    for name, (shape, pad, value) in outputs.items():   # each written whole: its rows, then the padding value
        out = _arr(args, name, F32 if name == "weights" else I32, *shape)
        out[...] = pad
        out[:len(value)] = value


def expert_rows(args: dict[str, Any], n_experts: int, rows: int) -> np.ndarray:
    """``offsets`` i32 ``[n_experts + 1]`` of a launch, checked: from 0, never decreasing, within ``rows``."""
    offsets = _arr(args, "offsets", I32, n_experts + 1).astype(np.int64)
    if offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] > rows:
        raise ArtifactError(f"moe offsets {offsets.tolist()} must start at 0, never decrease and end at most at "
                            f"{rows}; the routing buffer is corrupt")
    return offsets


def moe_gather(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    t, r, h = args["T"], args["R"], args["hidden"]
    total = int(expert_rows(args, args["n_experts"], r)[-1])
    tokens = _arr(args, "row_token", I32, r)[:total].astype(np.int64)   # [rows]
    if tokens.size and (tokens.min() < 0 or tokens.max() >= t):
        raise ArtifactError(f"moe_gather: a row names a token outside [0, {t}); the routing buffer is corrupt")
    _arr(args, "out", F16, r, h)[:total] = _prologue(args, t, h)[tokens]


def moe_combine(args: dict[str, Any], attrs: Mapping[str, str]) -> None:
    t, h, slots = args["T"], args["hidden"], args["S"]
    y, weights = _arr(args, "y", F32, -1, h), _arr(args, "weights", F32, t, slots)   # [R, H], [T, S]
    rows = _arr(args, "slot_rows", I32, t, slots).astype(np.int64)
    if rows.max(initial=-1) >= y.shape[0]:
        raise ArtifactError(f"moe_combine: a slot names row {rows.max()} past the {y.shape[0]} rows of y")
    acc = np.zeros((t, h), F32) if args["residual"] is None else _arr(args, "residual", F16, t, h).astype(F32)
    for s in range(slots):
        live = rows[:, s] >= 0
        acc[live] += weights[live, s, None] * y[rows[live, s]]
    _arr(args, "out", F16, t, h)[...] = acc
