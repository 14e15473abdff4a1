"""Memory planning: one arena, every buffer at a fixed offset, scratch reused by liveness.

What: state buffers (per-step inputs and the KV cache) are laid out first, each at a fixed
offset; then each graph's intermediates are placed in a scratch region that starts after them.
Inside a graph, a tensor lives from the node that produces it to its last reader (graph outputs
to the end); a best-fit free list reuses the space of dead tensors, so the scratch region is
about the graph's peak live size rather than the sum of its tensors. Graphs never run at the same
time, so all of them share one scratch region, sized by the largest.

Requires: static shapes (``passes/static_shapes.py``).
Guarantees: ``meta.memory`` is a ``MemoryPlan`` (``core/meta.py``); every buffer is ``ARENA_ALIGN``-aligned;
a node's outputs never overlap its inputs or any tensor live at the same time. Pure and
deterministic (placement depends only on node order and sizes).
"""

from __future__ import annotations

from dataclasses import replace

from grokc.artifacts.plan import ARENA_ALIGN
from grokc.core.ir import Graph, Module
from grokc.core.meta import MemoryPlan, Placement


def _align(n: int) -> int:
    return -(-n // ARENA_ALIGN) * ARENA_ALIGN


def run(module: Module) -> Module:
    state: dict[str, Placement] = {}
    top = 0
    for name, t in module.state.items():
        state[name] = Placement(name, top, t, scratch=False)
        top += _align(t.nbytes)
    scratch, peak, naive = {}, 0, 0
    for gname, g in module.graphs.items():
        offsets, size = _plan_graph(g)
        scratch[gname] = {t: Placement(f"{gname}:{t}", top + off, g.tensors[t], scratch=True) for t, off in offsets.items()}
        peak = max(peak, size)
        naive = max(naive, sum(_align(g.tensors[t].nbytes) for t in offsets))
    plan = MemoryPlan(arena_bytes=top + peak, state=state, scratch=scratch, scratch_naive_bytes=naive)
    return module.with_(meta=replace(module.meta, memory=plan))


def _plan_graph(g: Graph) -> tuple[dict[str, int], int]:
    """Offsets (relative to the scratch base) of every node output of ``g``, and the peak size."""
    last_use: dict[str, int] = {}
    for i, n in enumerate(g.nodes):
        for src in n.inputs.values():
            last_use[src] = i
    for out in g.outputs:
        last_use[out] = len(g.nodes)
    free: list[tuple[int, int]] = []   # (offset, size), sorted by offset, coalesced
    offsets: dict[str, int] = {}
    top = 0
    for i, n in enumerate(g.nodes):
        for out in n.outputs:
            size = _align(g.tensors[out].nbytes)
            fits = [(sz, off) for off, sz in free if sz >= size]
            if fits:
                sz, off = min(fits)
                free.remove((off, sz))
                if sz > size:
                    free.append((off + size, sz - size))
                    free.sort()
            else:
                off, top = top, top + size
            offsets[out] = off
        for src in dict.fromkeys(n.inputs.values()):   # free the inputs whose last reader this was
            if src in offsets and last_use.get(src) == i:
                free = _release(free, offsets[src], _align(g.tensors[src].nbytes))
        for out in n.outputs:           # an output nobody reads is dead at once
            if out not in last_use:
                free = _release(free, offsets[out], _align(g.tensors[out].nbytes))
    return offsets, top


def _release(free: list[tuple[int, int]], off: int, size: int) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for o, s in sorted(free + [(off, size)]):
        if merged and merged[-1][0] + merged[-1][1] == o:
            merged[-1] = (merged[-1][0], merged[-1][1] + s)
        else:
            merged.append((o, s))
    return merged
