"""GPU targets: architecture descriptions, kernel selection rules, and the nvcc step.

Public API::

    get_target(name) -> Target              # "sm90"
    select(call, target) -> KernelChoice    # first matching rule of the op's ordered list
    build_kernels(kernels, target) -> bytes   # compile exactly these kernel symbols for the arch

Builds on a machine with no GPU: only nvcc is needed.
"""

from grokc.targets.archs import TARGETS, get_target
from grokc.targets.base import KernelCall, KernelChoice, Target
from grokc.targets.nvcc import build_kernels
from grokc.targets.select import select

__all__ = ["TARGETS", "get_target", "Target", "KernelCall", "KernelChoice", "select", "build_kernels"]
