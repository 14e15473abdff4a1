"""The source graph the pattern rules read: an ONNX graph or a torch.export program, in one vocabulary.

Ops are named as ONNX names them (``MatMul``, ``Reshape``, ``Softmax``, ...; contrib ops without
their domain: ``MatMulNBits``, ``GroupQueryAttention``, ``SkipSimplifiedLayerNormalization``). A
torch.export graph is translated into the same names where the op is the same, plus the ATen ops
that have no single ONNX op: ``Linear`` (x, weight ``[N, K]``, bias), ``Rsqrt``, ``Silu``, ``SDPA``
(``scaled_dot_product_attention``: q, k, v, mask) and ``Size`` (``sym_size``). Each reader puts
what it normalised into ``attrs`` (``perm``, ``axes``, ``axis``, ...); ``source_op`` keeps the op
as the source spells it, for messages.

Values are named by strings ("" is an absent optional input). ``shapes`` holds what the source
knows of each value's shape, symbolic dimensions as strings; ``constants`` the initializers
(parameters and buffers of a torch program). ``evaluate`` runs part of the graph on concrete
inputs: the checks use it for values computed from shapes, positions and the attention mask
(``checks.py``), and ``const`` for values computed from constants alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Shape = tuple  # of int | str (a symbolic dimension)

# (values, feeds: graph input -> array, shapes: value -> concrete shape to assume for it) -> arrays
Evaluator = Callable[[Sequence[str], Mapping[str, np.ndarray], Mapping[str, tuple]], list]


@dataclass(frozen=True)
class OpNode:
    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    source_op: str

    def describe(self) -> str:
        """How messages name the node: ``'node_Erf_12' (Erf)``."""
        return f"'{self.name}' ({self.source_op})"


@dataclass
class OpGraph:
    nodes: tuple[OpNode, ...]                 # topological order
    inputs: tuple[str, ...]                   # per-call graph inputs
    outputs: tuple[str, ...]
    shapes: Mapping[str, Shape | None]
    dtypes: Mapping[str, str]                 # numpy dtype names, where known
    constants: Mapping[str, np.ndarray]
    evaluate: Evaluator
    source: str                               # the file, for messages
    _producer: dict[str, OpNode] = field(default_factory=dict, repr=False)
    _consumers: dict[str, list[OpNode]] = field(default_factory=dict, repr=False)
    _folded: dict[str, np.ndarray | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for n in self.nodes:
            for o in n.outputs:
                if o:
                    self._producer[o] = n
            for i in n.inputs:
                if i:
                    self._consumers.setdefault(i, []).append(n)

    def producer(self, value: str) -> OpNode | None:
        return self._producer.get(value)

    def consumers(self, value: str) -> list[OpNode]:
        return self._consumers.get(value, [])

    def shape(self, value: str) -> Shape | None:
        return self.shapes.get(value)

    def is_const(self, value: str) -> bool:
        """True when ``value`` is an initializer or computed from initializers alone."""
        return self.const(value) is not None

    def const(self, value: str) -> np.ndarray | None:
        """The array of an initializer, or of a value computed from initializers alone (evaluated once)."""
        if not value:
            return None
        if value in self.constants:
            return self.constants[value]
        if value not in self._folded:
            self._folded[value] = None   # a cycle guard while its inputs are looked at
            node = self.producer(value)
            if node is not None and node.op not in _NEVER_CONST and all(
                    not i or self.const(i) is not None for i in node.inputs):
                self._folded[value] = np.asarray(self.evaluate([value], {}, {})[0])
        return self._folded[value]


# Ops whose output is never a constant even when every input is (they read the graph's inputs' shapes).
_NEVER_CONST = frozenset({"Shape", "Size"})
