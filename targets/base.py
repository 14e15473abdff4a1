"""What a GPU architecture is to grokc, and how a kernel is chosen for a launch.

A ``Target`` is data: the SM version nvcc compiles for and the limits kernel rules respect.
A ``KernelRule`` looks at one ``KernelCall`` (an op of ``artifacts.kernel_abi`` with its variant
attributes and scalar dimensions) and returns a ``KernelChoice`` or ``None`` when it does not
apply. Each op has an ordered list of rules ending in a fallback; the first rule that answers
wins (dlight's ``ApplyDefaultSchedule`` order). Selection happens once, in ``targets.select``,
and its result (rule name, kernel symbol, launch shape) is written into the plan so
``grokc inspect`` can explain it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from grokc.abi.ops import KERNEL_ABI, ArgKind


@dataclass(frozen=True)
class Target:
    name: str                 # "sm90"
    sm: int                   # 90
    smem_per_block: int       # bytes of shared memory a block may opt into
    num_sms: int              # multiprocessors of the reference part (for grid sizing)
    has_wgmma: bool = False   # sm_90a warpgroup MMA
    ptx: bool = False         # also embed PTX for forward compatibility

    @property
    def nvcc_arch(self) -> str:
        return f"sm_{self.sm}"

    @property
    def has_pdl(self) -> bool:
        """Programmatic dependent launch (``griddepcontrol``) exists from sm_90 on."""
        return self.sm >= 90


@dataclass(frozen=True)
class KernelCall:
    """One launch to place: the op, its variant attributes and every scalar parameter's value."""

    op: str
    attrs: dict[str, str] = field(default_factory=dict)
    dims: dict[str, int | float] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelChoice:
    kernel: str                       # symbol in the arch's cubin
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int                         # dynamic shared memory, bytes
    rule: str                         # the rule that chose it
    pdl: bool = False                 # the kernel starts with griddepcontrol (kernels/pdl.cuh): the
                                      # launch before it may overlap its start (programmatic edge)


KernelRule = Callable[[KernelCall, Target], Optional[KernelChoice]]


def c_params(op: str, ptr_types: Mapping[str, str]) -> tuple[str, str]:
    """``(declaration list, argument list)`` of ``KERNEL_ABI[op]`` in C; pointers typed by ``ptr_types``."""
    decl, names = [], []
    for p in KERNEL_ABI[op]:
        ctype = ptr_types[p.name] if p.kind is ArgKind.PTR else ("int" if p.kind is ArgKind.I32 else "float")
        decl.append(f"{ctype} {p.name}")
        names.append(p.name)
    return ", ".join(decl), ", ".join(names)
