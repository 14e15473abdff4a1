"""embedding, take_last, rms_norm and qk_norm kernels against the numpy oracle (``runner/cpu.py``).

embedding and take_last are bit-exact; the norms within 1 f16 ulp (rsqrtf and the block's order
of summation against numpy's).

Outputs are NaN-poisoned; out-of-range tokens (-1, vocab, a large id) must give zero rows; both the
16-byte kernels (hidden % 8 == 0) and the per-element fallbacks (hidden = 100) run. Quantized tables
(q8, q4) dequantize bit-exactly too (f32 math, one rounding to f16): per row and per group, with and
without zero-points (arbitrary f16 ones included), through every q4/q8 kernel (hidden 2048 and 576:
16-byte q4 loads; 40: one word; 100: the q8 per-code fallback), scaled (Gemma 3's sqrt(hidden)) and
not.
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
               "embedding_q4_w1", "take_last_v8", "take_last_v1", "rms_norm_rows", "qk_norm_heads")
    return build_kernels(symbols, get_target(f"sm{major}{minor}"))



def launch(cubin, op: str, args: dict, scalars: tuple[str, ...], attrs: dict | None = None) -> tuple[dict, dict]:
    call = KernelCall(op, attrs or {}, dims={k: args[k] for k in scalars})
    choice = next(c for c in (rule(call, TARGETS["sm90"]) for rule in rm.RULES[op]) if c is not None)
    want = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    OPS[op](want, attrs or {})
    got = run_kernel(cubin, choice.kernel, choice.grid, choice.block, choice.smem, op, args)
    return got, want


@pytest.mark.parametrize("scale", [1.0, 25.298221])   # Gemma 3's sqrt(640) in f32
@pytest.mark.parametrize("hidden", [576, 2048, 4096, 100])
@pytest.mark.parametrize("n", [1, 8, 517])
def test_embedding(cubin, n, hidden, scale):
    rng = seeded("embedding", n, hidden, scale)
    vocab = 1000
    tokens = rng.integers(0, vocab, n).astype(I32)
    bad = rng.choice(n, min(n, 3), replace=False)  # out of range: zero rows
    tokens[bad] = np.array([-1, vocab, 2**31 - 1], I32)[: bad.size]
    args = {"out": np.full((n, hidden), np.nan, F16), "tokens": tokens,
            "table": rng.standard_normal((vocab, hidden)).astype(F16), "scales": None, "zeros": None,
            "n": n, "hidden": hidden, "vocab": vocab, "group_size": 0, "scale": scale}
    got, want = launch(cubin, "embedding", args, ("n", "hidden", "vocab", "group_size", "scale"))
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
            "n": n, "hidden": hidden, "vocab": vocab, "group_size": gs, "scale": 1.0 if gs else 25.298221}
    got, want = launch(cubin, "embedding", args, ("n", "hidden", "vocab", "group_size", "scale"), {"weight_format": fmt})
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


def close_f16(got: np.ndarray, want: np.ndarray) -> None:
    """Within one f16 ulp of the oracle, element by element."""
    g, w = got.astype(np.float32), want.astype(np.float32)
    ulp = np.spacing(np.abs(want)).astype(np.float32)
    assert not np.isnan(g).any()
    assert (np.abs(g - w) <= ulp + 1e-7).all(), float(np.abs(g - w).max())


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("m,hidden", [(1, 640), (7, 2304), (128, 100)])
def test_rms_norm(cubin, m, hidden, residual):
    rng = seeded("rms_norm", m, hidden, residual)
    args = {"out": np.full((m, hidden), np.nan, F16), "x": (3 * rng.standard_normal((m, hidden))).astype(F16),
            "weight": (1 + 0.3 * rng.standard_normal(hidden)).astype(F16),
            "residual": rng.standard_normal((m, hidden)).astype(F16) if residual else None,
            "M": m, "hidden": hidden, "eps": 1e-6}
    got, want = launch(cubin, "rms_norm", args, ("M", "hidden", "eps"))
    close_f16(got["out"], want["out"])


@pytest.mark.parametrize("m,nh,nkv,d", [(1, 4, 1, 256), (16, 16, 8, 128), (5, 9, 3, 64)])
def test_qk_norm(cubin, m, nh, nkv, d):
    rng = seeded("qk_norm", m, nh, nkv, d)
    args = {"out": np.full((m, (nh + 2 * nkv) * d), np.nan, F16),
            "qkv": (2 * rng.standard_normal((m, (nh + 2 * nkv) * d))).astype(F16),
            "q_norm": (1 + 0.3 * rng.standard_normal(d)).astype(F16), "k_norm": rng.standard_normal(d).astype(F16),
            "M": m, "n_heads": nh, "n_kv_heads": nkv, "head_dim": d, "eps": 1e-6}
    got, want = launch(cubin, "qk_norm", args, ("M", "n_heads", "n_kv_heads", "head_dim", "eps"))
    close_f16(got["out"], want["out"])
    v = slice((nh + nkv) * d, None)
    assert np.array_equal(got["out"][:, v].view(np.uint16), args["qkv"][:, v].view(np.uint16))
