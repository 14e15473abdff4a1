"""embedding and take_last kernels against the numpy oracle (``runner/cpu.py``): bit-exact.

Outputs are NaN-poisoned; out-of-range tokens (-1, vocab, a large id) must give zero rows; both the
16-byte kernels (hidden % 8 == 0) and the per-element fallbacks (hidden = 100) run. Quantized tables
(q8, q4) dequantize bit-exactly too (f32 math, one rounding to f16): per row and per group, with and
without zero-points (arbitrary f16 ones included), through every q4/q8 kernel (hidden 2048 and 576:
16-byte q4 loads; 40: one word; 100: the q8 per-code fallback).
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import run_kernel, seeded

from grokc.runner.cpu import OPS
from grokc.targets import build_kernels, get_target
from grokc.targets import rules_misc as rm
from grokc.targets.archs import TARGETS
from grokc.targets.base import KernelCall

F16, I32 = np.float16, np.int32


@pytest.fixture(scope="module")
def cubin(cuda_context) -> bytes:
    major, minor = cuda_context.compute_capability
    symbols = ("embedding_v8", "embedding_v1", "embedding_q8_v8", "embedding_q8_v1", "embedding_q4_w4",
               "embedding_q4_w1", "take_last_v8", "take_last_v1")
    return build_kernels(symbols, get_target(f"sm{major}{minor}"))



def launch(cubin, op: str, args: dict, scalars: tuple[str, ...], attrs: dict | None = None) -> tuple[dict, dict]:
    call = KernelCall(op, attrs or {}, dims={k: args[k] for k in scalars})
    choice = next(c for c in (rule(call, TARGETS["sm90"]) for rule in rm.RULES[op]) if c is not None)
    want = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    OPS[op](want, attrs or {})
    got = run_kernel(cubin, choice.kernel, choice.grid, choice.block, choice.smem, op, args)
    return got, want


@pytest.mark.parametrize("hidden", [576, 2048, 4096, 100])
@pytest.mark.parametrize("n", [1, 8, 517])
def test_embedding(cubin, n, hidden):
    rng = seeded("embedding", n, hidden)
    vocab = 1000
    tokens = rng.integers(0, vocab, n).astype(I32)
    bad = rng.choice(n, min(n, 3), replace=False)  # out of range: zero rows
    tokens[bad] = np.array([-1, vocab, 2**31 - 1], I32)[: bad.size]
    args = {"out": np.full((n, hidden), np.nan, F16), "tokens": tokens,
            "table": rng.standard_normal((vocab, hidden)).astype(F16), "scales": None, "zeros": None,
            "n": n, "hidden": hidden, "vocab": vocab, "group_size": 0}
    got, want = launch(cubin, "embedding", args, ("n", "hidden", "vocab", "group_size"))
    np.testing.assert_array_equal(got["out"].view(np.uint16), want["out"].view(np.uint16))


@pytest.mark.parametrize("zeros", ["none", "integer", "any"])
@pytest.mark.parametrize("gs", [0, 64])
@pytest.mark.parametrize("fmt,hidden", [("q4", 2048), ("q4", 576), ("q4", 40), ("q8", 2048), ("q8", 576), ("q8", 100)])
def test_quantized_embedding(cubin, fmt, hidden, gs, zeros):
    rng = seeded("embedding", fmt, hidden, gs, zeros)
    vocab, n = 1000, 37
    groups = -(-hidden // (gs or hidden))   # 576 / 64 = 9; 100 and 40: one short group
    tokens = rng.integers(0, vocab, n).astype(I32)
    tokens[[3, 10, 20]] = np.array([-1, vocab, 2**31 - 1], I32)
    top = 16 if fmt == "q4" else 256
    table = rng.integers(0, 256, (vocab, hidden // 2 if fmt == "q4" else hidden), dtype=np.uint8)
    zero = {"none": None, "integer": rng.integers(0, top, (vocab, groups)).astype(F16),
            "any": rng.uniform(0, top - 1, (vocab, groups)).astype(F16)}[zeros]
    args = {"out": np.full((n, hidden), np.nan, F16), "tokens": tokens, "table": table,
            "scales": rng.uniform(1e-3, 0.3, (vocab, groups)).astype(F16), "zeros": zero,
            "n": n, "hidden": hidden, "vocab": vocab, "group_size": gs}
    got, want = launch(cubin, "embedding", args, ("n", "hidden", "vocab", "group_size"), {"weight_format": fmt})
    assert not np.isnan(want["out"]).any()
    np.testing.assert_array_equal(got["out"].view(np.uint16), want["out"].view(np.uint16))


@pytest.mark.parametrize("hidden", [576, 2048, 100])
@pytest.mark.parametrize("n_real", [1, 77, 128])
def test_take_last(cubin, n_real, hidden):
    rng = seeded("take_last", n_real, hidden)
    args = {"out": np.full((1, hidden), np.nan, F16), "x": rng.standard_normal((128, hidden)).astype(F16),
            "n_real": np.array([n_real], I32), "hidden": hidden}
    got, want = launch(cubin, "take_last", args, ("hidden",))
    np.testing.assert_array_equal(got["out"].view(np.uint16), want["out"].view(np.uint16))
