"""Which of an artifact's architectures runs on a GPU."""

from __future__ import annotations

from collections.abc import Mapping


def pick_arch(major: int, minor: int, archs: Mapping[str, bool]) -> str | None:
    """The arch whose plan runs on a GPU of compute capability ``major.minor``, or None.

    ``archs`` maps each arch of the artifact (``sm90``) to whether its kernels carry PTX. An exact
    match runs its SASS; otherwise the newest arch below the GPU that carries PTX runs, its kernels
    JIT-compiled by the driver (PTX of compute_XX runs on every later GPU).
    """
    sm = 10 * major + minor
    exact = f"sm{sm}"
    if exact in archs:
        return exact
    jit = sorted((int(a[2:]), a) for a, ptx in archs.items() if ptx and int(a[2:]) < sm)
    return jit[-1][1] if jit else None
