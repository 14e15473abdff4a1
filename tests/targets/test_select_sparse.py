"""Kernel choice for ``sparse_residual`` (targets/rules_sparse.py): rows of x per block, shared
memory within the 48 KiB a block gets without opting in, the unstaged fallback past that."""

import pytest

from grokc.targets import KernelCall, get_target, select
from grokc.targets.rules_sparse import STAGE_SMEM


def choose(m: int, nw: int, k: int):
    return select(KernelCall("sparse_residual", {}, {"M": m, "NW": nw, "K": k, "eps": 1e-5}), get_target("sm90"))


@pytest.mark.parametrize("m,k,kernel", [(1, 576, "sparse_residual_m1"), (3, 576, "sparse_residual_m4"),
                                        (8, 1536, "sparse_residual_m4"), (512, 576, "sparse_residual_m8"),
                                        (8, 2048, "sparse_residual_m4"), (4, 8192, "sparse_residual_m1"),
                                        (1, 12032, "sparse_residual_m1"), (1, 12033, "sparse_residual_g")])
def test_rows_per_block_fit_the_shared_memory(m, k, kernel):
    c = choose(m, 1000, k)
    assert c.kernel == kernel
    mt = 1 if kernel.endswith("_g") else int(kernel.removeprefix("sparse_residual_m"))
    assert c.grid == (-(-1000 // 64), -(-m // mt), 1) and c.block == (256, 1, 1)
    assert c.smem == (0 if kernel.endswith("_g") else mt * k * 4) <= STAGE_SMEM
    assert c.smem + 1024 <= 48 * 1024  # room for the static arrays without opting in
    assert not c.pdl
