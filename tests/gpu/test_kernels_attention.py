"""attention_prefill and attention_decode kernels against the numpy oracle (``runner/cpu.py``).

Every case draws fresh random inputs, poisons ``out`` with NaN, fills the whole KV pool with random
data (so a stray write or a read of the wrong block shows), scatters each slot's blocks over the
pool in a shuffled order, and puts NaN into the padding rows of a prefill's ``qkv`` (they must
never be read). Checked:

- ``out``: ``max |got - want| <= 2e-2`` and ``||got - want|| / ||want|| <= 4e-3`` (the P.V product
  runs on f16 probabilities, like flash attention); padding rows and inactive slots exactly zero;
- the cache: ``v`` bit-exact; ``k`` bit-exact inside the RoPE table and within 1 f16 ulp past it
  (sincosf against numpy's cos/sin); every position nobody wrote unchanged, bit for bit.

Shapes: SmolLM2 (9/3 heads, D=64), Llama-3.2-1B (32/8, 64), Llama-2-7B (32/32, 128), Gemma 3
(4/1 and 8/4, D=256: the fallbacks); prefill L = 16, 100, 512, 4096 (and t_real = 0); decode at
positions 0, 15, 16, past the table, 8191; local layers (``window`` 1, 5, 24, 100, 512, and wider
than the sequence), whose keys outside the window must not count: the cache is random there.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import run_kernel, seeded

from grokc.abi.ops import KV_BLOCK_SIZE as S
from grokc.runner.cpu import OPS
from grokc.targets import build_kernels, get_target
from grokc.targets import rules_attention as ra
from grokc.targets.archs import TARGETS
from grokc.targets.base import KernelCall

F16, F32, I32 = np.float16, np.float32, np.int32
THETA = 10000.0

PREFILL_SYMBOLS = ("attn_prefill_mma_d64_n64", "attn_prefill_mma_d128_n32", "attn_prefill_ref")
DECODE_SYMBOLS = ("attn_decode_mma_d64_w8_s4_c1", "attn_decode_mma_d64_w8_s4_c1_early", "attn_decode_mma_d64_w4_s4_c1",
                  "attn_decode_mma_d64_w8_s2_c1", "attn_decode_mma_d64_w4_s2_c2", "attn_decode_mma_d64_w4_s4_c8",
                  "attn_decode_mma_d128_w4_s4_c1", "attn_decode_mma_d128_w4_s3_c4", "attn_decode_ref")




@pytest.fixture(scope="module")
def cubin(sm) -> bytes:
    symbols = PREFILL_SYMBOLS + tuple(s for s in DECODE_SYMBOLS if sm >= 90 or not s.endswith(("_c2", "_c4", "_c8")))
    return build_kernels(symbols, get_target(f"sm{sm}"))


# -- inputs -----------------------------------------------------------------------------------

def rope(d: int, table_len: int, mscale: float) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / THETA ** (np.arange(0, d, 2, dtype=np.float64) / d)                 # [D/2]
    ang = np.arange(table_len, dtype=np.float64)[:, None] * inv[None, :]
    table = (np.stack([np.cos(ang), np.sin(ang)], axis=-1) * mscale).astype(F32)  # [T, D/2, 2]
    return table, inv.astype(F32)


def kv_pool(rng, n_slots: int, max_blocks: int, nkv: int, d: int, spare: int = 5):
    """Random caches [NB, NKV, S, D] and a block table [n_slots, MB] scattered over a shuffled pool."""
    nb = n_slots * max_blocks + spare
    k_cache = rng.standard_normal((nb, nkv, S, d)).astype(F16)
    v_cache = rng.standard_normal((nb, nkv, S, d)).astype(F16)
    block_table = rng.permutation(nb)[: n_slots * max_blocks].reshape(n_slots, max_blocks).astype(I32)
    return k_cache, v_cache, block_table


def attn_args(rng, rows, nh, nkv, d, table_len, mscale, max_blocks, window=0, softcap=0.0):
    table, inv = rope(d, table_len, mscale)
    return {
        "out": np.full((rows, nh * d), np.nan, F16),
        "qkv": rng.standard_normal((rows, (nh + 2 * nkv) * d)).astype(F16),
        "rope_table": table, "inv_freq": inv,
        "n_heads": nh, "n_kv_heads": nkv, "head_dim": d, "table_len": table_len, "max_blocks": max_blocks,
        "window": window, "scale": float(d ** -0.5), "mscale": mscale, "softcap": softcap,
    }


def oracle(op: str, args: dict) -> dict:
    want = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    OPS[op](want, {})
    return want


def written_mask(nb: int, block_table: np.ndarray, slot_positions: dict[int, list[int]]) -> np.ndarray:
    """bool [NB, S]: the (block, row) cells the op writes."""
    mask = np.zeros((nb, S), bool)
    for b, positions in slot_positions.items():
        for p in positions:
            mask[block_table[b, p // S], p % S] = True
    return mask


def check_out(got: np.ndarray, want: np.ndarray) -> None:
    assert not np.isnan(got).any(), "unwritten (NaN-poisoned) output elements"
    g, w = got.astype(np.float64), want.astype(np.float64)
    err = np.abs(g - w).max()
    rel = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)
    assert err <= 2e-2 and rel <= 4e-3, f"max abs err {err:.3g}, rel norm err {rel:.3g}"


def check_cache(got: dict, want: dict, before: dict, mask: np.ndarray, exact_k: bool) -> None:
    for name in ("k_cache", "v_cache"):
        g, w, b0 = got[name], want[name], before[name]
        untouched = ~mask[:, None, :, None].repeat(g.shape[1], 1).repeat(g.shape[3], 3)
        assert np.array_equal(g[untouched].view(np.uint16), b0[untouched].view(np.uint16)), \
            f"{name}: positions nobody writes changed"
        if name == "v_cache" or exact_k:
            assert np.array_equal(g.view(np.uint16), w.view(np.uint16)), f"{name}: written rows differ"
        else:
            np.testing.assert_allclose(g.astype(F32), w.astype(F32), rtol=1e-3, atol=1e-3, err_msg=name)


# -- prefill ----------------------------------------------------------------------------------

PREFILL_CASES = [  # (L, t_real, nh, nkv, d, table_len, window)
    (16, 16, 9, 3, 64, 4096, 0),
    (16, 0, 9, 3, 64, 4096, 0),
    (100, 77, 9, 3, 64, 64, 0),        # positions 64.. past the table
    (512, 500, 32, 8, 64, 4096, 0),
    (128, 128, 32, 32, 128, 4096, 0),
    (100, 99, 32, 32, 128, 50, 0),
    (4096, 4001, 4, 1, 64, 4096, 0),
    # local layers: a window inside one key tile, across tiles, of one key, wider than the prompt
    (128, 120, 8, 2, 64, 4096, 5),
    (512, 500, 32, 8, 64, 4096, 100),
    (100, 99, 16, 4, 128, 4096, 1),
    (64, 40, 4, 1, 128, 4096, 512),
    # head_dim 256 (Gemma 3): the fallback only
    (64, 60, 4, 1, 256, 4096, 0),
    (128, 127, 8, 4, 256, 4096, 24),
]


def prefill_symbol_for(d: int, kind: str) -> str:
    return "attn_prefill_ref" if kind == "ref" else f"attn_prefill_mma_d{d}_n{ra._prefill_tile(d)}"


@pytest.mark.parametrize("kind", ["mma", "ref"])
@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: "L{}_t{}_h{}-{}_d{}_tab{}_w{}".format(*c))
def test_attention_prefill(cubin, case, kind):
    run_prefill(cubin, case, kind)


# Grok-1's capped scores (cap * tanh(s / cap)); at 2 the cap changes every output (checked against the oracle uncapped)
CAPPED_PREFILL = [(128, 120, 8, 2, 64, 4096, 0), (100, 99, 32, 32, 128, 50, 0), (64, 60, 4, 1, 256, 4096, 0)]
CAPPED_DECODE = [(9, 3, 64, [0, 15, 16, 700], [1, 1, 0, 1], 48, 512, 0), (32, 32, 128, [77, 1500], [1, 1], 128, 1024, 0),
                 (4, 1, 256, [3, 600, 40], [1, 1, 1], 48, 1024, 0)]
SOFTCAP = 2.0


@pytest.mark.parametrize("kind", ["mma", "ref"])
@pytest.mark.parametrize("case", CAPPED_PREFILL, ids=lambda c: "L{}_t{}_h{}-{}_d{}_tab{}_w{}".format(*c))
def test_attention_prefill_softcap(cubin, case, kind):
    run_prefill(cubin, case, kind, SOFTCAP)


def uncapped_differs(op: str, args: dict, want: dict) -> bool:
    plain = oracle(op, {**args, "softcap": 0.0})["out"].astype(F32)
    return bool(np.abs(plain - want["out"].astype(F32)).max() > 0.1)


def run_prefill(cubin, case, kind, softcap=0.0):
    L, t_real, nh, nkv, d, table_len, window = case
    if kind == "ref" and L > 512:
        pytest.skip("the fallback is O(L^2 D) per head on CUDA cores; covered at smaller L")
    if kind == "mma" and d not in (64, 128):
        pytest.skip("the tensor-core prefill has head_dim 64 and 128 only")
    rng = seeded(case, kind)
    n_slots, max_blocks = 3, -(-L // S) + 2
    args = attn_args(rng, L, nh, nkv, d, table_len, 1.0 if table_len > 64 else 1.07, max_blocks, window, softcap)
    args["qkv"][t_real:] = np.nan                 # padding rows are never read
    k_cache, v_cache, block_table = kv_pool(rng, n_slots, max_blocks, nkv, d)
    slot = 1
    args.update(k_cache=k_cache, v_cache=v_cache, block_table=block_table, L=L,
                slot=np.array([slot], I32), n_real=np.array([t_real], I32))
    symbol = prefill_symbol_for(d, kind)
    call = KernelCall("attention_prefill", dims={k: args[k] for k in
                         ("L", "n_heads", "n_kv_heads", "head_dim", "table_len", "max_blocks", "scale", "mscale")})
    rule = ra.prefill_ref if kind == "ref" else ra.prefill_mma
    choice = rule(call, TARGETS["sm90"])
    assert choice is not None and choice.kernel == symbol
    want = oracle("attention_prefill", args)
    assert not softcap or not t_real or uncapped_differs("attention_prefill", args, want)
    got = run_kernel(cubin, symbol, choice.grid, choice.block, choice.smem, "attention_prefill", args)
    check_out(got["out"], want["out"])
    assert not got["out"][t_real:].any(), "padding rows must be zero"
    mask = written_mask(k_cache.shape[0], block_table, {slot: list(range(t_real))})
    check_cache(got, want, args, mask, exact_k=t_real <= table_len)


# -- decode -----------------------------------------------------------------------------------

DECODE_CASES = [  # (nh, nkv, d, positions, active, max_blocks, table_len, window)
    (9, 3, 64, [0, 15, 16, 700], [1, 1, 0, 1], 48, 512, 0),
    (32, 8, 64, [8191], [1], 512, 8192, 0),
    (32, 8, 64, [511], [1], 32, 8192, 0),   # the Llama-1B bench's case: every cache block of the slot in use
    (32, 8, 64, [5, 4095, 333, 1, 2047, 16, 31, 600], [1, 1, 1, 0, 1, 1, 1, 1], 256, 4096, 0),
    (32, 32, 128, [77, 1500], [1, 1], 128, 1024, 0),
    (32, 32, 128, [0, 4000, 0], [0, 1, 1], 256, 2048, 0),
    # local layers: the window starts inside a cache block, on a block edge, holds one key, covers all
    (9, 3, 64, [0, 15, 16, 700], [1, 1, 1, 1], 48, 512, 100),
    (32, 8, 64, [5, 4095, 333, 2047], [1, 1, 1, 1], 256, 4096, 512),
    (32, 32, 128, [77, 1500], [1, 1], 128, 1024, 1),
    (16, 4, 128, [30, 31], [1, 1], 8, 1024, 4096),
    # head_dim 256 (Gemma 3): the fallback only
    (4, 1, 256, [3, 600, 40], [1, 1, 1], 48, 1024, 0),
    (4, 1, 256, [3, 600, 40], [1, 1, 1], 48, 1024, 512),
]


def decode_launch(symbol: str, batch: int, nkv: int, d: int, nh: int, max_blocks: int, sm: int):
    if symbol == "attn_decode_ref":
        return (nh, batch, 1), (128, 1, 1), (max_blocks * S + d) * 4
    _, _, _, dd, w, st, cs = symbol.removesuffix("_early").split("_")
    w, st, cs = int(w[1:]), int(st[1:]), int(cs[1:])
    return (nkv * cs, batch, 1), (32 * w, 1, 1), ra.decode_mma_smem(d, w, st)


@pytest.mark.parametrize("symbol", DECODE_SYMBOLS)
@pytest.mark.parametrize("case", DECODE_CASES,
                         ids=lambda c: f"h{c[0]}-{c[1]}_d{c[2]}_B{len(c[3])}_p{max(c[3])}_w{c[7]}")
def test_attention_decode(cubin, sm, symbol, case):
    run_decode(cubin, sm, symbol, case)


@pytest.mark.parametrize("symbol", DECODE_SYMBOLS)
@pytest.mark.parametrize("case", CAPPED_DECODE, ids=lambda c: f"h{c[0]}-{c[1]}_d{c[2]}_B{len(c[3])}_p{max(c[3])}_w{c[7]}")
def test_attention_decode_softcap(cubin, sm, symbol, case):
    run_decode(cubin, sm, symbol, case, SOFTCAP)


def run_decode(cubin, sm, symbol, case, softcap=0.0):
    nh, nkv, d, positions, active, max_blocks, table_len, window = case
    if symbol != "attn_decode_ref" and f"_d{d}_" not in symbol:
        pytest.skip("kernel compiled for another head_dim")
    if symbol.endswith(("_c2", "_c4", "_c8")) and sm < 90:
        pytest.skip("thread-block clusters need sm_90")
    if symbol == "attn_decode_ref" and max(positions) > 4096:
        pytest.skip("the fallback's scores of 8192 positions are covered by the split kernels")
    rng = seeded(case, symbol)
    batch = len(positions)
    args = attn_args(rng, batch, nh, nkv, d, table_len, 1.0, max_blocks, window, softcap)
    k_cache, v_cache, block_table = kv_pool(rng, batch, max_blocks, nkv, d)
    args.update(k_cache=k_cache, v_cache=v_cache, block_table=block_table, B=batch,
                positions=np.array(positions, I32), active=np.array(active, I32))
    grid, block, smem = decode_launch(symbol, batch, nkv, d, nh, max_blocks, sm)
    want = oracle("attention_decode", args)
    assert not softcap or uncapped_differs("attention_decode", args, want)
    got = run_kernel(cubin, symbol, grid, block, smem, "attention_decode", args)
    check_out(got["out"], want["out"])
    inactive = np.array(active) == 0
    assert not got["out"][inactive].any(), "inactive slots must get zero rows"
    mask = written_mask(k_cache.shape[0], block_table,
                        {b: [p] for b, (p, a) in enumerate(zip(positions, active)) if a})
    check_cache(got, want, args, mask, exact_k=all(p < table_len for p in positions))

