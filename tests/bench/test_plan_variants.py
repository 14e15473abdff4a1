"""bench/probes/plan_variants.py's launch rewrite (pure Python; no GPU): a swapped kernel gets the launch shape
and the programmatic edge its variant needs, from the rules' own formulas."""

from __future__ import annotations

import plan_variants  # bench/probes/, on the path by conftest.py

from grokc.artifacts.plan import Arg, Launch
from grokc.targets import rules_attention, rules_linear
from grokc.targets.archs import get_target

SM90 = get_target("sm90")


def attention(kernel: str, pdl: bool) -> Launch:
    args = (Arg("B", value=1), Arg("n_kv_heads", value=8))
    return Launch("attention_decode", kernel, (8, 1, 1), (256, 1, 1), 1, args, pdl=pdl)


def test_decode_attention_early_variant_gets_its_edge_and_shape():
    base = attention("attn_decode_mma_d64_w8_s4_c1", pdl=False)
    early = plan_variants.swapped(base, "attn_decode_mma_d64_w4_s2_c1_early", SM90)
    assert early.pdl is True
    assert early.grid == (8, 1, 1) and early.block == (128, 1, 1)
    assert early.smem == rules_attention.decode_mma_smem(64, 4, 2)
    plain = plan_variants.swapped(attention("attn_decode_mma_d64_w8_s4_c1_early", pdl=True), "attn_decode_mma_d64_w8_s4_c2", SM90)
    assert plain.pdl is False
    assert plain.grid == (16, 1, 1) and plain.smem == rules_attention.decode_mma_smem(64, 8, 4)


def test_gemv2_variant_gets_its_launch_shape_and_keeps_its_edge():
    args = (Arg("M", value=4), Arg("N", value=2048), Arg("K", value=2048))
    base = Launch("linear", "linear_gemv2_q4_none_f16_r1k8w1d2p1n0b0", (128, 1, 1), (256, 1, 1), 1, args, pdl=True)
    v = plan_variants.swapped(base, "linear_gemv2_q4_none_f16_r1k8w2d2p1n1b0", SM90)
    assert v.smem == rules_linear.parse("linear_gemv2_q4_none_f16_r1k8w2d2p1n1b0").smem(4, 2048) != base.smem
    assert v.grid == (2048 // 32, 1, 1) and v.block == (512, 1, 1)   # 2 warps along N of 16 rows each
    assert v.pdl is True and v.kernel.endswith("n1b0")
    assert plan_variants.swapped(base, base.kernel, SM90) is base


def test_rows_variant_gets_a_wave_of_blocks():
    args = (Arg("M", value=1), Arg("N", value=128256), Arg("K", value=2048))
    base = Launch("linear", "linear_gemv2_f16_none_f32_r2k1w4d3p2n0b0", (1002, 1, 1), (128, 1, 1), 1, args, pdl=True)
    v = plan_variants.swapped(base, "linear_rows_f16_none_f32_w16u8b2", SM90)
    assert (v.grid, v.block, v.smem, v.pdl) == ((SM90.num_sms * 2, 1, 1), (512, 1, 1), 2 * 2048 + 4 * 16, True)


def test_other_ops_take_the_shape_of_the_rule_that_chooses_the_symbol():
    """The one-block sampler in place of the cluster one: one block a row and no staged slice."""
    args = (Arg("M", value=2), Arg("V", value=128256), Arg("n_eos", value=1), Arg("max_out", value=9))
    base = Launch("sample", "sample_rows_c8", (16, 1, 1), (1024, 1, 1), 64512, args)
    v = plan_variants.swapped(base, "sample_rows_c1", SM90)
    assert (v.grid, v.block, v.smem, v.pdl) == ((2, 1, 1), (1024, 1, 1), 0, False)
