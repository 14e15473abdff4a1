"""The pattern half of the rules (TVM's dataflow patterns, pared down to what LLM graphs need).

A pattern describes the subgraph that produces one value, read from that value up through its
producers:

- ``Op(op, *inputs)``: the value is output ``out`` of a node of that op (one of several ops when
  ``op`` is a tuple) whose first ``len(inputs)`` inputs match ``inputs``; any further node inputs
  must be side values (shapes, constants: never activations). ``commute=True`` also tries the two
  inputs swapped; ``where`` is a predicate on the node (attributes); ``name`` binds the node.
- ``Var(name, kinds)``: any value that already has an abstract kind (``kinds.py``) of one of the
  given classes (any kind when none are given); the same name twice must be the same value.
- ``Const(name, test)``: a constant value (an initializer or something computed from them), bound
  by name to the value; ``test`` is a predicate on its array.
- ``Side(name)``: a value computed from the graph's inputs other than the tokens (shapes, positions,
  the attention mask) or from constants: causal masks, cos/sin tables, sequence lengths.
- ``Anything(name)``: any value at all, an absent optional input ("") included, bound by name.
- ``Either(*options)``: the first option that matches (each is tried, in order, with backtracking).
- ``opt(op, inner, ...)``: ``inner`` with or without one ``op`` node around it (casts, no-op slices).

A node inside a match (every ``Op`` below the root) must not have a kind of its own: the values
with kinds are the match's leaves. ``matches`` yields every way the pattern matches a value; the
rule's check picks the first it accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from grokc.compiler.frontends.graph.opgraph import OpNode


class Pattern:
    pass


@dataclass(frozen=True)
class Op(Pattern):
    op: str | tuple[str, ...]
    inputs: tuple[Pattern, ...] = ()
    name: str | None = None
    where: Callable[[OpNode], bool] | None = None
    commute: bool = False
    out: int = 0

    def __init__(self, op, *inputs, name=None, where=None, commute=False, out=0):
        for k, v in (("op", op), ("inputs", tuple(inputs)), ("name", name), ("where", where),
                     ("commute", commute), ("out", out)):
            object.__setattr__(self, k, v)


@dataclass(frozen=True)
class Var(Pattern):
    name: str
    kinds: tuple[type, ...] = ()

    def __init__(self, name, *kinds):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "kinds", tuple(kinds))


@dataclass(frozen=True)
class Const(Pattern):
    name: str | None = None
    test: Callable[[np.ndarray], bool] | None = None


@dataclass(frozen=True)
class Side(Pattern):
    name: str | None = None


@dataclass(frozen=True)
class Anything(Pattern):
    name: str | None = None


@dataclass(frozen=True)
class Either(Pattern):
    options: tuple[Pattern, ...]

    def __init__(self, *options):
        object.__setattr__(self, "options", tuple(options))


def opt(op: str | tuple[str, ...], inner: Pattern, *rest: Pattern, where=None, commute=False) -> Pattern:
    """``inner``, or ``op(inner, *rest)`` around it."""
    return Either(Op(op, inner, *rest, where=where, commute=commute), inner)


def scalar(value: float, rel: float = 1e-6) -> Callable[[np.ndarray], bool]:
    """A ``Const`` test: a one-element array equal to ``value`` within ``rel``."""
    return lambda a: a.size == 1 and abs(float(a.reshape(-1)[0]) - value) <= rel * max(1.0, abs(value))


@dataclass(frozen=True)
class Match:
    values: dict[str, str] = field(default_factory=dict)     # Var / Const / Side name -> value
    nodes: dict[str, OpNode] = field(default_factory=dict)   # Op name -> node
    covered: tuple[OpNode, ...] = ()                         # every node the match consumes

    def bind(self, name: str | None, value: str) -> "Match | None":
        if name is None:
            return self
        if name in self.values:
            return self if self.values[name] == value else None
        return Match({**self.values, name: value}, self.nodes, self.covered)

    def with_node(self, name: str | None, node: OpNode) -> "Match":
        nodes = {**self.nodes, name: node} if name else self.nodes
        covered = self.covered if node in self.covered else (*self.covered, node)
        return Match(self.values, nodes, covered)


class Context(Protocol):
    """What matching needs of the conversion (``convert.Conversion``)."""

    graph: Any

    def kind(self, value: str) -> Any: ...

    def is_side(self, value: str) -> bool: ...

    def consumed(self, node: OpNode) -> bool: ...


def matches(p: Pattern, value: str, ctx: Context, root: bool = True) -> Iterator[Match]:
    """Every match of ``p`` against ``value`` (``root``: the value's node is the match's root, which
    may not have a kind yet)."""
    yield from _match(p, value, ctx, Match(), root)


def _match(p: Pattern, value: str, ctx: Context, m: Match, root: bool = False) -> Iterator[Match]:
    if isinstance(p, Var):
        kind = ctx.kind(value)
        if kind is not None and (not p.kinds or isinstance(kind, p.kinds)):
            bound = m.bind(p.name, value)
            if bound is not None:
                yield bound
    elif isinstance(p, Const):
        array = ctx.graph.const(value)
        if array is not None and (p.test is None or p.test(array)):
            bound = m.bind(p.name, value)
            if bound is not None:
                yield bound
    elif isinstance(p, Side):
        if ctx.is_side(value):
            bound = m.bind(p.name, value)
            if bound is not None:
                yield bound
    elif isinstance(p, Anything):
        bound = m.bind(p.name, value)
        if bound is not None:
            yield bound
    elif isinstance(p, Either):
        for option in p.options:
            yield from _match(option, value, ctx, m, root)
    elif isinstance(p, Op):
        yield from _match_op(p, value, ctx, m, root)
    else:
        raise TypeError(p)


def _match_op(p: Op, value: str, ctx: Context, m: Match, root: bool) -> Iterator[Match]:
    node = ctx.graph.producer(value)
    ops = p.op if isinstance(p.op, tuple) else (p.op,)
    if node is None or node.op not in ops or len(node.outputs) <= p.out or node.outputs[p.out] != value:
        return
    if ctx.consumed(node) or (not root and any(ctx.kind(o) is not None for o in node.outputs if o)):
        return
    if len(node.inputs) < len(p.inputs) or (p.where is not None and not p.where(node)):
        return
    if any(i and not ctx.is_side(i) for i in node.inputs[len(p.inputs):]):
        return
    m = m.with_node(p.name, node)
    orders = [node.inputs[:len(p.inputs)]]
    if p.commute and len(p.inputs) == 2:
        orders.append(orders[0][::-1])
    for order in orders:
        yield from _match_all(p.inputs, order, ctx, m)


def _match_all(patterns: tuple[Pattern, ...], values: tuple[str, ...], ctx: Context, m: Match) -> Iterator[Match]:
    if not patterns:
        yield m
        return
    for first in _match(patterns[0], values[0], ctx, m):
        yield from _match_all(patterns[1:], values[1:], ctx, first)
