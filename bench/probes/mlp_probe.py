"""The batch-1 Llama-3.2-1B MLP two ways, inside a 16-layer chain of qkv, attention, o and the MLP
joined by programmatic edges, in the same process on the same GPU: the rule's gate_up and down
gemv2 launches against grokc's one ``mlp_decode`` launch (``targets/kernels/mlp_decode.cuh``, the
weights packed as ``abi/mlp_tiles.py`` lays them out). Prints JSON: each MLP against numpy,
µs per 16 layers and the ratio.

    python3 bench/probes/mlp_probe.py [--reps 20] [--position P] [--ncu] [--check-only]

The fused chain's o lets the next launch in at its entry, as the rule does in front of
``mlp_decode`` (``rules_linear.gemv2_variant``); the baseline keeps the rule's o. ``--position``:
the decode position attention reads up to (default 227). ``--ncu``: one launch of each MLP outside
graphs, for Nsight Compute. The stand-alone probe kernel this op started from (TRIG / RED / WARPS /
SEM variants, docs/performance.md) is ``bench/mlp_probe.cu`` at commit 6797ba4.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # bench/: the kernel benchmarks' helpers
from kernel_timing import Timer  # noqa: E402
from kernels_attention import attn_scalars, rope_np  # noqa: E402
from linear_cases import LLAMA_DECODE, TARGET, host_case  # noqa: E402

from grokc.abi import mlp_tiles  # noqa: E402
from grokc.abi.ops import KERNEL_ABI  # noqa: E402
from grokc.runner import cuda_driver as cd  # noqa: E402
from grokc.runner.cpu import OPS  # noqa: E402
from grokc.targets import KernelCall, build_kernels, select  # noqa: E402

LAYERS, H, INTER = 16, 2048, 8192


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--position", type=int, default=227, help="the decode position attention reads up to")
    ap.add_argument("--ncu", action="store_true", help="one launch of each MLP outside graphs, for Nsight Compute")
    ap.add_argument("--check-only", action="store_true", help="only the MLPs against numpy")
    a = ap.parse_args()
    ctx = cd.Context(0)
    stream = cd.Stream()
    timer = Timer(stream)
    shapes = {s.name: s for s in LLAMA_DECODE[:4]}
    sel = {n: select(KernelCall("linear", s.attrs, s.dims), TARGET) for n, s in shapes.items()}
    sel["o_entry"] = dataclasses.replace(sel["o"], kernel=sel["o"].kernel.removesuffix("t1"))
    scal = attn_scalars("B", 1, 16)
    achoice = select(KernelCall("attention_decode", dims=scal), TARGET)
    mlp_call = KernelCall("mlp_decode", {"weight_format": "q4"}, {"hidden": H, "inter": INTER, "eps": 1e-5})
    mchoice = select(mlp_call, TARGET)
    mod = cd.Module(build_kernels(sorted({c.kernel for c in sel.values()} | {achoice.kernel, mchoice.kernel}),
                                   TARGET))
    result: dict = {"device": ctx.name, "sms": ctx.attribute("MULTIPROCESSOR_COUNT"),
                    "kernels": {n: c.kernel for n, c in sel.items()} | {"attention": achoice.kernel,
                                                                        "mlp_decode": mchoice.kernel}}
    keep: list = []

    def up(a: np.ndarray) -> int:
        b = cd.DeviceBuffer(max(a.nbytes, 256))
        b.upload(np.ascontiguousarray(a))
        keep.append(b)
        return b.ptr

    rng = np.random.default_rng(1)
    cases = {n: host_case(s, seed=0) for n, s in shapes.items()}
    h0 = rng.standard_normal(H).astype(np.float16)
    h = up(h0)  # the first buffer: run_once resets it
    attn, qkv, mlp = up(rng.standard_normal(H).astype(np.float16)), up(np.zeros(3072, np.float16)), \
        up(np.zeros(INTER, np.float16))
    accs = [up(np.zeros(H, np.float32)) for _ in range(2)]
    gamma = up(cases["gate_up"]["norm"])
    table, inv = rope_np(64)
    common = {"rope_table": up(table), "inv_freq": up(inv), "block_table": up(np.arange(16, dtype=np.int32)[None]),
              "positions": up(np.array([a.position], np.int32)), "active": up(np.ones(1, np.int32)),
              **scal}
    packed = {part: mlp_tiles.pack(cases[name]["weight"], part, H, INTER)
              for part, name in ((mlp_tiles.Part.GATE_UP, "gate_up"), (mlp_tiles.Part.DOWN, "down"))}
    layers = []
    for _ in range(LAYERS):  # a copy of every weight per layer: 16 layers are > 8x the L2
        lw = {}
        for n, a in cases.items():
            lw[n], lw[n + ".s"] = up(a["weight"]), up(a["scales"])
            lw[n + ".n"] = up(a["norm"]) if shapes[n].norm else None
        lw["k_cache"], lw["v_cache"] = (up(rng.standard_normal((16, 8, 16, 64)).astype(np.float16)) for _ in range(2))
        lw["gate_up_tiles"], lw["down_tiles"] = (up(packed[p]) for p in mlp_tiles.Part)
        layers.append(lw)

    def launch(choice, op: str, vals: dict) -> cd.KernelLaunch:
        fn = mod.function(choice.kernel)
        if choice.smem > cd.DEFAULT_DYNAMIC_SMEM:
            fn.require_smem(choice.smem)
        abi = KERNEL_ABI[op]
        return cd.KernelLaunch(fn, choice.grid, choice.block, choice.smem,
                               cd.pack_args(abi, [vals[p.name] for p in abi]), pdl=choice.pdl)

    def linear(name: str, lw: dict, x: int, out: int, res: int | None, choice: str | None = None):
        return launch(sel[choice or name], "linear", {
            "out": out, "x": x, "weight": lw[name], "scales": lw[name + ".s"], "zeros": None,
            "norm": lw[name + ".n"], "residual": res, "addend": None, "bias": None, **shapes[name].dims})

    def mlp_decode(lw: dict, layer: int):
        return launch(mchoice, "mlp_decode", {
            "acc": accs[layer % 2], "clear": accs[1 - layer % 2], "x": h, "norm": gamma,
            "gate_up_tiles": lw["gate_up_tiles"], "gate_up_scales": lw["gate_up.s"], "gate_up_zeros": None,
            "down_tiles": lw["down_tiles"], "down_scales": lw["down.s"], "down_zeros": None, **mlp_call.dims})

    def attention(lw: dict):
        return launch(achoice, "attention_decode",
                      {**common, "out": attn, "qkv": qkv, "k_cache": lw["k_cache"], "v_cache": lw["v_cache"]})

    def chain(fused: bool, with_attention: bool = True) -> list:
        out = []
        for layer, lw in enumerate(layers):
            if with_attention:
                out += [linear("qkv", lw, h, qkv, None), attention(lw),
                        linear("o", lw, attn, h, h, "o_entry" if fused else None)]
            out += [mlp_decode(lw, layer)] if fused else [linear("gate_up", lw, h, mlp, None), linear("down", lw, mlp, h, h)]
        return out

    def run_once(launches, read: int | None = None) -> np.ndarray:
        keep[0].upload(h0)
        for b in keep:
            if b.ptr in accs:
                b.upload(np.zeros(H, np.float32))
        g = cd.Graph(launches)
        g.launch(stream)
        stream.synchronize()
        g.close()
        buf = next(b for b in keep if b.ptr == (h if read is None else read))
        return buf.download().view(np.float16 if read is None else np.float32).astype(np.float32)

    # one MLP against numpy: x + down(silu(gate) * up) (the chains differ in what they feed the next
    # layer, the f32 sum or not, so only their times are compared)
    ref = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in cases["gate_up"].items()}
    ref["x"] = h0[None]
    OPS["linear"](ref, shapes["gate_up"].attrs)
    ref2 = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in cases["down"].items()}
    ref2["x"], ref2["residual"] = ref["out"].astype(np.float16), h0[None].copy()
    OPS["linear"](ref2, shapes["down"].attrs)
    want = ref2["out"].reshape(-1).astype(np.float32)

    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    base_layers = chain(False, False)
    result["gemv2_mlp_rel_err"] = rel(run_once(base_layers[:2]), want)
    result["mlp_decode_rel_err"] = rel(run_once([mlp_decode(layers[0], 0)], accs[0]), want)
    print(json.dumps(result), flush=True)
    if a.check_only:
        return
    if a.ncu:
        for one in base_layers[2:4] + [mlp_decode(layers[1], 1)]:
            cd.launch(one.function, one.grid, one.block, one.smem, one.args, stream)
        stream.synchronize()
        return
    timings: dict = {}
    for _ in range(3):  # rounds interleaved
        for name, launches in (("gemv2_qkv_o_mlp", chain(False)), ("mlp_decode_qkv_o_mlp", chain(True)),
                               ("gemv2_mlp_only", chain(False, False)), ("mlp_decode_mlp_only", chain(True, False))):
            us = timer.graph(launches, reps=a.reps)[0] * len(launches)
            timings.setdefault(name, []).append(round(us, 1))
    result["us_per_16_layers"] = timings
    result["ratio_mlp_decode_vs_gemv2"] = {
        part: round(min(timings[f"mlp_decode_{part}"]) / min(timings[f"gemv2_{part}"]), 3)
        for part in ("qkv_o_mlp", "mlp_only")}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
