"""Kernel selection: one ordered rule list per op, assembled from the rule modules.

Each rule module (``rules_linear``, ``rules_attention``, ``rules_misc``, ``rules_sparse``) exports

- ``RULES``: op -> rules in order, fallback last; a rule is ``(KernelCall, Target) ->
  KernelChoice | None`` and answers None when it does not apply;
- ``HEADERS``: the files under ``targets/kernels/`` its kernel sources need;
- ``kernel_source(symbol)``: the C++ defining the ``extern "C"`` entry point ``symbol``, or None
  when the symbol is not one of its kernels;
A rule sets ``KernelChoice.pdl`` when its kernel should be joined to the launch before it by a
programmatic edge (sm_90+). Every grokc kernel waits before reading its inputs and triggers its dependents at entry
(gemv2 tilings marked ``t1``: right after that wait), so any
edge may be programmatic; which ones are is a measured choice. On the H200 the GEMVs gain (they
prefetch weights before the wait), and decode attention from 2 slots on (it prefetches its cache
blocks before the wait); programmatic edges into sampling or the embedding, or into attention
at batch 1, let their blocks take SMs early and slowed a Llama-1B decode step (560 vs 548 us).

``select`` is the one place a kernel is chosen (dlight's ``ApplyDefaultSchedule`` order: the first
rule that answers wins); ``nvcc.build_kernels`` asks ``owner`` which module's headers and source a
symbol needs.
"""

from __future__ import annotations

from types import ModuleType

from grokc.core.errors import TargetError, UnsupportedOp
from grokc.targets import (
    rules_attention,
    rules_linear,
    rules_misc,
    rules_mlp,
    rules_moe,
    rules_sparse,
    rules_synthetic,
    rules_tvm,
)
from grokc.targets.base import KernelCall, KernelChoice, KernelRule, Target

# rules_tvm last: its header (TVM's prelude, which defines ``uint``) comes after everyone else's
MODULES: tuple[ModuleType, ...] = (rules_linear, rules_attention, rules_misc, rules_mlp, rules_sparse, rules_synthetic,
                                   rules_moe, rules_tvm)


def _assemble() -> dict[str, list[KernelRule]]:
    rules: dict[str, list[KernelRule]] = {}
    for mod in MODULES:
        for op, op_rules in mod.RULES.items():
            if op in rules:  # an op has exactly one owner, so its order is decided in one file
                raise ImportError(f"op {op!r} has rules in two modules (second: {mod.__name__})")
            rules[op] = list(op_rules)
    return rules


RULES: dict[str, list[KernelRule]] = _assemble()


def select(call: KernelCall, target: Target) -> KernelChoice:
    """The first rule of ``RULES[call.op]`` that answers for this call on this target."""
    rules = RULES.get(call.op)
    if not rules:
        raise UnsupportedOp(f"no kernel rules for op '{call.op}'; known ops: {', '.join(sorted(RULES))}")
    for rule in rules:
        choice = rule(call, target)
        if choice is not None:
            return choice
    raise UnsupportedOp(
        f"no kernel for op '{call.op}' with attrs {dict(call.attrs)} and dims {dict(call.dims)} on {target.name}; "
        "the attributes or dimensions are outside what the op's fallback kernel accepts"
    )


def owner(symbol: str) -> tuple[ModuleType, str]:
    """The rule module that defines kernel ``symbol``, and the symbol's C++ source."""
    for mod in MODULES:
        src = mod.kernel_source(symbol)
        if src is not None:
            return mod, src
    raise TargetError(f"unknown kernel symbol '{symbol}'; no rule module (linear, attention, misc, sparse, synthetic, moe, tvm) defines it")
