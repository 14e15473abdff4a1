"""Probe: the batch-1 Llama-3.2-1B MLP as one launch without a dependency between gate_up and down
(``bench/mlp_probe.cu``: each block its 64 intermediate dims end to end, down's partial sums added
into an f32 accumulator), against the rule's gate_up and down gemv2 launches, in the same process on
the same GPU, inside a 16-layer chain of qkv, o and the MLP joined by programmatic edges. Prints JSON.

    python3 bench/mlp_probe.py [--reps 20] [--variants TRIG:RED:WARPS[:CL[:SEM]],...] [--o-entry]
                               [--o-entry-fused] [--position P] [--grokc SYM,...] [--ncu] [--check-only]

--grokc: also time grokc's own ``mlp_decode`` kernel (targets/kernels/mlp_decode.cuh,
``mlp_decode_q4_h2048``) on the weights in ``artifacts/mlp_tiles.py``'s layouts, in the same chains.

--o-entry: the o GEMV lets the next launch start at its entry instead of after its wait;
--o-entry-fused: only in the chains with a fused MLP (the baseline keeps the rule's o).
--position: the decode position attention reads up to (default 227).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import linear_kernels as lk  # noqa: E402  (maps grokc onto the checkout)

cd = lk.cd
LAYERS, H, INTER, BLOCKS = 16, 2048, 8192, 128
GU_TILE, DN_BYTES = 16384 + 128, H * 64 // 2
ROOT = Path(__file__).resolve().parents[1]


def build(trig: int, red: int, warps: int, cl: int = 4, sem: int = 0) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "p.cubin"
        subprocess.run([lk.find_nvcc(), "-arch=sm_90a", "-cubin", "-O3", f"-DTRIG={trig}", f"-DRED={red}", f"-DWARPS={warps}", f"-DCL={cl}", f"-DSEM={sem}",
                        f"-I{ROOT / 'targets' / 'kernels'}", str(Path(__file__).with_suffix(".cu")), "-o", str(out)],
                       check=True)
        return out.read_bytes()


def fragment_words(codes: np.ndarray) -> np.ndarray:
    """u32 [R / 16, K / 16, 32]: per group of 16 rows and k block of 16, lane (g, t)'s word: nibbles
    0, 4 row g k 2t, 2t+1; 1, 5 row g+8; 2, 6 row g k 2t+8, 2t+9; 3, 7 row g+8 (bench/mlp_probe.cu)."""
    r, k = codes.shape
    c = codes.reshape(r // 16, 16, k // 16, 16).astype(np.uint32).transpose(0, 2, 1, 3)  # [rg][kb][row][c]
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    word = np.zeros((r // 16, k // 16, 32), np.uint32)
    for m, dr, dk in ((0, 0, 0), (4, 0, 1), (1, 8, 0), (5, 8, 1), (2, 0, 8), (6, 0, 9), (3, 8, 8), (7, 8, 9)):
        word |= c[:, :, g + dr, 2 * t + dk] << np.uint32(4 * m)
    return word


def pack_gate_up(weight: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """u8 [BLOCKS * 8, GU_TILE]: unit u = gate rows 8u..8u+7 and up rows INTER + 8u.., one tile each."""
    from grokc.artifacts import int4
    codes = int4.unpack(weight)
    rows = np.concatenate([np.arange(8)[None] + 8 * np.arange(INTER // 8)[:, None],
                           INTER + np.arange(8)[None] + 8 * np.arange(INTER // 8)[:, None]], 1).reshape(-1)
    words = fragment_words(codes[rows])  # [unit][kb 128][lane]
    tiles = np.zeros((INTER // 8, GU_TILE), np.uint8)
    order = words.reshape(-1, 32, 4, 32).transpose(0, 1, 3, 2)  # [unit][kb / 4][lane][kb % 4]
    tiles[:, :16384] = np.ascontiguousarray(order).reshape(-1, 4096).view(np.uint8)
    tiles[:, 16384:16416] = scales.reshape(-1)[rows].reshape(-1, 16).view(np.uint8)
    return tiles


def pack_down(weight: np.ndarray) -> np.ndarray:
    """u8 [BLOCKS, DN_BYTES]: block b's columns 64 b .. 64 b + 63 as [row group][lane][kb] words."""
    from grokc.artifacts import int4
    codes = int4.unpack(weight)  # [H, INTER]
    words = fragment_words(codes)  # [rg 128][kb 512][lane]
    w = words.reshape(128, BLOCKS, 4, 32).transpose(1, 0, 3, 2)  # [block][rg][lane][kb]
    return np.ascontiguousarray(w).reshape(BLOCKS, -1).view(np.uint8)


def main() -> None:
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 20
    variants = [tuple(int(v) for v in s.split(":")) for s in
                (sys.argv[sys.argv.index("--variants") + 1].split(",") if "--variants" in sys.argv else ["0:1:16", "0:0:16", "0:4:16", "0:4:8"])]
    ctx = cd.Context(0)
    stream = cd.Stream()
    timer = lk.Timer(stream)
    result: dict = {"device": ctx.name, "sms": ctx.attribute("MULTIPROCESSOR_COUNT")}
    shapes = {s.name: s for s in lk.LLAMA_DECODE[:4]}
    sel = {n: lk.select(lk.KernelCall("linear", s.attrs, s.dims), lk.TARGET) for n, s in shapes.items()}
    o_entry = lk.dataclasses.replace(sel["o"], kernel=sel["o"].kernel.removesuffix("t1"))
    if "--o-entry" in sys.argv:
        sel["o"] = o_entry
    sel["o_entry"] = o_entry  # --o-entry-fused: the fused chains' o (the baseline keeps the rule's)
    import attention_kernels as ak
    scal = ak.attn_scalars("B", 1, 16)
    achoice = lk.select(lk.KernelCall("attention_decode", dims=scal), lk.TARGET)
    mod = cd.Module(lk.build_cubin(sorted({c.kernel for c in sel.values()} | {achoice.kernel}), lk.TARGET))
    result["kernels"] = {n: c.kernel for n, c in sel.items()} | {"attention": achoice.kernel}
    keep: list = []

    def up(a: np.ndarray) -> int:
        b = cd.DeviceBuffer(max(a.nbytes, 256))
        b.upload(np.ascontiguousarray(a))
        keep.append(b)
        return b.ptr

    rng = np.random.default_rng(1)
    cases = {n: lk.host_case(s, seed=0) for n, s in shapes.items()}
    gu_tiles = pack_gate_up(cases["gate_up"]["weight"], cases["gate_up"]["scales"])
    dn_tiles = pack_down(cases["down"]["weight"])
    h0 = rng.standard_normal(H).astype(np.float16)
    h = up(h0)
    attn, qkv, mlp = up(rng.standard_normal(H).astype(np.float16)), up(np.zeros(3072, np.float16)), \
        up(np.zeros(INTER, np.float16))
    acc, counter = up(np.zeros(BLOCKS * H, np.float32)), up(np.zeros(64, np.uint32))  # RED 3: a row a block
    gamma = cases["gate_up"]["norm"]
    gamma_dev = up(gamma)
    dn_scales = cases["down"]["scales"].reshape(-1)

    def linear(name: str, layer_w: dict, x: int, out: int, res: int | None, choice: str | None = None) -> cd.KernelLaunch:
        s, c = shapes[name], sel[choice or name]
        vals = {"out": out, "x": x, "weight": layer_w[name], "scales": layer_w[name + ".s"], "zeros": None,
                "norm": layer_w[name + ".n"], "residual": res, "addend": None, **s.dims}
        return cd.KernelLaunch(mod.function(c.kernel), c.grid, c.block, c.smem,
                               cd.pack_args(lk.LINEAR, [vals[p.name] for p in lk.LINEAR]), pdl=c.pdl)

    table, inv = ak.rope_np(64)
    common = {"rope_table": up(table), "inv_freq": up(inv), "block_table": up(np.arange(16, dtype=np.int32)[None]),
              "positions": up(np.array([int(sys.argv[sys.argv.index("--position") + 1]) if "--position" in sys.argv else 227],
                                     np.int32)), "active": up(np.ones(1, np.int32)), **scal}
    abi = lk.KERNEL_ABI["attention_decode"]
    layers = []
    for _ in range(LAYERS):  # a copy of every weight per layer: 16 layers are > 8x the L2
        lw = {}
        for n, a in cases.items():
            lw[n], lw[n + ".s"] = up(a["weight"]), up(a["scales"])
            lw[n + ".n"] = up(a["norm"]) if shapes[n].norm else None
        lw["k_cache"], lw["v_cache"] = (up(rng.standard_normal((16, 8, 16, 64)).astype(np.float16)) for _ in range(2))
        lw["gu_tiles"], lw["dn_tiles"], lw["dn_scales"], lw["gamma"] = up(gu_tiles), up(dn_tiles), up(dn_scales), up(gamma)
        layers.append(lw)

    params = [lk.Param(n, lk.ArgKind.PTR) for n in ("gu", "dn", "dn_scales", "h1", "gamma", "acc", "counter", "out")] + \
             [lk.Param("eps", lk.ArgKind.F32)] + \
             [lk.Param(n, lk.ArgKind.PTR) for n in ("clear", "gu_scales", "gu_zeros", "dn_zeros")]
    clear_buf = up(np.zeros(H, np.float32))  # SEM bits (bench/mlp_probe.cu): mlp_decode's semantics
    gu_zeros = up(rng.uniform(5.0, 11.0, 2 * INTER).astype(np.float16))
    dn_zeros = up(rng.uniform(5.0, 11.0, H).astype(np.float16))
    fused_mods = {v: cd.Module(build(*v)) for v in variants}
    smem_probe = cd.DeviceBuffer(256)
    smem = {}
    for v, m in fused_mods.items():  # each variant's shared memory, as its kernel computes it
        g = cd.Graph([cd.KernelLaunch(m.function("mlp_smem_bytes"), (1, 1, 1), (1, 1, 1), 0,
                                      cd.pack_args([lk.Param("o", lk.ArgKind.PTR)], [smem_probe.ptr]))])
        g.launch(stream)
        stream.synchronize()
        g.close()
        smem[v] = int(smem_probe.download(0, 4).view(np.int32)[0])
    result["fused_smem"] = {str(v): b for v, b in smem.items()}

    def fused(v, lw: dict, x: int, out: int) -> cd.KernelLaunch:
        fn = fused_mods[v].function("mlp_fused")
        fn.require_smem(smem[v])
        return cd.KernelLaunch(fn, (BLOCKS, 1, 1), (32 * v[2], 1, 1), smem[v],
                               cd.pack_args(params, [lw["gu_tiles"], lw["dn_tiles"], lw["dn_scales"], x, lw["gamma"], acc,
                                                     counter, out, 1e-5, clear_buf, lw["gate_up.s"], gu_zeros,
                                                     dn_zeros]), pdl=True)

    from grokc.artifacts import mlp_tiles
    from grokc.targets import rules_mlp
    grokc_syms = sys.argv[sys.argv.index("--grokc") + 1].split(",") if "--grokc" in sys.argv else []
    gmod = cd.Module(lk.build_cubin(grokc_syms, lk.TARGET)) if grokc_syms else None
    accs = [up(np.zeros(H, np.float32)) for _ in range(2)]
    gabi = lk.KERNEL_ABI["mlp_decode"]

    def grokc_mlp(sym: str, lw: dict, layer: int) -> cd.KernelLaunch:
        if "gu_mlp_tiles" not in lw:  # grokc's gate/up layout has no scale tail (artifacts/mlp_tiles.py)
            lw["gu_mlp_tiles"] = up(mlp_tiles.pack(cases["gate_up"]["weight"], mlp_tiles.Part.GATE_UP, H, INTER))
        vals = {"acc": accs[layer % 2], "clear": accs[1 - layer % 2], "x": h, "norm": gamma_dev,
                "gate_up_tiles": lw["gu_mlp_tiles"], "gate_up_scales": lw["gate_up.s"], "gate_up_zeros": None,
                "down_tiles": lw["dn_tiles"], "down_scales": lw["down.s"], "down_zeros": None,
                "hidden": H, "inter": INTER, "eps": 1e-5}
        fn = gmod.function(sym)
        fn.require_smem(rules_mlp.smem_bytes(H))
        return cd.KernelLaunch(fn, (INTER // 64, 1, 1), (rules_mlp.THREADS, 1, 1), rules_mlp.smem_bytes(H),
                               cd.pack_args(gabi, [vals[p.name] for p in gabi]), pdl=True)

    def mlp_base(lw):
        return [linear("gate_up", lw, h, mlp, None), linear("down", lw, mlp, h, h)]

    def attention(lw: dict) -> cd.KernelLaunch:
        vals = {**common, "out": attn, "qkv": qkv, "k_cache": lw["k_cache"], "v_cache": lw["v_cache"]}
        return cd.KernelLaunch(mod.function(achoice.kernel), achoice.grid, achoice.block, achoice.smem,
                               cd.pack_args(abi, [vals[p.name] for p in abi]), pdl=achoice.pdl)

    def chain(mlp_of, with_attn_proj: bool = True) -> list:
        out = []
        o_sym = "o_entry" if "--o-entry-fused" in sys.argv and mlp_of is not mlp_base else "o"
        for layer, lw in enumerate(layers):
            lw["layer"] = layer
            if with_attn_proj:
                out += [linear("qkv", lw, h, qkv, None), attention(lw), linear("o", lw, attn, h, h, o_sym)]
            out += mlp_of(lw)
        return out

    def run_once(launches) -> np.ndarray:
        keep[0].upload(h0)  # h is the first buffer made
        g = cd.Graph(launches)
        g.launch(stream)
        stream.synchronize()
        g.close()
        return keep[0].download().view(np.float16).astype(np.float32)

    # correctness: one MLP against numpy, then the 16-layer chains against each other
    from grokc.runner.cpu import OPS
    ref = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in cases["gate_up"].items()}
    ref["x"] = h0[None]
    OPS["linear"](ref, shapes["gate_up"].attrs)
    ref2 = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in cases["down"].items()}
    ref2["x"], ref2["residual"] = ref["out"].astype(np.float16), h0[None].copy()
    OPS["linear"](ref2, shapes["down"].attrs)
    want = ref2["out"].reshape(-1).astype(np.float32)
    base_one = run_once(mlp_base(layers[0]))
    result["baseline_mlp_rel_err"] = float(np.linalg.norm(base_one - want) / np.linalg.norm(want))
    for v in variants:
        if v[1] in (0, 2):
            got = run_once([fused(v, layers[0], h, h)])
            result[f"fused{v}_mlp_rel_err"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            got2 = run_once([fused(v, layers[0], h, h)])
            result[f"fused{v}_repeat_max_diff"] = float(np.max(np.abs(got2 - got)))
    for sym in grokc_syms:  # one grokc MLP from zero sums: x + mlp(x) (ablations that skip work are wrong)
        zero = np.zeros(H, np.float32)
        for buf in keep:
            if buf.ptr in accs:
                buf.upload(zero)
        keep[0].upload(h0)
        g = cd.Graph([grokc_mlp(sym, layers[0], 0)])
        g.launch(stream)
        stream.synchronize()
        g.close()
        got = next(b for b in keep if b.ptr == accs[0]).download().view(np.float32)
        result[f"grokc_{sym}_mlp_rel_err"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    want16 = run_once(chain(mlp_base))
    for v in variants:
        if v[1] in (0, 2):
            got = run_once(chain(lambda lw, v=v: [fused(v, lw, h, h)]))
            result[f"fused{v}_16_layers_rel_err"] = float(np.linalg.norm(got - want16) / np.linalg.norm(want16))
    print(json.dumps(result), flush=True)
    if "--check-only" in sys.argv:
        return
    if "--ncu" in sys.argv:  # one launch of each kernel outside graphs, for Nsight Compute
        for launch in [fused(variants[0], layers[1], h, h)] + [grokc_mlp(sym, layers[1], 1) for sym in grokc_syms]:
            cd.launch(launch.function, launch.grid, launch.block, launch.smem, launch.args, stream)
        stream.synchronize()
        return

    # timing, µs per 16 layers; rounds interleaved
    timings: dict = {}
    for _ in range(3):
        for name, launches in [("base_qkv_o_mlp", chain(mlp_base)), ("base_mlp_only", chain(mlp_base, False))] + \
                [(f"fused{v}_qkv_o_mlp", chain(lambda lw, v=v: [fused(v, lw, h, h)])) for v in variants] + \
                [(f"fused{v}_mlp_only", chain(lambda lw, v=v: [fused(v, lw, h, h)], False)) for v in variants] + \
                [(f"grokc_{sym}_qkv_o_mlp", chain(lambda lw, sym=sym: [grokc_mlp(sym, lw, lw["layer"])]))
                 for sym in grokc_syms] + \
                [(f"grokc_{sym}_mlp_only", chain(lambda lw, sym=sym: [grokc_mlp(sym, lw, lw["layer"])], False))
                 for sym in grokc_syms]:
            us = timer.graph(launches, reps=reps)[0] * len(launches)
            timings.setdefault(name, []).append(round(us, 1))
    result["us_per_16_layers"] = timings
    result["ratio_fused_vs_base"] = {n: round(min(t) / min(timings["base_qkv_o_mlp" if "qkv" in n else "base_mlp_only"]), 3)
                                     for n, t in timings.items() if n.startswith(("fused", "grokc"))}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
