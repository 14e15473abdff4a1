"""Device benchmark of the ``linear`` kernels against each other and against torch: one JSON document.

    python3 bench/kernels_linear.py [--sections gemv2,decode1,decode8] [--gemv2-sweep-full] [--out FILE]

From the repository root on a GPU machine with numpy, cuda-python (``cuda.bindings``), torch (the
baselines and the copy bandwidth) and nvcc; where grokc is not installed, ``. scripts/device_env.sh``
first. Prints the JSON on stdout (``--out FILE``: also rewritten after every section, so a run cut
short keeps what it measured) and a table on stderr. Correctness is not checked here: run
``tests/gpu/test_kernels_linear.py`` (every family, format and swept tiling, and the rule's kernels
at these shapes) on the same machine.

Sections, run in the order given (the default order puts what matters first; a time budget,
``--deadline`` seconds, cuts from the end):

- ``gemv2``: decode calls of Llama-3.2-1B and SmolLM2-135M at M = 1, 2, 4, 8: the rule's kernel
  (also with programmatic edges between launches), the gemv family's, at M = 1 and 8 the variants
  around the rule's (L2 prefetch, norm in registers, warps along N), torch's fp16 ``F.linear``;
  ``--gemv2-sweep-full``: every gemv2 tiling at M = 1, then the fastest again at M = 2, 4, 8;
- ``decode1``, ``decode8``, ``decode16``: one Llama-3.2-1B decode step's linears (16 layers + the LM
  head, the rule's kernels, one CUDA graph) against torch fp16 doing the same matmuls; with
  programmatic edges also with each knob of ``linear_cases.DECODE_ALTS`` changed and with each
  shape's fastest gemv2 kernel of the gemv2 section;
- ``prefill``: every projection of the Llama-3.2-1B and Llama-3-8B shapes at M = 512, 1024, 2048,
  4096, the rule's kernel against torch's fp16 ``F.linear`` (``x torch`` > 1: grokc is faster);
- ``gemv``: the gemv family's tilings at M = 1; ``gemv_m``: M = 4 and 16 (and the GEMM's small
  tiles at 16); ``gemm``: prefill GEMMs, every tile config; ``smol``: SmolLM2's calls, the rule's.

Each section runs in a child process: a kernel that faults is recorded under ``failures`` and the
section resumes after it. Timing: ``kernel_timing.Timer`` (a chain of launches over weight copies
larger than L2, median of 5). Records give µs per launch, GB/s of weight bytes and TFLOP/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from kernel_timing import ROTATE_BYTES, Timer, Uploads, build_parallel, chain_length, torch_graph_us
from linear_cases import (
    DECODE_ALTS,
    GEMM_SHAPES,
    GEMV_M16_TILINGS,
    GEMV_TILINGS,
    LINEAR,
    LLAMA_DECODE,
    PREFILL_SHAPES,
    SMOL_DECODE,
    TARGET,
    DeviceCase,
    Shape,
    decode_alt,
    gemm_variants,
    gemv2_focus,
    gemv2_variants,
    gemv_variants,
    host_case,
    launch_dims,
    old_gemv_rule,
    rule,
    rule_pdl,
    variant,
)

from grokc.runner import cuda_driver as cd
from grokc.targets import KernelCall, select

SECTIONS = ("gemv2", "decode1", "decode8", "prefill", "gemv", "gemm", "gemv_m", "decode16", "smol")
PEAK_TFLOPS = 790.0  # dense bf16 matrix rate measured on this H200 kind
GEMV2_FOLLOW = {8: 8, 4: 2, 2: 2}  # with --gemv2-sweep-full: fastest M = 1 tilings also timed at larger M
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# -- what to time ---------------------------------------------------------------------------------

def make_plan(full_sweep: bool) -> list[tuple[str, Shape, list[str], list[str]]]:
    """(section, shape, kernel symbols, symbols also timed with programmatic edges): the rule's
    choice first, then the other variants."""
    plan = []
    for s in (s.at(m) for m in (1, 8, 2, 4) for s in LLAMA_DECODE + SMOL_DECODE):
        old = old_gemv_rule(s)
        if full_sweep:
            # the whole sweep at M = 1; at M = 2, 4, 8 the rule's choice, the gemv rule's and (added at
            # run time by gemv2_followups) the fastest tilings of M = 1
            sweep = [v.symbol for v in gemv2_variants(s)]
            syms = [rule(s)] + [x for x in [old] + sweep if x and x != rule(s)]
            plan.append(("gemv2" if s.m == 1 else "gemv2_m", s, list(dict.fromkeys(syms)), rule_pdl(s)))
        else:
            focus = [v.symbol for v in gemv2_focus(s)] if s.m in (1, 8) and s.name in {x.name for x in LLAMA_DECODE} else []
            syms = [rule(s)] + [x for x in [old] + focus if x and x != rule(s)]
            plan.append(("gemv2", s, list(dict.fromkeys(syms)), rule_pdl(s)))
    for s in LLAMA_DECODE:
        plan.append(("gemv", s, [rule(s)] + [v.symbol for v in gemv_variants(s, GEMV_TILINGS) if v.symbol != rule(s)], []))
    for s in (s.at(m) for s in LLAMA_DECODE[:4] for m in (4, 16)):
        # at M = 16, also the GEMM's small tiles: which family should own 9 <= M <= 16?
        sweep = [v.symbol for v in gemv_variants(s, GEMV_M16_TILINGS)] + [
            v.symbol for v in gemm_variants(s) if v.bm == 64] if s.m == 16 else []
        plan.append(("gemv_m", s, [rule(s)] + [sym for sym in sweep if sym != rule(s)], []))
    for s in SMOL_DECODE:
        plan.append(("smol", s, [rule(s)], []))
    for s in PREFILL_SHAPES:
        plan.append(("prefill", s, [rule(s)], []))
    for s in GEMM_SHAPES:
        plan.append(("gemm", s, [rule(s)] + [v.symbol for v in gemm_variants(s) if v.symbol != rule(s)], []))
    return plan


def decode_symbols(ms) -> list[str]:
    out = []
    for s in (s.at(m) for m in ms for s in LLAMA_DECODE):
        sym = rule(s)
        out += [sym] + [decode_alt(s, sym, alt) for alt in DECODE_ALTS.values()]
    return list(dict.fromkeys(out))


def gemv2_followups(records: list, plan: list) -> dict:
    """(shape, M) -> symbols for M = 2, 4, 8: the rule's, the gemv rule's, the fastest at M = 1."""
    out = {}
    for sec, s, syms, _ in plan:
        if sec != "gemv2_m":
            continue
        m1 = sorted((r for r in records if r["section"] == "gemv2" and r["shape"] == s.name and r["m"] == 1
                     and not r.get("pdl") and r["kernel"].startswith("linear_gemv2_")), key=lambda r: r["us"])
        fast = [r["kernel"] for r in m1[:GEMV2_FOLLOW.get(s.m, 3)]]
        out[(s.name, s.m)] = list(dict.fromkeys(syms[:2] + [k for k in fast if k in syms]))
    return out


def fastest_gemv2(records: list, m: int) -> dict:
    """Shape name -> the fastest gemv2 kernel timed for it at M = m (plain graphs)."""
    best: dict = {}
    for r in records:
        if (r["section"] == "gemv2" and r["m"] == m and not r.get("pdl")
                and r["kernel"].startswith("linear_gemv2_") and r["shape"] in {s.name for s in LLAMA_DECODE}):
            if r["shape"] not in best or r["us"] < best[r["shape"]][1]:
                best[r["shape"]] = (r["kernel"], r["us"])
    return {k: v[0] for k, v in best.items()}


# -- timing (in a child process) ---------------------------------------------------------------------

class Kernels:
    """Cubins built by the parent, loaded on demand in a child: symbol -> cd.Function."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.index = json.loads((folder / "index.json").read_text())
        self.modules: dict[str, cd.Module] = {}

    def function(self, symbol: str) -> cd.Function:
        file = self.index[symbol]
        if file not in self.modules:
            self.modules[file] = cd.Module((self.folder / file).read_bytes())
        return self.modules[file].function(symbol)


def time_kernel(timer: Timer, fn: cd.Function, v, dc: DeviceCase, pdl: bool = False) -> dict:
    """``pdl``: launches joined by programmatic edges (each may start while the one before ends)."""
    grid, block, smem = launch_dims(v, dc.s)
    launches = [cd.KernelLaunch(fn, grid, block, smem, cd.pack_args(LINEAR, dc.args((j + 1) % dc.copies)),
                                pdl=pdl and j > 0) for j in range(chain_length(dc.copies))]
    us, spread = timer.graph(launches)
    return {"us": us, "spread": spread, "grid": list(grid), "block": list(block), "smem": smem}


def torch_linear_us(torch, s: Shape) -> float:
    """torch.nn.functional.linear, fp16 weights [NW, K] in rotating copies, one CUDA graph."""
    copies = max(2, min(64, -(-ROTATE_BYTES // (s.nw * s.k * 2))))
    ws = [torch.randn(s.nw, s.k, device="cuda", dtype=torch.float16) for _ in range(copies)]
    x = torch.randn(s.m, s.k, device="cuda", dtype=torch.float16)
    return torch_graph_us(torch, [lambda w=w: torch.nn.functional.linear(x, w) for w in ws], calls=chain_length(copies))


def plan_job(job: dict, timer: Timer, kernels: Kernels, torch, emit) -> None:
    for item_no, (section, shape, syms, with_torch, pdl_syms) in enumerate(job["items"]):
        s = Shape(**shape)
        emit(start=[item_no, "setup"])
        dc = DeviceCase(s)
        for sym, pdl in [(x, False) for x in syms] + [(x, True) for x in pdl_syms]:
            emit(start=[item_no, ("pdl:" if pdl else "") + sym])
            r = time_kernel(timer, kernels.function(sym), variant(sym), dc, pdl=pdl)
            emit(record=dict(section=section, shape=s.name, m=s.m, n=s.n, k=s.k, kernel=sym, pdl=pdl,
                             rule_choice=sym == job["rules"][s.name + str(s.m)] and not pdl,
                             old_rule=sym == job["old_rules"].get(s.name + str(s.m)), bytes=s.weight_bytes,
                             gbps=s.weight_bytes / r["us"] / 1e3, tflops=2 * s.m * s.nw * s.k / r["us"] / 1e6, **r))
            log(f"{section:6s} {s.name:18s} M={s.m:<4d} {sym:48s}{' pdl' if pdl else '    '} {r['us']:8.2f} us "
                f"{s.weight_bytes / r['us'] / 1e3:6.0f} GB/s")
        dc.close()
        if with_torch and torch is not None:
            emit(start=[item_no, "torch"])
            us = torch_linear_us(torch, s)
            emit(record=dict(section=section, shape=s.name, m=s.m, n=s.n, k=s.k, kernel="torch_f16_linear",
                             rule_choice=False, bytes=s.nw * s.k * 2, us=us, gbps=s.nw * s.k * 2 / us / 1e3,
                             tflops=2 * s.m * s.nw * s.k / us / 1e6, spread=0.0))
            log(f"{section:6s} {s.name:18s} M={s.m:<4d} torch fp16 {us:.2f} us")


def decode_step(timer: Timer, kernels: Kernels, m: int, torch, best: dict) -> dict:
    """16 layers x (qkv+norm, o+residual, gate_up+norm+silu, down+residual) + LM head, one graph."""
    layers, shapes = 16, [s.at(m) for s in LLAMA_DECODE]
    by_name = {s.name: s for s in shapes}
    sel = {s.name: select(KernelCall("linear", s.attrs, s.dims), TARGET) for s in shapes}
    up, rng = Uploads(), np.random.default_rng(1)
    h, attn = (up.ptr(rng.standard_normal((m, 2048)).astype(np.float16)) for _ in range(2))
    qkv, mlp = up.ptr(np.zeros((m, 3072), np.float16)), up.ptr(np.zeros((m, 8192), np.float16))
    logits = up.ptr(np.zeros((m, 128256), np.float32))
    wires = {"qkv": (h, qkv, None), "o": (attn, h, h), "gate_up": (h, mlp, None), "down": (mlp, h, h),
             "lm_head": (h, logits, None)}   # (x, out, residual)
    launches, names, weight_bytes = [], [], 0
    for s in [s for _ in range(layers) for s in shapes[:4]] + shapes[4:]:
        a = host_case(s, seed=0)
        x, out, res = wires[s.name]
        vals = {**s.dims, "out": out, "x": x, "weight": up.ptr(a["weight"]), "scales": up.ptr(a["scales"]),
                "zeros": None, "norm": up.ptr(a["norm"]), "residual": res, "addend": None, "bias": None}
        c = sel[s.name]
        launches.append(cd.KernelLaunch(kernels.function(c.kernel), c.grid, c.block, c.smem,
                                        cd.pack_args(LINEAR, [vals[p.name] for p in LINEAR]), pdl=c.pdl))
        names.append(s.name)
        weight_bytes += s.weight_bytes

    def swap(k: cd.KernelLaunch, name: str, sym: str) -> cd.KernelLaunch:
        grid, block, smem = launch_dims(variant(sym), by_name[name])   # another tiling, its own launch shape
        return dataclasses.replace(k, function=kernels.function(sym), grid=grid, block=block, smem=smem)

    def step_us(ks: list[cd.KernelLaunch]) -> float:
        return timer.graph(ks, reps=5)[0] * len(ks)

    pdl_us, alts = None, {}
    if any(k.pdl for k in launches[1:]):  # the same graph with programmatic edges where the kernels allow
        pdl_us = step_us(launches)
        for alt_name, alt in DECODE_ALTS.items():
            alts[alt_name] = step_us([swap(k, n, decode_alt(by_name[n], sel[n].kernel, alt))
                                      for k, n in zip(launches, names)])
        if best:  # each shape's fastest kernel of the gemv2 section
            alts["best"] = step_us([swap(k, n, best.get(n, sel[n].kernel)) for k, n in zip(launches, names)])
    us = step_us([dataclasses.replace(k, pdl=False) for k in launches])
    up.close()
    result = {"m": m, "launches": len(launches), "us": us, "pdl_us": pdl_us, "pdl_alts_us": alts, "best": best,
              "weight_bytes": weight_bytes, "gbps": weight_bytes / us / 1e3, "torch_us": None, "torch_gbps": None,
              "kernels": {k: c.kernel for k, c in sel.items()}}
    if torch is None:
        return result
    # torch: the same matmuls with fp16 weights (no norm, residual or silu kernels: a lower bound)
    ws = [[torch.randn(s.nw, s.k, device="cuda", dtype=torch.float16) * 0.02 for s in shapes[:4]] for _ in range(layers)]
    head = torch.randn(128256, 2048, device="cuda", dtype=torch.float16) * 0.02
    xs = {s.name: torch.randn(m, s.k, device="cuda", dtype=torch.float16) for s in shapes}

    def step():
        for lw in ws:
            for s, w in zip(shapes[:4], lw):
                torch.nn.functional.linear(xs[s.name], w)
        torch.nn.functional.linear(xs["lm_head"], head)

    torch_us = torch_graph_us(torch, [step], calls=1, reps=5)
    torch_bytes = sum(s.nw * s.k * 2 for s in shapes[:4]) * layers + 128256 * 2048 * 2
    return {**result, "torch_us": torch_us, "torch_gbps": torch_bytes / torch_us / 1e3}


def run_job(job: dict, folder: Path, out: Path) -> None:
    """One job in this (child) process: {"kind": "copy" | "plan" | "decode", ...}. Writes JSON lines to
    ``out`` as it goes: ``start`` (the step about to run), ``record`` (a timing), ``result``."""
    f = out.open("w")

    def emit(**item) -> None:
        f.write(json.dumps(item, default=float) + "\n")
        f.flush()

    import torch

    ctx = cd.Context(0)
    try:
        torch.zeros(1, device="cuda")
    except (RuntimeError, AssertionError) as exc:  # a torch without CUDA: no baselines
        log(f"torch has no CUDA ({exc}); skipping its baselines")
        torch = None
    ctx.make_current()
    timer, kernels = Timer(cd.Stream()), Kernels(folder)
    if job["kind"] == "copy":
        from grokc.cli.baselines import copy_bandwidth_gbps

        emit(result={"copy_bandwidth_GBps": copy_bandwidth_gbps() if torch else None, "device": ctx.name,
                     "sms": ctx.attribute("MULTIPROCESSOR_COUNT"), "torch": torch.__version__ if torch else None})
    elif job["kind"] == "plan":
        plan_job(job, timer, kernels, torch, emit)
    elif job["kind"] == "decode":
        emit(start=[0, f"decode M={job['m']}"])
        r = decode_step(timer, kernels, job["m"], torch, job["best"])
        log(f"decode step M={r['m']}: {r['us']:.1f} us ({r['gbps']:.0f} GB/s), with PDL {r['pdl_us'] or float('nan'):.1f} us")
        emit(result={"decode_step": [r]})
    else:
        raise ValueError(job["kind"])


def remainder(job: dict, item_no: int, at: str) -> dict | None:
    """The part of a crashed plan job after the step ``at`` of item ``item_no``, or None when nothing is left."""
    if job["kind"] != "plan":
        return None
    items = [list(it) for it in job["items"][item_no:]]
    sec, shape, syms, with_torch, pdl_syms = items[0]
    if at in ("setup", "torch"):  # the shape itself failed, or its last step: skip it
        items = items[1:]
    elif at.startswith("pdl:"):
        items[0] = [sec, shape, [], with_torch, pdl_syms[pdl_syms.index(at[4:]) + 1:]]
    else:
        items[0] = [sec, shape, syms[syms.index(at) + 1:], with_torch, pdl_syms]
    return {**job, "items": items} if items else None


def run_isolated(job: dict, folder: Path, failures: list, deadline_s: float) -> dict:
    """Run ``job`` in a child process; after a crash keep what it reported, note the step at fault
    and run the rest of the job in a fresh process."""
    out: dict = {"records": []}
    while job is not None:
        if time.perf_counter() - T0 > deadline_s:
            failures.append({"job": job["kind"], "at": "-", "log": ["skipped: out of time"]})
            return out
        with tempfile.TemporaryDirectory() as tmp:
            jf, of = Path(tmp) / "job.json", Path(tmp) / "out.jsonl"
            jf.write_text(json.dumps(job))
            try:
                proc = subprocess.run([sys.executable, __file__, "--child", str(jf), str(folder), str(of)],
                                      capture_output=True, text=True, timeout=240)
                sys.stderr.write(proc.stderr)
                ok, tail = proc.returncode == 0, proc.stderr.strip().splitlines()[-6:]
            except subprocess.TimeoutExpired:
                ok, tail = False, ["timed out after 240 s (a hang?)"]
            lines = [json.loads(ln) for ln in of.read_text().splitlines() if ln.strip()] if of.exists() else []
        at = None
        for ln in lines:
            if "record" in ln:
                out["records"].append(ln["record"])
            elif "result" in ln:
                out.update(ln["result"])
            elif "start" in ln:
                at = ln["start"]
        if ok:
            return out
        log(f"job failed ({job['kind']} at {at[1] if at else 'start-up'}): {' / '.join(tail)}")
        failures.append({"job": job["kind"], "at": at[1] if at else "start-up", "log": tail})
        job = remainder(job, *at) if at else None
    return out


# -- the run ----------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, in this order; of {', '.join(SECTIONS)}")
    ap.add_argument("--gemv2-sweep-full", action="store_true", help="every gemv2 tiling at M = 1, the fastest at M = 2, 4, 8")
    ap.add_argument("--out", default="", help="also write the JSON here, after every section")
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds; sections past it are skipped")
    a = ap.parse_args(argv)
    a.sections = a.sections.split(",")
    if unknown := sorted(set(a.sections) - set(SECTIONS)):
        ap.error(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}")
    return a


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        run_job(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]), Path(sys.argv[4]))
        return
    a = parse_args()
    plan = [p for p in make_plan(a.gemv2_sweep_full) if p[0] in a.sections or (p[0] == "gemv2_m" and "gemv2" in a.sections)]
    decode_ms = [int(sec[6:]) for sec in a.sections if sec.startswith("decode")]
    symbols = sorted({sym for _, _, syms, psyms in plan for sym in syms + psyms} | set(decode_symbols(decode_ms)))
    log(f"sections {','.join(a.sections)}: building {len(symbols)} kernels")
    t_build = time.perf_counter()
    cubins = build_parallel(symbols, TARGET, os.cpu_count() or 8)
    log(f"built in {time.perf_counter() - t_build:.1f} s")
    report: dict = {"meta": {}, "records": [], "decode_step": [], "failures": []}
    with tempfile.TemporaryDirectory(prefix="grokc-bench-") as tmp:
        folder, index, files = Path(tmp), {}, {}
        for sym, cubin in cubins.items():
            files.setdefault(id(cubin), (f"grokc_{len(files)}.cubin", cubin))
            index[sym] = files[id(cubin)][0]
        for fname, cubin in files.values():
            (folder / fname).write_bytes(cubin)
        (folder / "index.json").write_text(json.dumps(index))

        def run(job: dict) -> dict:
            return run_isolated(job, folder, report["failures"], a.deadline)

        report["meta"] = {k: v for k, v in run({"kind": "copy"}).items() if k != "records"}
        report["meta"].update(build_s=time.perf_counter() - t_build, sections=a.sections)
        rules = {s.name + str(s.m): syms[0] for _, s, syms, _ in plan}
        old_rules = {s.name + str(s.m): old_gemv_rule(s) for _, s, _, _ in plan}

        def section(items: list) -> None:
            if items:
                report["records"] += run({"kind": "plan", "items": items, "rules": rules, "old_rules": old_rules})["records"]

        for sec in a.sections:
            if sec.startswith("decode"):
                m = int(sec[6:])
                report["decode_step"] += run({"kind": "decode", "m": m, "best": fastest_gemv2(report["records"], m)}
                                             ).get("decode_step", [])
                continue
            section([[sec, dataclasses.asdict(s), syms, not (sec == "gemv2" and s.m in (2, 4)), psyms]
                     for sec_, s, syms, psyms in plan if sec_ == sec])
            if sec == "gemv2" and a.gemv2_sweep_full:
                top = gemv2_followups(report["records"], plan)
                items = [["gemv2", dataclasses.asdict(s), top[(s.name, s.m)], s.m == 8, psyms]
                         for sec_, s, _, psyms in plan if sec_ == "gemv2_m"]
                section(sorted(items, key=lambda it: -it[1]["m"]))  # M = 8 first
            if a.out:  # what is done so far, in case the run is cut short
                Path(a.out).write_text(json.dumps({**report, "partial": True}, indent=1, default=float) + "\n")
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(json.dumps(report, indent=1, default=float))
    print_table(report)


def print_table(report: dict) -> None:
    """One line per (section, shape, M) on stderr: the rule's kernel, the fastest variant, torch."""
    bw = report["meta"].get("copy_bandwidth_GBps") or float("nan")
    recs, nan, err = report["records"], float("nan"), sys.stderr
    print(f"\n==== linear kernels on {report['meta'].get('device')} (copy bandwidth {bw:.0f} GB/s); "
          f"GEMV rows: GB/s of weight bytes, % of the copy bandwidth; GEMM rows: TFLOP/s, % of {PEAK_TFLOPS:.0f}", file=err)
    print(f"{'section':7s} {'shape':18s} {'M':>4s} | {'rule kernel (linear_...)':40s} {'us':>7s} {'pdl us':>7s} {'rate':>6s} "
          f"{'%':>4s} | {'fastest':40s} {'us':>7s} | {'torch':>7s} {'x torch':>7s}", file=err)
    for key in dict.fromkeys((r["section"], r["shape"], r["m"]) for r in recs):
        group = [x for x in recs if (x["section"], x["shape"], x["m"]) == key]
        ours = [x for x in group if x["kernel"] != "torch_f16_linear" and not x.get("pdl")]
        if not ours:
            continue
        rule_rec = next((x for x in ours if x["rule_choice"]), None) or {"kernel": "linear_(failed)", "us": nan,
                                                                          "gbps": nan, "tflops": nan}
        pdl = next((x["us"] for x in group if x.get("pdl") and x["kernel"] == rule_rec["kernel"]), nan)
        best = min(ours, key=lambda x: x["us"])
        t_us = next((x["us"] for x in group if x["kernel"] == "torch_f16_linear"), nan)
        gemm = key[0] in ("gemm", "prefill")
        rate = rule_rec["tflops"] if gemm else rule_rec["gbps"]
        pct = 100 * rate / (PEAK_TFLOPS if gemm else bw)
        print(f"{key[0]:7s} {key[1]:18s} {key[2]:4d} | {rule_rec['kernel'][7:47]:40s} {rule_rec['us']:7.2f} {pdl:7.2f} "
              f"{rate:6.0f} {pct:3.0f}% | {best['kernel'][7:47]:40s} {best['us']:7.2f} | {t_us:7.2f} "
              f"{t_us / rule_rec['us']:7.2f}", file=err)
    for c in report["decode_step"]:
        torch_us = c["torch_us"] if c["torch_us"] is not None else nan
        pdl_us = c["pdl_us"] if c["pdl_us"] is not None else nan
        print(f"decode step (1B linears: 16 layers + LM head) M={c['m']}: {c['us']:.1f} us ({c['gbps']:.0f} GB/s, "
              f"{c['launches']} launches), with PDL edges {pdl_us:.1f} us "
              f"({', '.join(f'{k} {v:.1f}' for k, v in c['pdl_alts_us'].items())}) | torch fp16 {torch_us:.1f} us",
              file=err)
    for f in report["failures"]:
        print(f"CRASHED: {f['job']} at {f['at']}: {' / '.join(f['log'])[-400:]}", file=err)
    print(f"total {time.perf_counter() - T0:.0f} s", file=err)


if __name__ == "__main__":
    main()
