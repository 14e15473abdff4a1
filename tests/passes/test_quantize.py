"""Round-to-nearest int4 against an independent per-row, per-group reference written here."""

import numpy as np
import pytest

from grokc.artifacts import int4, int8
from grokc.artifacts.errors import BuildOptionError
from grokc.passes.quantize import QuantRecipe, Rounding, dequantized_embedding, quantize_embedding, quantize_rtn
from grokc.passes.rounding import int8_rtn
from grokc.compiler.ir import WeightFormat


def reference(w: np.ndarray, gs: int, symmetric: bool) -> np.ndarray:
    """Dequantized weights, one group at a time with plain Python loops over rows and groups."""
    n, k = w.shape
    gs = gs or k
    out = np.empty_like(w)
    for r in range(n):
        for g0 in range(0, k, gs):
            blk = w[r, g0:g0 + gs].astype(np.float64)
            if symmetric:
                s = np.float32(np.float16(np.abs(blk).max() / 7)) or np.float32(1)
                q = np.clip(np.rint(blk / s), -8, 7)
                out[r, g0:g0 + gs] = q * s
            else:
                lo, hi = min(blk.min(), 0.0), max(blk.max(), 0.0)
                s = np.float32(np.float16((hi - lo) / 15)) or np.float32(1)
                z = np.float32(np.float16(np.clip(np.rint(-lo / s), 0, 15)))
                q = np.clip(np.rint(blk / s) + z, 0, 15)
                out[r, g0:g0 + gs] = (q - z) * s
    return out


@pytest.mark.parametrize("shape,gs", [((7, 64), 0), ((5, 96), 32), ((3, 80), 32), ((4, 40), 16), ((2, 24), 0)])
@pytest.mark.parametrize("symmetric", [True, False])
def test_rtn_matches_reference_and_error_is_half_a_step(shape, gs, symmetric):
    rng = np.random.default_rng(sum(shape) + gs)
    w = rng.standard_normal(shape).astype(np.float32)
    w[0, :8] = 0  # a partly zero row
    codes, scales, zeros = quantize_rtn(w, gs, symmetric)
    deq = int4.dequantize(int4.pack(codes), scales, zeros, gs)
    np.testing.assert_allclose(deq, reference(w, gs, symmetric), rtol=1e-6, atol=1e-7)
    step = np.repeat(scales.astype(np.float32), gs or shape[1], axis=1)[:, : shape[1]]
    clipped = (codes == 0) | (codes == 15)   # asymmetric extremes may clip by rounding the zero-point
    assert np.all((np.abs(deq - w) <= step / 2 + 1e-6) | clipped)


def test_all_zero_rows_quantize_to_zero():
    codes, scales, zeros = quantize_rtn(np.zeros((3, 16), np.float32), 0, True)
    assert np.all(int4.dequantize(int4.pack(codes), scales, zeros, 0) == 0)


def test_pack_layout_by_hand():
    """Nibble j of each little-endian word holds code [0, 2, 4, 6, 1, 3, 5, 7][j] (int4.py)."""
    codes = np.arange(16, dtype=np.uint8).reshape(1, 16)
    words = int4.pack(codes).view("<u4")[0]
    for w, base in zip(words, (0, 8)):
        nibbles = [(int(w) >> (4 * j)) & 0xF for j in range(8)]
        assert nibbles == [base + c for c in (0, 2, 4, 6, 1, 3, 5, 7)]


def test_bad_group_size_is_refused():
    with pytest.raises(BuildOptionError, match="--group-size 12"):
        QuantRecipe("int4", WeightFormat.Q4, group_size=12)


# -- the embedding table (--embeddings) ---------------------------------------------------------

def int8_reference(w: np.ndarray, symmetric: bool = True) -> np.ndarray:
    """Dequantized int8, one row at a time. Symmetric: scale = f16(absmax / 127), codes rint(w / scale).
    Asymmetric: the row's range [min(w, 0), max(w, 0)] in 255 steps of f16(range / 255), zero-point
    rint(-min / scale) in [0, 255], codes rint(w / scale) + zero in [0, 255]."""
    out = np.empty_like(w)
    for r in range(w.shape[0]):
        row = w[r].astype(np.float64)
        if symmetric:
            s = np.float32(np.float16(np.abs(row).max() / 127)) or np.float32(1)
            out[r] = np.clip(np.rint(row / s), -127, 127) * s
        else:
            lo, hi = min(row.min(), 0.0), max(row.max(), 0.0)
            s = np.float32(np.float16((hi - lo) / 255)) or np.float32(1)
            z = np.clip(np.rint(-lo / s), 0, 255)
            out[r] = (np.clip(np.rint(row / s) + z, 0, 255) - z) * s
    return out


def embedding_recipe(fmt: WeightFormat, **kw) -> QuantRecipe:
    return QuantRecipe("fp16", WeightFormat.F16, embeddings=fmt, **kw)


def table(shift: float = 0.0) -> np.ndarray:
    w = np.random.default_rng(3).standard_normal((40, 64)).astype(np.float32) + np.float32(shift)
    w[1] = 0   # an all-zero row
    return w


def test_int8_embedding_matches_reference_and_stores_u8_codes_per_row():
    w = table()
    codes, scales, zeros, gs = quantize_embedding(w, embedding_recipe(WeightFormat.Q8))
    assert codes.dtype == np.uint8 and codes.shape == (40, 64) and scales.shape == (40, 1) and zeros is None
    assert gs == 0 and codes.min() >= 1                 # symmetric: codes in [1, 255], 128 is zero
    deq = (codes.astype(np.float32) - 128) * scales.astype(np.float32)
    np.testing.assert_allclose(deq, int8_reference(w), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(dequantized_embedding(w, embedding_recipe(WeightFormat.Q8)), deq)
    step = np.abs(w).max(1, keepdims=True) / 127
    assert np.all(np.abs(deq - w) <= step / 2 * (1 + 2 ** -10) + 1e-7)   # half a step (f16-rounded scale)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("gs,stored_gs", [(0, 0), (16, 16), (48, 0)])   # 48 does not divide 64: per row
def test_int4_embedding_is_rtn_per_row_or_group_in_the_packed_layout(symmetric, gs, stored_gs):
    w = table()
    recipe = embedding_recipe(WeightFormat.Q4, group_size=gs, symmetric=symmetric)
    packed, scales, zeros, got_gs = quantize_embedding(w, recipe)
    assert got_gs == stored_gs and packed.shape == (40, 32) and scales.shape == (40, 64 // (stored_gs or 64))
    assert (zeros is None) == symmetric
    deq = int4.dequantize(packed, scales, zeros, stored_gs)
    np.testing.assert_allclose(deq, reference(w, stored_gs, symmetric), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(dequantized_embedding(w, recipe), deq)
    assert np.all(deq[1] == 0)
    step = np.repeat(scales.astype(np.float32), stored_gs or 64, axis=1)
    codes = int4.unpack(packed)
    assert np.all((np.abs(deq - w) <= step / 2 + 1e-6) | (codes == 0) | (codes == 15))


def test_embedding_errors_int8_below_int4_and_asymmetric_below_symmetric_on_shifted_rows():
    w = table(shift=1.5)   # mostly positive rows: a zero-point uses the grid better
    err = {name: np.abs(dequantized_embedding(w, embedding_recipe(fmt, symmetric=sym)) - w).mean(1)
           for name, fmt, sym in (("q8", WeightFormat.Q8, True), ("q4s", WeightFormat.Q4, True),
                                  ("q4a", WeightFormat.Q4, False))}
    rows = np.arange(40) != 1
    assert np.all(err["q8"][rows] < err["q4a"][rows]) and np.all(err["q4a"][rows] < err["q4s"][rows])
    assert np.all(10 * err["q8"][rows] < err["q4s"][rows])   # steps of absmax/127 vs absmax/7
    np.testing.assert_array_equal(dequantized_embedding(w, embedding_recipe(WeightFormat.F16)),
                                  w.astype(np.float16).astype(np.float32))


def test_int4_embedding_needs_hidden_a_multiple_of_8_and_bad_formats_are_refused():
    with pytest.raises(BuildOptionError, match="--embeddings int8"):
        quantize_embedding(np.ones((4, 20), np.float32), embedding_recipe(WeightFormat.Q4))
    assert quantize_embedding(np.ones((4, 20), np.float32), embedding_recipe(WeightFormat.Q8))[0].shape == (4, 20)
    with pytest.raises(BuildOptionError, match="--embeddings f32"):
        embedding_recipe(WeightFormat.F32)


def traced_tiny():
    from grokc.compiler.names import from_hf
    from grokc.compiler.trace import trace_module
    from tiny_llama import tiny_config, tiny_weights

    cfg = tiny_config()   # tied LM head
    return trace_module(cfg, {from_hf(k): v for k, v in tiny_weights(cfg).items()})


@pytest.mark.parametrize("fmt,head", [(WeightFormat.Q4, WeightFormat.F16), (WeightFormat.Q8, WeightFormat.F16),
                                      (WeightFormat.Q4, WeightFormat.Q4), (WeightFormat.F16, WeightFormat.F16)])
def test_pass_quantizes_the_table_and_a_tied_head_keeps_its_own_weights(fmt, head):
    from grokc.compiler.ir import OpKind, verify
    from grokc.passes import quantize

    m = traced_tiny()
    table_f32 = np.asarray(m.params["token_embd.weight"])
    recipe = QuantRecipe("int4-rtn", WeightFormat.Q4, group_size=32, symmetric=False, lm_head=head, embeddings=fmt)
    q = quantize.run(m, recipe)
    verify(q)
    g = q.graphs["forward"]
    emb = next(n for n in g.nodes if n.op is OpKind.EMBEDDING)
    lm = next(n for n in g.nodes if n.outputs[0] in g.outputs)
    assert emb.attrs.weight_format is fmt and q.meta["quant"]["embeddings"] == fmt.value
    if fmt is WeightFormat.F16:       # shared, as before
        assert emb.inputs["table"] == lm.inputs["weight"] == "token_embd.weight"
        return
    codes_name = "token_embd.qweight" if fmt is WeightFormat.Q4 else "token_embd.q8weight"
    assert emb.inputs["table"] == codes_name and emb.inputs["scales"] == "token_embd.scales"
    assert ("zeros" in emb.inputs) == (fmt is WeightFormat.Q4)    # int8 is always symmetric
    assert emb.attrs.group_size == (32 if fmt is WeightFormat.Q4 else 0)
    assert "token_embd.weight" not in q.params                     # token_embd.* is what the embedding reads
    zeros = q.params.get("token_embd.zeros")
    deq = (int4 if fmt is WeightFormat.Q4 else int8).dequantize(q.params[codes_name], q.params["token_embd.scales"],
                                                                zeros, emb.attrs.group_size)
    np.testing.assert_array_equal(deq, dequantized_embedding(table_f32, recipe))
    if head is WeightFormat.F16:   # the f16 table, as the head's own weight
        assert lm.inputs["weight"] == "output.weight"
        np.testing.assert_array_equal(q.params["output.weight"], table_f32.astype(np.float16))
    else:
        assert lm.inputs["qweight"] == "output.qweight" and "output.weight" not in q.params


# -- the int8 LM head (--lm-head int8) ------------------------------------------------------------

@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_rtn_matches_reference_within_half_a_step(symmetric):
    """int8_rtn per row against the loop reference above (same rounding, so equal to f32 precision:
    1e-6 relative), and every weight within half a step of its code (the f16-rounded scale moves the
    grid by at most 2**-11 of a step per code, hence the small slack)."""
    w = table(shift=1.5)   # rows mostly positive: the zero-point moves, the range shrinks by about 0.6
    w[2, :] = -np.abs(w[2, :])   # an all-negative row: zero-point 255
    codes, scales, zeros = int8_rtn(w, symmetric)
    assert codes.dtype == np.uint8 and codes.shape == w.shape and scales.shape == (40, 1)
    assert (zeros is None) == symmetric
    deq = int8.dequantize(codes, scales, zeros, 0)
    np.testing.assert_allclose(deq, int8_reference(w, symmetric), rtol=1e-6, atol=1e-7)
    assert np.all(deq[1] == 0)
    step = scales.astype(np.float32)
    assert np.all(np.abs(deq - w) <= step / 2 * (1 + 2 ** -9) + 1e-7)
    if not symmetric:
        z = zeros.astype(np.float32)
        assert np.all(z == np.rint(z)) and z.min() >= 0 and z.max() <= 255 and z[2, 0] == 255
        assert np.abs(deq - w).mean() < 0.8 * np.abs(int8_reference(w, True) - w).mean()   # the zero-point pays


def _head_and_table(q):
    from grokc.compiler.ir import OpKind

    g = q.graphs["forward"]
    return (next(n for n in g.nodes if n.outputs[0] in g.outputs),
            next(n for n in g.nodes if n.op is OpKind.EMBEDDING))


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("embeddings", [WeightFormat.F16, WeightFormat.Q8, WeightFormat.Q4])
def test_pass_int8_head_is_per_channel_rtn_of_the_tied_table_which_keeps_its_format(symmetric, embeddings):
    from grokc.compiler.ir import verify
    from grokc.passes import quantize

    m = traced_tiny()   # tied: the head reads token_embd.weight
    source = np.asarray(m.params["token_embd.weight"])
    recipe = QuantRecipe("int4-rtn", WeightFormat.Q4, group_size=32, symmetric=symmetric, lm_head=WeightFormat.Q8,
                         embeddings=embeddings)
    q = quantize.run(m, recipe)
    verify(q)
    lm, emb = _head_and_table(q)
    assert lm.attrs.weight_format is WeightFormat.Q8 and lm.attrs.group_size == 0 and q.meta["quant"]["lm_head"] == "q8"
    # a symmetric int8 head of an int8 table reads the table's own codes and scales: stored once
    base = "token_embd" if symmetric and embeddings is WeightFormat.Q8 else "output"
    assert lm.inputs["qweight"] == f"{base}.q8weight" and lm.inputs["scales"] == f"{base}.scales"
    assert ("output.q8weight" in q.params) == (base == "output")
    assert ("zeros" in lm.inputs) == (not symmetric) and "weight" not in lm.inputs
    assert not any(r.startswith("residual") for r in lm.inputs)
    codes = q.params[f"{base}.q8weight"]
    assert codes.dtype == np.uint8 and codes.shape == source.shape and q.params[f"{base}.scales"].shape == (source.shape[0], 1)
    deq = int8.dequantize(codes, q.params[f"{base}.scales"], q.params.get(f"{base}.zeros"), 0)
    np.testing.assert_allclose(deq, int8_reference(source, symmetric), rtol=1e-6, atol=1e-7)
    # the embedding table keeps its own format, under token_embd.*
    assert emb.attrs.weight_format is embeddings
    if embeddings is WeightFormat.F16:
        assert emb.inputs["table"] == "token_embd.weight"
        np.testing.assert_array_equal(q.params["token_embd.weight"], source.astype(np.float16))
    else:
        assert emb.inputs["table"].startswith("token_embd.") and "token_embd.weight" not in q.params


def test_gptq_recipe_with_int8_head_runs_gptq_on_the_body_only():
    """A calibrated recipe: every body linear is GPTQ-rounded with its statistics (so it differs from
    round-to-nearest), the int8 head is round-to-nearest and needs no statistics of its own."""
    from grokc.compiler import names
    from grokc.compiler.ir import OpKind
    from grokc.passes import quantize

    m = traced_tiny()
    rng = np.random.default_rng(0)
    linears = [n for n in m.graphs["forward"].nodes if n.op is OpKind.LINEAR and n.outputs[0] not in m.graphs["forward"].outputs]
    hessians = {}
    for n in linears:
        k = m.params[n.inputs["weight"]].shape[1]
        x = rng.standard_normal((4 * k, k)).astype(np.float32) * np.linspace(0.2, 3, k, dtype=np.float32)
        hessians[names.input_key(n.inputs["weight"])] = x.T @ x / len(x)
    assert names.LM_HEAD not in hessians
    recipe = QuantRecipe("int4", WeightFormat.Q4, symmetric=False, rounding=Rounding.GPTQ,
                         lm_head=WeightFormat.Q8)
    q = quantize.run(m, recipe, quantize.Calibration(hessians))
    lm, _ = _head_and_table(q)
    np.testing.assert_allclose(int8.dequantize(q.params["output.q8weight"], q.params["output.scales"],
                                               q.params["output.zeros"], 0),
                               int8_reference(np.asarray(m.params["token_embd.weight"]), False), rtol=1e-6, atol=1e-7)
    for n in linears:
        base = n.inputs["weight"].removesuffix(".weight")
        w = np.asarray(m.params[n.inputs["weight"]])
        got = int4.dequantize(q.params[f"{base}.qweight"], q.params[f"{base}.scales"], q.params[f"{base}.zeros"], 0)
        want = quantize.dequantized_weight(w, recipe, hessians[names.input_key(n.inputs["weight"])])
        np.testing.assert_array_equal(got, want)
        assert not np.array_equal(got, quantize.dequantized_weight(w, recipe.uncalibrated()))


def test_int8_head_options():
    assert QuantRecipe("x", WeightFormat.Q4, lm_head=WeightFormat.Q8).to_json()["lm_head"] == "q8"
    with pytest.raises(BuildOptionError, match="no int4 weights"):   # GPTQ is for int4 only
        QuantRecipe("x", WeightFormat.F16, rounding=Rounding.GPTQ, lm_head=WeightFormat.Q8)
    with pytest.raises(BuildOptionError, match="--fp16-residual"):
        QuantRecipe("x", WeightFormat.F16, lm_head=WeightFormat.Q8, fp16_residual=0.005)
    with pytest.raises(BuildOptionError, match="fp16, int8 or int4"):
        QuantRecipe("x", WeightFormat.Q4, lm_head=WeightFormat.F32)
