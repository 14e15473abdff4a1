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

import enum
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from grokc.abi.ops import KERNEL_ABI, ArgKind


class Feature(enum.Enum):
    """Hardware features a kernel rule may need; each target lists the ones it has."""

    MMA_F16 = "mma.sync.m16n8k16 with f16 operands and f32 accumulators"          # sm_80+
    PDL = "programmatic dependent launch (griddepcontrol)"                        # sm_90+
    CLUSTERS = "thread-block clusters and distributed shared memory"             # sm_90+
    BULK_COPY = "cp.async.bulk global->shared copies completing on an mbarrier"   # sm_90+
    VECTOR_RED = "red.global.add.v4.f32 vector reductions"                        # sm_90+
    WGMMA = "warpgroup MMA (wgmma.mma_async) from shared-memory descriptors"     # sm_90a only


@dataclass(frozen=True)
class Target:
    name: str                        # "sm90"
    sm: int                          # 90: the SASS nvcc compiles (sm_90) and the devices that run it
    smem_per_block: int              # bytes of shared memory a block may opt into
    num_sms: int                     # multiprocessors of the reference part (for grid sizing)
    features: frozenset[Feature]
    ptx: bool = False                # also embed PTX, which newer GPUs JIT-compile (nvcc.py)
    # a deterministic build's constraint on the rules: only kernels whose results do not depend on
    # the order blocks or warps finish in (no atomics, no split-K sums added in any order)
    deterministic: bool = False
    # where Apache TVM's kernels come first (rules_tvm): "auto", the rule lists' measured order, or
    # "tvm", wherever one covers the call (``grokc build --kernels tvm``)
    kernels: str = "auto"
    # compile for the arch-specific variant (sm_90a): its instructions (wgmma) run on that SM
    # version alone, so such a target cannot also carry PTX for newer GPUs
    arch_specific: bool = False

    @property
    def nvcc_arch(self) -> str:
        return f"sm_{self.sm}{'a' if self.arch_specific else ''}"

    def has(self, feature: Feature) -> bool:
        return feature in self.features


@dataclass(frozen=True)
class KernelCall:
    """One launch to place: the op, its variant attributes and every scalar parameter's value."""

    op: str
    attrs: dict[str, str] = field(default_factory=dict)
    dims: dict[str, int | float] = field(default_factory=dict)
    # the optional pointer parameters the launch passes as null; a rule whose kernel cannot take one
    # of the others must treat it as given (lowering fills this in)
    nulls: frozenset[str] = frozenset()


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
