"""One description per GPU architecture grokc builds for.

The numbers are the architecture's limits (shared memory a block can opt into) and the SM count
of its reference data-center part, used only to size grids; ``features`` are what its kernel rules
may ask for (``base.Feature``). A plan built for sm90 runs on any sm_90 device; the newest archs
also carry PTX, so a GPU newer than every arch of the build JIT-compiles their kernels. sm90 compiles
for sm_90a (``Target.arch_specific``): the prefill GEMM's wgmma exists there alone, and an sm_90a
cubin runs on every sm_90 device (H100, H200).
"""

from __future__ import annotations

from grokc.core.errors import TargetError
from grokc.targets.base import Feature, Target

_AMPERE = frozenset({Feature.MMA_F16})
_HOPPER = _AMPERE | {Feature.PDL, Feature.CLUSTERS, Feature.BULK_COPY, Feature.VECTOR_RED}

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm80", 80, 163 * 1024, 108, _AMPERE),             # A100
        Target("sm86", 86, 99 * 1024, 84, _AMPERE),               # A10, RTX 30xx
        Target("sm89", 89, 99 * 1024, 128, _AMPERE),              # L40S, RTX 40xx
        Target("sm90", 90, 227 * 1024, 132, _HOPPER | {Feature.WGMMA}, arch_specific=True),  # H100, H200: sm_90a
        Target("sm100", 100, 227 * 1024, 148, _HOPPER, ptx=True),  # B200; PTX for sm_103 and later
        Target("sm120", 120, 99 * 1024, 170, _HOPPER, ptx=True),   # RTX 50xx; PTX for sm_121 and later
    )
}


def get_target(name: str) -> Target:
    """The target called ``name`` (``sm90`` or ``sm_90``), or a one-line TargetError."""
    key = name.strip().lower().replace("sm_", "sm")
    if key not in TARGETS:
        raise TargetError(
            f"unknown --arch '{name}'; supported: {', '.join(TARGETS)} (e.g. --arch sm90 for H100/H200)"
        )
    return TARGETS[key]
