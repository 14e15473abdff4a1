"""Kernel selection: one ordered rule list per op, assembled from the rule modules.

Each rule module (``rules_linear``, ``rules_attention``, ``rules_misc``) exports

- ``RULES``: op -> rules in order, fallback last; a rule is ``(KernelCall, Target) ->
  KernelChoice | None`` and answers None when it does not apply;
- ``HEADERS``: the files under ``targets/kernels/`` its kernel sources need;
- ``kernel_source(symbol)``: the C++ defining the ``extern "C"`` entry point ``symbol``, or None
  when the symbol is not one of its kernels;
- optionally ``PDL_ENTRY = True``: every kernel of the module starts with ``grokc_pdl_entry()``
  (``kernels/pdl.cuh``), so on sm_90+ its launches get ``KernelChoice.pdl`` (a rule may also set
  ``pdl`` itself for kernels that place the wait later).

``select`` is the one place a kernel is chosen (dlight's ``ApplyDefaultSchedule`` order: the first
rule that answers wins); ``nvcc.build_cubin`` asks ``owner`` which module's headers and source a
symbol needs.
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType

from grokc.artifacts.errors import TargetError, UnsupportedOp

from . import rules_attention, rules_linear, rules_misc, rules_synthetic
from .base import KernelCall, KernelChoice, KernelRule, Target

MODULES: tuple[ModuleType, ...] = (rules_linear, rules_attention, rules_misc, rules_synthetic)


def _assemble() -> tuple[dict[str, list[KernelRule]], dict[str, ModuleType]]:
    rules: dict[str, list[KernelRule]] = {}
    owners: dict[str, ModuleType] = {}
    for mod in MODULES:
        for op, op_rules in mod.RULES.items():
            if op in rules:  # an op has exactly one owner, so its order is decided in one file
                raise ImportError(f"op {op!r} has rules in two modules (second: {mod.__name__})")
            rules[op], owners[op] = list(op_rules), mod
    return rules, owners


RULES, OP_OWNER = _assemble()


def select(call: KernelCall, target: Target) -> KernelChoice:
    """The first rule of ``RULES[call.op]`` that answers for this call on this target."""
    rules = RULES.get(call.op)
    if not rules:
        raise UnsupportedOp(f"no kernel rules for op '{call.op}'; known ops: {', '.join(sorted(RULES))}")
    for rule in rules:
        choice = rule(call, target)
        if choice is not None:
            if getattr(OP_OWNER[call.op], "PDL_ENTRY", False) and target.has_pdl:
                choice = replace(choice, pdl=True)   # every kernel of that module starts with grokc_pdl_entry
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
    raise TargetError(f"unknown kernel symbol '{symbol}'; no rule module (linear, attention, misc, synthetic) defines it")
