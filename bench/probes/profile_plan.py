"""Per-launch time of one graph of an artifact on the GPU: where a decode step's time goes.

    python3 bench/probes/profile_plan.py ARTIFACT [--graph decode] [--reps 50]

Each launch of the graph is put alone in a CUDA graph (x ``reps`` copies in a chain) and timed
with events after the whole graph has run once (so caches and state are realistic); the launches
are summed by op and by kernel, next to the time of the whole graph replay, of its variants with
fewer programmatic edges, and of its ablations (the graph without every launch of one role, e.g.
``without_attention``: what that role costs inside the chain). Prints JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import defaultdict

from grokc.runner import Runner, SamplingParams
from grokc.runner import cuda_driver as cd


def busy_runner(argv: list[str] | None = None, **extra: tuple[type, object]) -> tuple[argparse.Namespace, Runner, int]:
    """Parse the common options, load the artifact on the GPU, fill the slots, replay the graph once.

    ``extra``: more ``--name`` options as (type, default); a list default makes a repeatable option.
    Returns (args, runner, busy slots).
    """
    ap = argparse.ArgumentParser()
    ap.add_argument("artifact")
    ap.add_argument("--graph", default="", help="default: the decode graph of the batch")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=0, help="busy slots (default: the build's batch)")
    ap.add_argument("--temperature", type=float, default=0.0, help="the slots' sampling (default: greedy)")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    for name, (kind, default) in extra.items():
        ap.add_argument(f"--{name}", type=kind, default=default, action="append" if isinstance(default, list) else None)
    a = ap.parse_args(argv)
    r = Runner(a.artifact, device="cuda")
    budget = r.engine.shapes.max_seq - a.context - 1
    sampling = SamplingParams(max_new_tokens=budget, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=1)
    slots = [r.engine.add(list(range(100, 100 + a.context)), sampling)
             for _ in range(a.batch or r.engine.shapes.batch)]
    a.graph = a.graph or r.engine.decode_graph()
    r.executor.replay(a.graph)
    r.executor.synchronize()
    return a, r, len(slots)


def use_kernels(ex, cubin: bytes) -> None:
    """Resolve the executor's launches from now on against ``cubin`` (a traced or variant rebuild of
    the plan's kernels); graphs already built keep theirs. The executor's own load does the same."""
    ex.module, ex._checked_kernels = cd.Module(cubin), set()


def replay_us(ex, graph: cd.Graph, reps: int) -> float:
    """µs per replay of ``graph`` on the executor's stream: one warm replay, then ``reps`` timed ones."""
    start, end = cd.Event(), cd.Event()
    graph.launch(ex.stream)
    start.record(ex.stream)
    for _ in range(reps):
        graph.launch(ex.stream)
    end.record(ex.stream)
    end.synchronize()
    us = start.elapsed_ms(end) * 1e3 / reps
    start.close()
    end.close()
    return us


def main() -> None:
    a, r, busy = busy_runner(reps=(int, 50))
    ex, plan = r.executor, r.plan
    g = plan.graphs[a.graph]

    resolved = [ex._resolve(g, launch) for launch in g.launches]
    whole_us = replay_us(ex, cd.Graph(resolved), a.reps)
    variants = {   # the same graph with programmatic edges only where a variant allows them
        "no_pdl": [dataclasses.replace(k, pdl=False) for k in resolved],
        "pdl_linear_only": [dataclasses.replace(k, pdl=k.pdl and l.op == "linear") for k, l in zip(resolved, g.launches)],
        "pdl_no_attention": [dataclasses.replace(k, pdl=k.pdl and l.op != "attention_decode")
                             for k, l in zip(resolved, g.launches)],
    }
    # ablations: the graph without every launch of one role (its results are garbage, its time is
    # what that role costs inside the chain, dependency gaps included)
    for role in dict.fromkeys(launch.node.split(".")[-1] for launch in g.launches):
        variants[f"without_{role}"] = [k for k, l in zip(resolved, g.launches) if l.node.split(".")[-1] != role]
    variant_us = {name: round(replay_us(ex, cd.Graph(ks), a.reps), 1) for name, ks in variants.items()}
    per_op, per_kernel, rows = defaultdict(float), defaultdict(float), []
    for launch in g.launches:
        k = ex._resolve(g, launch)
        single = cd.Graph([k] * a.reps)
        us = replay_us(ex, single, 3) / a.reps
        single.close()
        per_op[launch.op] += us
        per_kernel[f"{launch.kernel} ({launch.node.split('.')[-1]})"] += us
        rows.append((launch.node, launch.kernel, round(us, 2)))
    print(json.dumps({
        "artifact": a.artifact, "graph": a.graph, "launches": len(g.launches), "batch_active": busy,
        "graph_replay_us": round(whole_us, 1), "graph_variants_us": variant_us,
        "sum_of_launches_us": round(sum(per_op.values()), 1),
        "by_op_us": {k: round(v, 1) for k, v in sorted(per_op.items(), key=lambda x: -x[1])},
        "by_kernel_us": {k: round(v, 1) for k, v in sorted(per_kernel.items(), key=lambda x: -x[1])},
        "first_launches": rows[:8],
    }, indent=1))


if __name__ == "__main__":
    main()
