"""Block timeline of one graph of an artifact on the GPU: where each launch waits and works.

    python3 bench/probes/trace_plan.py ARTIFACT [--graph decode_1] [--replays 20] [--context 128]

Recompiles the artifact's kernels on the GPU machine with a ``grokc_trace::Scope`` in every entry
point (targets/kernels/trace.cuh: per block, %globaltimer at entry, when griddepcontrol.wait
returned, at exit and at the kernel's phase marks, ``GROKC_TRACE_MARK(i)``), replays the graph
``replays`` times with those kernels, and gives per launch (means over the replays, µs from the
first block of the replay's first launch):

- ``start`` / ``started``: the first and the last of its blocks to begin;
- ``released``: the first block past griddepcontrol.wait (blocks of a launch without a programmatic
  edge begin after the launch before has finished);
- ``end``: the last block to finish; ``cost`` = end - end of the launch before: what the launch adds
  to the chain, split into ``dep`` (released - end before: the dependency latency) and ``work``
  (end - released);
- ``marks``: per phase mark the kernel sets, the median block's time past ``released``.

and the same three summed per role (``qkv``, ``attention``, ..) and over the graph. Prints JSON.
``--dump FILE.npz``: every block's record too, one array ``l<i>`` of shape (replays, blocks, 7) per
launch i: start, wait (its start where it never waits), end and the marks (NaN where unset), in µs
from its replay's first start, and the multiprocessor; ``kernels`` and ``nodes`` beside.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
from profile_plan import busy_runner, use_kernels

from grokc.runner import cuda_driver as cd
from grokc.targets.archs import get_target
from grokc.targets.nvcc import build_kernels

MARKS = 3  # trace.cuh's kMarks
RECORD = np.dtype([("start", "<u8"), ("wait", "<u8"), ("end", "<u8"), ("marks", "<u8", (MARKS,)), ("kernel", "<u4"),
                   ("block", "<u4"), ("smid", "<u4"), ("pad", "<u4")])
RECORDS, COUNT = "_ZN11grokc_trace7recordsE", "_ZN11grokc_trace5countE"


def read_records(module: cd.Module) -> np.ndarray:
    d = cd.driver()
    count_ptr, _ = module.global_address(COUNT)
    rec_ptr, rec_size = module.global_address(RECORDS)
    n = np.zeros(1, np.uint32)
    cd.check(d.cuMemcpyDtoH(n.ctypes.data, count_ptr, 4), "cuMemcpyDtoH")
    cap = rec_size // RECORD.itemsize
    if int(n[0]) > cap:
        raise SystemExit(f"trace overflow: {int(n[0])} block records for a capacity of {cap}; use fewer --replays")
    out = np.zeros(int(n[0]), RECORD)
    cd.check(d.cuMemcpyDtoH(out.ctypes.data, rec_ptr, out.nbytes), "cuMemcpyDtoH")
    return out


def instances(records: np.ndarray, launches, symbols: list[str], replays: int) -> list[list[np.ndarray]]:
    """records -> [replay][launch] block records: a symbol's blocks in start order, cut by grid size."""
    per_symbol = defaultdict(list)  # symbol -> positions of its launches in the graph
    for i, launch in enumerate(launches):
        per_symbol[launch.kernel].append(i)
    out: list[list[np.ndarray | None]] = [[None] * len(launches) for _ in range(replays)]
    for sym, positions in per_symbol.items():
        mine = np.sort(records[records["kernel"] == symbols.index(sym)], order="start")
        sizes = [int(np.prod(launches[i].grid)) for i in positions]
        if len(mine) != replays * sum(sizes):
            raise SystemExit(f"{sym}: {len(mine)} block records, expected {replays * sum(sizes)}")
        at = 0
        for rep in range(replays):
            for i, n in zip(positions, sizes):
                out[rep][i] = mine[at:at + n]
                at += n
    return out


def block_times(blocks: np.ndarray, t0: int) -> np.ndarray:
    """(blocks, 7): start, wait (where the block waited, else its start), end and the marks (NaN where
    unset), µs after ``t0``, and the multiprocessor."""
    wait = np.where(blocks["wait"] > 0, blocks["wait"], blocks["start"])
    times = np.column_stack([blocks["start"], wait, blocks["end"], blocks["marks"]]).astype(np.int64) - int(t0)
    times = np.where(np.column_stack([np.ones((len(blocks), 3), bool), blocks["marks"] > 0]), times / 1e3, np.nan)
    return np.column_stack([times, blocks["smid"]])


def main() -> None:
    a, r, busy = busy_runner(replays=(int, 20), dump=(str, ""))
    ex, plan = r.executor, r.plan
    g = plan.graphs[a.graph]
    symbols = sorted({launch.kernel for graph in plan.graphs.values() for launch in graph.launches})
    use_kernels(ex, build_kernels(symbols, get_target(plan.arch), trace=True))
    module = ex.module
    graph = cd.Graph([ex._resolve(g, launch) for launch in g.launches])
    for _ in range(3):
        graph.launch(ex.stream)
    ex.synchronize()
    count_ptr, _ = module.global_address(COUNT)
    cd.check(cd.driver().cuMemsetD32(count_ptr, 0, 1), "cuMemsetD32")
    for _ in range(a.replays):
        graph.launch(ex.stream)
    ex.synchronize()
    per_replay = instances(read_records(module), g.launches, symbols, a.replays)

    fields = ("start", "started", "released", "end", "dep", "work", "cost")
    sums = np.zeros((len(g.launches), len(fields)))
    marks = np.zeros((len(g.launches), MARKS))  # summed over replays: median block's mark - released
    for blocks in per_replay:
        t0 = float(blocks[0]["start"].min())
        prev_end = t0
        for i, b in enumerate(blocks):
            waited = b["wait"][b["wait"] > 0]
            released = float(waited.min()) if len(waited) else float(b["start"].min())
            end = float(b["end"].max())
            row = (b["start"].min() - t0, b["start"].max() - t0, released - t0, end - t0,
                   released - prev_end, end - released, end - prev_end)
            sums[i] += np.array(row, dtype=float) / 1e3
            marked = b["marks"] > 0
            marks[i] += [(np.median(b["marks"][marked[:, j], j]) - released) / 1e3 if marked[:, j].any() else np.nan
                         for j in range(MARKS)]
            prev_end = end
    mean, mean_marks = sums / a.replays, marks / a.replays
    rows, by_role = [], defaultdict(lambda: np.zeros(3))
    for launch, m, mk in zip(g.launches, mean, mean_marks):
        role = launch.node.split(".")[-1]
        by_role[role] += m[4:7]
        rows.append({"node": launch.node, "kernel": launch.kernel, "blocks": int(np.prod(launch.grid)),
                     "pdl": launch.pdl, **{f: round(float(v), 2) for f, v in zip(fields, m)},
                     **({"marks": [None if np.isnan(v) else round(float(v), 2) for v in mk]}
                        if not np.isnan(mk).all() else {})})
    if a.dump:
        np.savez_compressed(a.dump, kernels=np.array([x.kernel for x in g.launches]),
                            nodes=np.array([x.node for x in g.launches]),
                            **{f"l{i}": np.stack([block_times(rep[i], rep[0]["start"].min()) for rep in per_replay])
                               for i in range(len(g.launches))})
    print(json.dumps({
        "artifact": a.artifact, "graph": a.graph, "batch_active": busy, "replays": a.replays,
        "graph_us": round(float(mean[-1][3]), 1),
        "by_role_us": {role: dict(zip(("dep", "work", "cost"), np.round(v, 1).tolist()))
                       for role, v in sorted(by_role.items(), key=lambda kv: -kv[1][2])},
        "launches": rows,
    }, indent=1))
    graph.close()


if __name__ == "__main__":
    main()
