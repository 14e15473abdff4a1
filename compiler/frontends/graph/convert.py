"""Source graph -> raw IR, rule by rule: the driver of the pattern + check + rewrite split.

Nodes are visited in topological order. A node whose inputs are all side values (or that reads only
a shape) is a side value itself and emits nothing; otherwise each rule whose root op is the node's
op is tried: every match of its pattern (``pattern.py``) is offered to its ``check``, and the first
one accepted is handed to its ``rewrite``, which emits IR (``emit.RawIR``) and gives the root's
outputs their kinds (``kinds.py``). The nodes inside the match are consumed. A node no rule takes
stays pending: it may still be consumed by a later root's match (the inner nodes of an RMSNorm are
visited before the Mul that ends it). A check may also refuse for good: it raises
``UnsupportedModel`` naming the node (a mask that is not causal, an interleaved rotary embedding).

At the end, the graph's outputs must be the logits (an activation) and, optionally, the key/value
cache outputs the attention rules accounted for; otherwise the first node no rule covered on the
way to them is named, with what grokc expected to read there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from grokc.compiler.frontends.graph.emit import RawIR
from grokc.compiler.frontends.graph.kinds import Act, Past, Tokens
from grokc.compiler.frontends.graph.opgraph import OpGraph, OpNode
from grokc.compiler.frontends.graph.pattern import Either, Match, Op, Pattern, matches
from grokc.core.errors import UnsupportedModel


@dataclass(frozen=True)
class Rule:
    """``root`` matches at output ``out`` of a node of one of its root ops; ``check`` accepts a match
    (or raises a refusal), ``rewrite`` emits its IR and gives the root's outputs their kinds."""

    name: str
    root: Pattern
    check: Callable[[Match, "Conversion"], bool]
    rewrite: Callable[[Match, "Conversion"], None]
    out: int = 0


@dataclass(frozen=True)
class Inputs:
    """The roles of the graph's inputs (found by ``find_inputs``)."""

    tokens: str
    positions: str | None
    mask: str | None
    past: tuple[str, ...]


_ANY = "one of the patterns of a Llama-family decoder"
# What grokc reads after an activation of each view, for the message about a node no rule covers.
_EXPECTED = {
    "tokens": "an RMSNorm, a linear layer (MatMul or MatMulNBits with a constant weight), SiLU "
              "(x * Sigmoid(x)), the product or residual Add of two hidden states, a Reshape into heads or attention",
    "split": "a Transpose [0, 2, 1, 3] into heads, or a Reshape back to hidden states",
    "heads": "rotate-half RoPE (x * cos + cat(-x2, x1) * sin), a key/value-cache Concat, GQA's repeat "
             "(Unsqueeze, Expand, Reshape), a key transpose, or attention (MatMul, Softmax, MatMul)",
}


class Conversion:
    """The state of one conversion: kinds, side values, consumed nodes, the IR emitted so far."""

    def __init__(self, graph: OpGraph, inputs: Inputs):
        self.graph = graph
        self.inputs = inputs
        self.kinds: dict[str, object] = {inputs.tokens: Tokens(), **{p: Past(p) for p in inputs.past}}
        self.side: set[str] = {i for i in (inputs.positions, inputs.mask) if i}
        self.done: set[str] = set()                 # names of consumed nodes
        self.ir = RawIR()
        self.served: set[str] = set()               # graph outputs the attention rules account for
        self.kv_tensors: set[str] = set()           # IR tensors attentions read as keys or values
        self.notes: list[str] = []                  # what the build should say (weights re-quantized, ...)
        self._probe_cache: dict[tuple, np.ndarray] = {}
        self._known: set[str] = set()               # every op the rules' patterns mention

    # -- the pattern matcher's context --------------------------------------------------------------
    def kind(self, value: str):
        return self.kinds.get(value)

    def is_side(self, value: str) -> bool:
        return value in self.side or (value not in self.kinds and self.graph.is_const(value))

    def consumed(self, node: OpNode) -> bool:
        return node.name in self.done

    # -- helpers for rules ----------------------------------------------------------------------------
    def act(self, value: str) -> Act:
        kind = self.kinds[value]
        assert isinstance(kind, Act), (value, kind)
        return kind

    def refuse(self, node: OpNode, why: str) -> UnsupportedModel:
        return UnsupportedModel(f"{self.graph.source}: node {node.describe()} {why}")

    def probe(self, values: Sequence[str], seq: int, past: int, positions: np.ndarray | None = None) -> list[np.ndarray]:
        """``values`` (side values) when the graph runs ``seq`` new tokens after ``past`` cached ones
        (batch 1, an all-ones attention mask, positions ``past .. past+seq-1`` unless given)."""
        key = (tuple(values), seq, past, None if positions is None else tuple(positions))
        if key not in self._probe_cache:
            self._probe_cache[key] = self.graph.evaluate(values, self._feeds(seq, past, positions),
                                                         self._shapes(seq, past))
        return self._probe_cache[key]

    def _feeds(self, seq: int, past: int, positions: np.ndarray | None) -> dict[str, np.ndarray]:
        g, ins = self.graph, self.inputs
        dtype = lambda v: np.dtype(g.dtypes.get(v, "int64"))  # noqa: E731
        pos = np.arange(past, past + seq) if positions is None else np.asarray(positions)
        feeds = {ins.tokens: np.zeros((1, seq), dtype(ins.tokens))}
        if ins.positions:
            feeds[ins.positions] = pos[None].astype(dtype(ins.positions))
        if ins.mask:
            feeds[ins.mask] = np.ones((1, past + seq), dtype(ins.mask))
        for p in ins.past:
            shape = g.shape(p) or (1, 1, 0, 1)
            dims = [1 if i == 0 else past if i == 2 else d if isinstance(d, int) else 1 for i, d in enumerate(shape)]
            feeds[p] = np.zeros(dims, dtype(p) if p in g.dtypes else np.float32)
        return feeds

    def _shapes(self, seq: int, past: int) -> dict[str, tuple[int, ...]]:
        return {v: k.shape(seq, past) for v, k in self.kinds.items() if isinstance(k, Act)}

    # -- the loop -------------------------------------------------------------------------------------
    def run(self, rules: Sequence[Rule]) -> None:
        by_op: dict[str, list[Rule]] = {}
        self._known = set().union(*(_all_ops(r.root) for r in rules))
        for rule in rules:
            for op in _ops(rule.root):
                by_op.setdefault(op, []).append(rule)
        for node in self.graph.nodes:
            if node.name in self.done or all(o in self.kinds for o in node.outputs if o):
                continue
            if self._side_node(node):
                self.side.update(o for o in node.outputs if o)
                continue
            for rule in by_op.get(node.op, ()):
                if self._apply(rule, node):
                    break

    def _side_node(self, node: OpNode) -> bool:
        if node.op in ("Shape", "Size"):
            return True
        return all(not i or self.is_side(i) for i in node.inputs)

    def _apply(self, rule: Rule, node: OpNode) -> bool:
        if len(node.outputs) <= rule.out:
            return False
        value = node.outputs[rule.out]
        for m in matches(rule.root, value, self):
            if not _private(m, self.graph) or not rule.check(m, self):
                continue
            rule.rewrite(m, self)
            self.done.update(n.name for n in m.covered)
            return True
        return False

    # -- the end --------------------------------------------------------------------------------------
    def logits(self) -> str:
        """The IR tensor of the graph's logits; raises naming the first uncovered node otherwise."""
        outs = self.graph.outputs
        logits = [o for o in outs if o not in self.served and not self._uncached_kv(o)]
        if len(logits) == 1 and isinstance(self.kinds.get(logits[0]), Act):
            kind = self.act(logits[0])
            if kind.view == "tokens":
                return kind.tensor
        pending = [o for o in outs if o not in self.served and not isinstance(self.kinds.get(o), Act)]
        if pending:
            raise self._uncovered(pending)
        raise UnsupportedModel(f"{self.graph.source}: the graph has outputs {logits}; grokc expects the logits "
                               "[batch, seq, vocab] and, optionally, the present key/value caches")

    def _uncached_kv(self, value: str) -> bool:
        """A key or value an attention reads, returned as the cache of a graph without a past."""
        kind = self.kinds.get(value)
        return isinstance(kind, Act) and kind.view == "heads" and kind.repeat == 1 and kind.tensor in self.kv_tensors

    def _uncovered(self, outputs: list[str]) -> UnsupportedModel:
        g, known = self.graph, self._known
        cone, stack = [], list(outputs)
        seen: set[str] = set()
        while stack:
            node = g.producer(stack.pop())
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            if node.name not in self.done and not any(o in self.kinds or o in self.side for o in node.outputs if o):
                cone.append(node)
            stack.extend(i for i in node.inputs if i and i not in self.kinds and i not in self.side)
        order = {n.name: i for i, n in enumerate(g.nodes)}
        cone.sort(key=lambda n: order[n.name])
        if not cone:
            missing = next(o for o in outputs)
            return UnsupportedModel(f"{g.source}: graph output '{missing}' comes from no node grokc reads")
        culprit = next((n for n in cone if n.op not in known), cone[0])
        act = self._nearest_act(culprit)
        if act is not None:
            producer = g.producer(act)
            where = f" (it computes from {producer.describe()})" if producer else ""
            expected = _EXPECTED.get(self.act(act).view, _ANY)
        else:
            where, expected = "", _ANY
        return UnsupportedModel(f"{g.source}: node {culprit.describe()} matches no pattern grokc reads{where}; "
                                f"expected there: {expected}")

    def _nearest_act(self, node: OpNode) -> str | None:
        """The nearest activation ``node`` computes from (through nodes no rule covered)."""
        stack, seen = [node], set()
        while stack:
            n = stack.pop(0)
            for i in n.inputs:
                if isinstance(self.kinds.get(i), Act):
                    return i
                p = self.graph.producer(i) if i else None
                if p is not None and p.name not in seen and i not in self.side:
                    seen.add(p.name)
                    stack.append(p)
        return None


def find_inputs(graph: OpGraph) -> Inputs:
    """The roles of the graph inputs: the token ids (the indices an embedding Gather reads from a
    constant table), positions and attention mask (by their usual names), past caches (4-D floats)."""
    tokens = [i for i in graph.inputs if any(
        n.op in ("Gather", "GatherBlockQuantized") and len(n.inputs) > 1 and n.inputs[1] == i
        and graph.is_const(n.inputs[0]) for n in graph.consumers(i))]
    if len(tokens) != 1:
        raise UnsupportedModel(f"{graph.source}: no graph input is read as token ids by an embedding lookup "
                               f"(Gather of a constant table); inputs: {list(graph.inputs)}")
    roles: dict[str, str | None] = {"positions": None, "mask": None}
    past = []
    for i in graph.inputs:
        if i == tokens[0] or not graph.consumers(i):
            continue
        shape = graph.shape(i)
        if shape is not None and len(shape) == 4 and graph.dtypes.get(i, "").startswith("float"):
            past.append(i)
        elif "position" in i and roles["positions"] is None:
            roles["positions"] = i
        elif "mask" in i and roles["mask"] is None:
            roles["mask"] = i
        else:
            raise UnsupportedModel(f"{graph.source}: graph input '{i}' (shape {shape}) is neither token ids, "
                                   "positions, an attention mask nor a past key/value cache")
    return Inputs(tokens[0], roles["positions"], roles["mask"], tuple(past))


def _private(m: Match, g: OpGraph) -> bool:
    """Every value inside the match (not its root) is read only by nodes of the match."""
    inside = {n.name for n in m.covered}
    root = m.covered[0]
    for n in m.covered[1:]:
        for o in n.outputs:
            if o and (o in g.outputs or any(c.name not in inside for c in g.consumers(o))):
                return False
    return bool(root)


def _ops(p: Pattern) -> set[str]:
    if isinstance(p, Op):
        return set(p.op if isinstance(p.op, tuple) else (p.op,))
    if isinstance(p, Either):
        return set().union(*(_ops(o) for o in p.options))
    return set()


def _all_ops(p: Pattern) -> set[str]:
    if isinstance(p, Op):
        return _ops(p).union(*(_all_ops(i) for i in p.inputs)) if p.inputs else _ops(p)
    if isinstance(p, Either):
        return set().union(*(_all_ops(o) for o in p.options))
    return set()

