"""Time one graph of an artifact with some of its kernels swapped for variants, all in one run.

    python3 bench/probes/plan_variants.py ARTIFACT --variant 'l2=(linear_gemv2_q4_\\w+)=>\\1l1' [--variant ...]
        [--graph decode_1] [--reps 100] [--rounds 5]

A variant is ``name=REGEX=>REPLACEMENT[;REGEX=>REPLACEMENT...]``, applied (``re.sub``) to every
kernel symbol of the graph; each variant's kernels are compiled into a cubin of their own (on this
machine, with the artifact's arch) and the graph rebuilt from it. ``base`` (the artifact's own
kernels, recompiled the same way) is always timed. Rounds interleave the variants in a new order each round; before each
timing the graph's per-step inputs (the plan's io buffers: positions, tokens, ..) are restored, so
every variant decodes the same steps at the same context. Prints JSON: µs per replay, median and
minimum over the rounds, and each variant's ratio to ``base``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import statistics
from concurrent.futures import ThreadPoolExecutor

from profile_plan import busy_runner, replay_us, use_kernels

from grokc.artifacts.plan import BufferKind, Launch
from grokc.core.errors import TargetError
from grokc.runner import cuda_driver as cd
from grokc.targets import rules_attention, rules_linear
from grokc.targets.archs import get_target
from grokc.targets.base import KernelCall, Target
from grokc.targets.nvcc import build_kernels
from grokc.targets.select import RULES


def parse_variant(text: str) -> tuple[str, list[tuple[str, str]]]:
    name, _, rules = text.partition("=")
    subs = [tuple(rule.split("=>", 1)) for rule in rules.split(";") if rule]
    if not name or any(len(s) != 2 for s in subs):
        raise SystemExit(f"--variant {text!r}: expected name=REGEX=>REPLACEMENT[;REGEX=>REPLACEMENT...]")
    return name, subs


def swapped(launch: Launch, symbol: str, target: Target) -> Launch:
    """``launch`` running ``symbol`` instead, with the launch shape (and, for decode attention, the
    programmatic edge) a gemv2, linear_rows or decode-attention variant needs; any other symbol takes the shape
    of the op's rule that chooses it for this call (e.g. ``sample_rows_c1`` for ``sample_rows_c8``)."""
    if symbol == launch.kernel:
        return launch
    dims = {a.param: a.value for a in launch.args}
    if isinstance(v := rules_linear.parse(symbol), rules_linear.Gemv2):
        return dataclasses.replace(launch, kernel=symbol, grid=(v.blocks(int(dims["N"])), 1, 1),
                                   block=(v.threads, 1, 1), smem=v.smem(int(dims["M"]), int(dims["K"])))
    if isinstance(v, rules_linear.Rows):
        return dataclasses.replace(launch, kernel=symbol, grid=(v.blocks(int(dims["N"]), target.num_sms), 1, 1),
                                   block=(v.threads, 1, 1), smem=v.smem(int(dims["K"])))
    if m := rules_attention.DECODE_MMA.fullmatch(symbol):
        d, w, st, cs = map(int, m.groups()[:4])
        return dataclasses.replace(launch, kernel=symbol, grid=(int(dims["n_kv_heads"]) * cs, int(dims["B"]), 1),
                                   block=(32 * w, 1, 1), smem=rules_attention.decode_mma_smem(d, w, st),
                                   pdl=rules_attention.decode_edge(target, cs))
    call = KernelCall(launch.op, dict(launch.attrs), {k: v for k, v in dims.items() if v is not None})
    for rule in RULES[launch.op]:
        if (c := rule(call, target)) is not None and c.kernel == symbol:
            return dataclasses.replace(launch, kernel=symbol, grid=c.grid, block=c.block, smem=c.smem, pdl=c.pdl)
    return dataclasses.replace(launch, kernel=symbol)


def main() -> None:
    a, r, busy = busy_runner(reps=(int, 100), rounds=(int, 5), variant=(str, []))
    ex, plan = r.executor, r.plan
    g = plan.graphs[a.graph]
    variants = {"base": []} | dict(parse_variant(v) for v in a.variant)
    kernels = {}
    for name, subs in variants.items():
        syms = []
        for launch in g.launches:
            sym = launch.kernel
            for pattern, repl in subs:
                sym = re.sub(pattern, repl, sym)
            syms.append(sym)
        kernels[name] = syms
    target = get_target(plan.arch)
    with ThreadPoolExecutor(8) as pool:
        try:
            cubins = dict(zip(kernels, pool.map(lambda syms: build_kernels(syms, target), kernels.values())))
        except TargetError as exc:  # e.g. a rewrite that names no kernel of ours
            raise SystemExit(f"plan_variants: {exc}") from None
    graphs = {}
    for name, syms in kernels.items():
        use_kernels(ex, cubins[name])
        graphs[name] = cd.Graph([ex._resolve(g, swapped(launch, sym, target)) for launch, sym in zip(g.launches, syms)])
    io = {n: ex.read(n).copy() for n, b in plan.buffers.items() if b.kind is BufferKind.IO}

    def time_once(graph: cd.Graph) -> float:
        for n, v in io.items():
            ex.write(n, v)
        return replay_us(ex, graph, a.reps)

    times: dict[str, list[float]] = {name: [] for name in graphs}
    order = list(graphs)
    for _ in range(a.rounds):
        random.Random(len(times["base"])).shuffle(order)   # no variant always follows the same one
        for name in order:
            times[name].append(time_once(graphs[name]))
    base = statistics.median(times["base"])
    print(json.dumps({
        "artifact": a.artifact, "graph": a.graph, "batch_active": busy, "context": a.context, "reps": a.reps,
        "variants": {name: {"median_us": round(statistics.median(t), 1), "min_us": round(min(t), 1),
                            "vs_base": round(statistics.median(t) / base, 3),
                            "changed": sorted({s for s, launch in zip(kernels[name], g.launches) if s != launch.kernel})}
                     for name, t in times.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
