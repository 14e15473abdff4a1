"""The IR the rules emit before it has canonical names (``canonical.py`` renames it).

``RawIR`` collects IR nodes in the order the rules emit them, each remembering the source node it
came from (for messages), the parameters they read (f32 arrays under provisional names), the int4
grids of weights the source stored quantized, and the RoPE frequencies each ROPE node applies. A
linear layer's bias joins its LINEAR node (``add_bias``) wherever the source adds it; which
linears may have one is ``canonical.py``'s to say.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from grokc.compiler.frontends.graph.opgraph import OpNode
from grokc.core.ir import Attrs, DType, LinearAttrs, NoAttrs, Node, OpKind, TensorType
from grokc.core.meta import CarriedInt4


@dataclass(frozen=True)
class RopeFreqs:
    """The rotation a ROPE node applies: angle ``p * inv_freq[i]``, cos and sin times ``mscale``."""

    inv_freq: np.ndarray   # f64 [head_dim / 2]
    mscale: float


@dataclass
class RawIR:
    nodes: list[Node] = field(default_factory=list)
    types: dict[str, TensorType] = field(default_factory=dict)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    carried: dict[str, CarriedInt4] = field(default_factory=dict)    # param name -> its grid
    source: dict[str, OpNode] = field(default_factory=dict)          # IR node name -> source node
    rope: dict[str, RopeFreqs] = field(default_factory=dict)         # ROPE node name -> frequencies

    def param(self, name: str, array: np.ndarray, grid: CarriedInt4 | None = None) -> str:
        """Register a parameter (f32, C-contiguous) under ``name`` (the first registration wins)."""
        if name not in self.params:
            a = np.ascontiguousarray(array, dtype=np.float32)
            a.flags.writeable = False
            self.params[name] = a
            if grid is not None:
                self.carried[name] = grid
        return name

    def add(self, op: OpKind, inputs: dict[str, str], channels: int, source: OpNode, attrs: Attrs = NoAttrs(),
            suffix: str = "") -> str:
        """Emit one node (output ``[T, channels]`` f16) named after its source node; returns its output."""
        name = source.name + suffix
        assert name not in self.types, f"{name} emitted twice"
        self.nodes.append(Node(op, name, inputs, (name,), attrs))
        self.types[name] = TensorType(("T", channels), DType.F16)
        self.source[name] = source
        return name

    def producer(self, tensor: str) -> Node | None:
        return next((n for n in self.nodes if n.outputs[0] == tensor), None)

    def linear(self, tensor: str) -> Node | None:
        """The LINEAR node producing ``tensor``, None when another op does."""
        node = self.producer(tensor)
        return node if node is not None and node.op is OpKind.LINEAR else None

    def add_bias(self, tensor: str, bias: np.ndarray, name: str, source: OpNode) -> None:
        """Give the LINEAR producing ``tensor`` (none yet) the bias ``bias [N]`` under the provisional
        name ``name``; ``source`` (the Add, or the node with the bias input) is then what it stands for."""
        node = self.linear(tensor)
        assert node is not None and "bias" not in node.inputs
        self.nodes[self.nodes.index(node)] = replace(node, inputs={**node.inputs, "bias": self.param(name, bias)})
        self.source[node.name] = source

    def split_linear(self, tensor: str, rows: list[int], source: OpNode) -> list[str]:
        """Replace the LINEAR producing ``tensor`` by one LINEAR per block of ``rows`` output rows (a
        packed q/k/v projection, its bias split the same way); returns their outputs."""
        node = self.linear(tensor)
        assert node is not None and node.attrs == LinearAttrs()
        w = self.params[node.inputs["weight"]]
        bias = node.inputs.get("bias")
        grid = self.carried.get(node.inputs["weight"])
        at = self.nodes.index(node)
        outs, start = [], 0
        for j, n in enumerate(rows):
            part = f"{node.inputs['weight']}[{start}:{start + n}]"
            sub = None if grid is None else replace(
                grid, scales=grid.scales[start:start + n], zeros=None if grid.zeros is None else grid.zeros[start:start + n])
            self.param(part, w[start:start + n], sub)
            inputs = {"x": node.inputs["x"], "weight": part}
            if bias is not None:
                inputs["bias"] = self.param(f"{bias}[{start}:{start + n}]", self.params[bias][start:start + n])
            name = f"{node.name}/{j}"
            self.nodes.insert(at + j, Node(OpKind.LINEAR, name, inputs, (name,), LinearAttrs()))
            self.types[name] = TensorType(("T", n), DType.F16)
            self.source[name] = self.source[node.name]
            outs.append(name)
            start += n
        self.nodes.remove(node)
        return outs
