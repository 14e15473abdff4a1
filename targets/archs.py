"""One description per GPU architecture grokc builds for.

The numbers are the architecture's limits (shared memory a block can opt into) and the SM count
of its reference data-center part, used only to size grids; a plan built for sm90 runs on any
sm_90 device.
"""

from __future__ import annotations

from grokc.core.errors import TargetError
from grokc.targets.base import Target

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm80", 80, smem_per_block=163 * 1024, num_sms=108),              # A100
        Target("sm86", 86, smem_per_block=99 * 1024, num_sms=84),                # A10, RTX 30xx
        Target("sm89", 89, smem_per_block=99 * 1024, num_sms=128),               # L40S, RTX 40xx
        Target("sm90", 90, smem_per_block=227 * 1024, num_sms=132, has_wgmma=True),  # H100, H200
        Target("sm100", 100, smem_per_block=227 * 1024, num_sms=148, ptx=True),  # B200
        Target("sm120", 120, smem_per_block=99 * 1024, num_sms=170, ptx=True),   # RTX 50xx
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
