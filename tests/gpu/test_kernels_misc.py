"""embedding and take_last kernels against the numpy oracle (``runner/cpu.py``): bit-exact copies.

Outputs are NaN-poisoned; out-of-range tokens (-1, vocab, a large id) must give zero rows; both the
16-byte kernels (hidden % 8 == 0) and the per-element fallbacks (hidden = 100) run.
"""

from __future__ import annotations

import zlib
import numpy as np
import pytest

from kernel_harness import run_kernel

from grokc.runner.cpu import OPS
from grokc.targets import rules_misc as rm
from grokc.targets import build_cubin, get_target
from grokc.targets.archs import TARGETS
from grokc.targets.base import KernelCall

F16, I32 = np.float16, np.int32


@pytest.fixture(scope="module")
def cubin(cuda_context) -> bytes:
    major, minor = cuda_context.compute_capability
    symbols = ("embedding_v8", "embedding_v1", "take_last_v8", "take_last_v1")
    return build_cubin(symbols, get_target(f"sm{major}{minor}"))


def seeded(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def launch(cubin, op: str, args: dict, scalars: tuple[str, ...]) -> tuple[dict, dict]:
    call = KernelCall(op, dims={k: args[k] for k in scalars})
    choice = next(c for c in (rule(call, TARGETS["sm90"]) for rule in rm.RULES[op]) if c is not None)
    want = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    OPS[op](want, {})
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
            "table": rng.standard_normal((vocab, hidden)).astype(F16), "n": n, "hidden": hidden, "vocab": vocab}
    got, want = launch(cubin, "embedding", args, ("n", "hidden", "vocab"))
    np.testing.assert_array_equal(got["out"].view(np.uint16), want["out"].view(np.uint16))


@pytest.mark.parametrize("hidden", [576, 2048, 100])
@pytest.mark.parametrize("n_real", [1, 77, 128])
def test_take_last(cubin, n_real, hidden):
    rng = seeded("take_last", n_real, hidden)
    args = {"out": np.full((1, hidden), np.nan, F16), "x": rng.standard_normal((128, hidden)).astype(F16),
            "n_real": np.array([n_real], I32), "hidden": hidden}
    got, want = launch(cubin, "take_last", args, ("hidden",))
    np.testing.assert_array_equal(got["out"].view(np.uint16), want["out"].view(np.uint16))
