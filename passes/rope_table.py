"""RoPE as a lookup table.

What: every node that reads the ``inv_freq`` parameter (the fused attention) also gets the input
``rope_table``: f32 ``[length, head_dim/2, 2]`` of ``(cos, sin)`` computed in float64 with the
model's rope scaling (``compiler/rope.py``) and rounded once to f32. ``inv_freq`` is recomputed
from the same float64 values (``compiler/models/llama.py``): kernels compute positions at or past ``length`` on the fly from it
(``mscale * cos(p * inv_freq)``), never reading out of bounds.

Requires: fused attention nodes (``passes/fuse_attention.py``).
Guarantees: ``meta.rope`` records the table length, ``mscale``, the RoPE config and the
table's SHA-256; graph structure is otherwise unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from grokc.core import rope as rope_math
from grokc.core.ir import Module, Node, frozen_array
from grokc.core.meta import RopeTable
from grokc.passes._graph import rebuild_graph, rebuild_module

TABLE = "rope_table"


@dataclass(frozen=True)
class RopeTableConfig:
    length: int  # positions covered by the table (normally the artifact's max sequence length)


def run(module: Module, cfg: RopeTableConfig) -> Module:
    c = module.config
    mscale = rope_math.inv_freq(c.rope, c.head_dim)[1]
    table = frozen_array(rope_math.table(c.rope, c.head_dim, cfg.length))
    graphs = {
        name: rebuild_graph(g, [
            Node(n.op, n.name, {**n.inputs, "rope_table": TABLE}, n.outputs, n.attrs) if "inv_freq" in n.inputs else n
            for n in g.nodes
        ])
        for name, g in module.graphs.items()
    }
    record = RopeTable(c.rope, cfg.length, mscale, hashlib.sha256(table.tobytes()).hexdigest())
    return rebuild_module(module, graphs, {TABLE: table}, meta=replace(module.meta, rope=record))
