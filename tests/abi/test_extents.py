"""The plan check's memory extents (abi/extents.py) cover the whole kernel ABI (abi/ops.py): every
op has a rule and every pointer parameter an extent, so a new op or pointer cannot pass unchecked
or make every plan that uses it fail to load."""

import pytest

from grokc.abi.extents import extents
from grokc.abi.ops import KERNEL_ABI, KERNEL_VARIANTS, ArgKind

# small scalars every op accepts (heads divide, head_dim even, a prefill fits its blocks)
SCALARS = {"n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "max_blocks": 4, "L": 8, "fill": 1, "part": 0,
           "group_size": 0, "hidden": 64, "inter": 128}


@pytest.mark.parametrize("op", sorted(KERNEL_ABI))
def test_every_pointer_of_every_op_has_an_extent(op):
    scalars = {p.name: SCALARS.get(p.name, 2) for p in KERNEL_ABI[op] if p.kind is not ArgKind.PTR}
    pointers = {p.name for p in KERNEL_ABI[op] if p.kind is ArgKind.PTR}
    variants = [{}] + [{key: v} for key, values in KERNEL_VARIANTS.get(op, {}).items() for v in values]
    for attrs in variants:
        touched = extents(op, scalars, attrs)
        assert set(touched) == pointers, (op, attrs)
        assert all(e.elements >= 0 for e in touched.values())


def test_a_gated_linear_reads_twice_the_rows():
    s = {"M": 1, "N": 16, "K": 32, "group_size": 0}
    for act in ("silu_mul", "gelu_tanh_mul"):
        gated = extents("linear", s, {"act": act, "weight_format": "f16"})
        assert gated["weight"].elements == 2 * 16 * 32 and gated["bias"].elements == 32
    assert extents("linear", s, {"act": "none", "weight_format": "f16"})["weight"].elements == 16 * 32
