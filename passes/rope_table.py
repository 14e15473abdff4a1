"""RoPE as lookup tables, one per RoPE of the model.

What: every node that reads a frequency parameter (``inv_freq``: the fused attention) also gets
the input ``rope_table``: f32 ``[length, head_dim/2, 2]`` of ``(cos, sin)`` computed in float64
with that RoPE's scaling (``core/rope.py``, which also names the parameters: ``rope_inv_freq`` ->
``rope_table``, and a second pair for models whose local layers have their own RoPE) and rounded
once to f32. A longrope table switches from the short to the long factors at
``original_max_position_embeddings``, position by position (``core/rope.py`` says how that
compares with transformers). ``inv_freq`` is recomputed from the same float64 values
(``compiler/models/transformer.py``): kernels compute positions at or past ``length`` on the fly
from it (``mscale * cos(p * inv_freq)``), never reading out of bounds.

Requires: fused attention nodes (``passes/fuse_attention.py``).
Guarantees: ``meta.rope`` records, per table, its parameter, its frequencies' parameter, the table
length, ``mscale``, the RoPE config and the table's SHA-256; graph structure is otherwise
unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from grokc.core import rope as rope_math
from grokc.core.ir import Module, Node, frozen_array
from grokc.core.meta import RopeTable
from grokc.passes._graph import rebuild_graph, rebuild_module

TABLE = rope_math.TABLES[rope_math.INV_FREQ]


@dataclass(frozen=True)
class RopeTableConfig:
    length: int  # positions covered by the table (normally the artifact's max sequence length)


def run(module: Module, cfg: RopeTableConfig) -> Module:
    c = module.config
    read = {n.inputs["inv_freq"] for g in module.graphs.values() for n in g.nodes if "inv_freq" in n.inputs}
    tables, records = {}, []
    for freqs, rope in rope_math.ropes(c).items():
        if freqs not in read:
            continue
        name = rope_math.TABLES[freqs]
        tables[name] = frozen_array(rope_math.table(rope, c.head_dim, cfg.length))
        records.append(RopeTable(name, freqs, rope, cfg.length, rope_math.inv_freq(rope, c.head_dim)[1],
                                 hashlib.sha256(tables[name].tobytes()).hexdigest()))
    graphs = {
        gname: rebuild_graph(g, [
            Node(n.op, n.name, {**n.inputs, "rope_table": rope_math.TABLES[n.inputs["inv_freq"]]}, n.outputs, n.attrs)
            if "inv_freq" in n.inputs else n
            for n in g.nodes
        ])
        for gname, g in module.graphs.items()
    }
    return rebuild_module(module, graphs, tables, meta=replace(module.meta, rope=tuple(records)))
