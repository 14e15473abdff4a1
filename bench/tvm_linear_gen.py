"""Generate the TVM (TensorIR + dlight) baselines of bench/linear_kernels.py, on a machine with no GPU.

    python bench/tvm_linear_gen.py            # writes bench/tvm_linear_kernels.json

Needs Apache TVM 0.27 (``pip install apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1``); the
device machine has no TVM, so the bench carries the CUDA source this writes and compiles it there
with nvcc. Each entry: the CUDA source, the kernel names in launch order with their grid, block,
dynamic shared memory and argument order (names of the PrimFunc's parameters), read off the host
code of TVM's own lowering (``T.call_ffi_kernel``), plus what the PrimFunc computes.

Workloads, all on the packed layout of ``artifacts/int4.py`` (``w`` viewed as u32 words):

- ``gemv_q4``: ``y[0, n] = f16(scale[n] * sum_k f32(x[0, k]) * (code[n, k] - 8))`` -- per-channel
  int4 with the scale after the sum, the form dlight's GEMV rule accepts (notes/tvm.md);
- ``gemv_f16``: ``y[0, n] = sum_k f32(x[0, k]) * f32(w[n, k])`` (f32 out, the LM head);
- ``matmul_f16``: ``y = f16(x @ w^T)`` with f32 accumulation, dlight's Matmul rule (WMMA);
- ``matmul_q4``: the int4 weights dequantised to f16 (code - 8) in a separate block, then the same
  matmul and the per-channel scale as epilogue.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "tvm_linear_kernels.json"

# Llama-3.2-1B decode shapes (NW rows x K) and one prefill GEMM.
GEMV_Q4 = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)]
GEMV_F16 = [(128256, 2048)]
MATMUL = [(512, 8192, 2048)]  # M, N, K


def _import_tvm():
    """Import TVM with the fast ``inspect.stack`` (notes/tvm.md: 31-47 s -> ~3 s, same output)."""
    orig = inspect.stack

    def fast_stack(context: int = 1):
        frames, f = [], sys._getframe(1)
        while f is not None:
            frames.append(inspect.FrameInfo(f, f.f_code.co_filename, f.f_lineno, f.f_code.co_name, None, None))
            f = f.f_back
        return frames

    inspect.stack = fast_stack
    try:
        import tvm
        import tvm.s_tir.dlight as dl
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the WMMA intrinsics Matmul needs)
        from tvm.script import tirx as T
    finally:
        inspect.stack = orig
    return tvm, dl, T


tvm, dl, T = _import_tvm()
from tvm.target import Target  # noqa: E402

TARGET = Target({"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": 49152,
                 "max_threads_per_block": 1024}, host={"kind": "llvm"})


def _code(w, vn, vk):
    """Code of element k in row n of the packed layout: nibble (k%8)//2 + 4*(k%2) of word k//8."""
    shift = T.Cast("uint32", (vk % 8) // 2 * 4 + vk % 2 * 16)
    return T.bitwise_and(T.shift_right(w[vn, vk // 8], shift), T.uint32(15))


def gemv_q4(n: int, k: int):
    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((1, k), "float16"), w: T.Buffer((n, k // 8), "uint32"), s: T.Buffer((n,), "float16"),
             y: T.Buffer((1, n), "float16")):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        acc = T.sblock_alloc_buffer((1, n), "float32")
        for i, j, r in T.grid(1, n, k):
            with T.sblock("gemv"):
                vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + T.Cast("float32", x[vi, vr]) * (T.Cast("float32", _code(w, vj, vr)) - T.float32(8))
        for i, j in T.grid(1, n):
            with T.sblock("scale"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("float16", acc[vi, vj] * T.Cast("float32", s[vj]))
    return func


def gemv_f16(n: int, k: int):
    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((1, k), "float16"), w: T.Buffer((n, k), "float16"), y: T.Buffer((1, n), "float32")):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        for i, j, r in T.grid(1, n, k):
            with T.sblock("gemv"):
                vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                with T.init():
                    y[vi, vj] = T.float32(0)
                y[vi, vj] = y[vi, vj] + T.Cast("float32", x[vi, vr]) * T.Cast("float32", w[vj, vr])
    return func


def matmul_f16(m: int, n: int, k: int):
    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((m, k), "float16"), w: T.Buffer((n, k), "float16"), y: T.Buffer((m, n), "float16")):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        acc = T.sblock_alloc_buffer((m, n), "float32")
        for i, j, r in T.grid(m, n, k):
            with T.sblock("matmul"):
                vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + T.Cast("float32", x[vi, vr]) * T.Cast("float32", w[vj, vr])
        for i, j in T.grid(m, n):
            with T.sblock("cast"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("float16", acc[vi, vj])
    return func


def matmul_q4(m: int, n: int, k: int):
    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((m, k), "float16"), w: T.Buffer((n, k // 8), "uint32"), s: T.Buffer((n,), "float16"),
             y: T.Buffer((m, n), "float16")):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        deq = T.sblock_alloc_buffer((n, k), "float16")
        acc = T.sblock_alloc_buffer((m, n), "float32")
        for j, r in T.grid(n, k):
            with T.sblock("decode"):
                vj, vr = T.axis.remap("SS", [j, r])
                deq[vj, vr] = T.Cast("float16", _code(w, vj, vr)) - T.float16(8)
        for i, j, r in T.grid(m, n, k):
            with T.sblock("matmul"):
                vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + T.Cast("float32", x[vi, vr]) * T.Cast("float32", deq[vj, vr])
        for i, j in T.grid(m, n):
            with T.sblock("scale"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("float16", acc[vi, vj] * T.Cast("float32", s[vj]))
    return func


_CALL = re.compile(r'T\.call_ffi_kernel\("(?P<name>[^"]+)", (?P<args>.*?), launch_params=\[(?P<lp>[^\]]*)\]')


def _launches(mod, params: list[str]) -> list[dict]:
    """Kernel launches of the lowered host code: name, argument order, grid, block, dynamic smem."""
    import tvm.tirx.build  # noqa: F401

    build = sys.modules["tvm.tirx.build"]
    bound = tvm.tirx.transform.BindTarget(TARGET)(mod)
    pipe, _, _ = tvm.tirx.get_default_tir_pipeline(TARGET)
    host, _ = build.split_host_device_mods(pipe(bound))
    launches = []
    for m in _CALL.finditer(host.script()):
        lp = [s.strip().strip('"') for s in m["lp"].split(",") if s.strip()]
        items = [s.strip() for s in m["args"].split(",")]
        dims = [int(re.sub(r"^T\.int\d+\((\d+)\)$", r"\1", v)) for v in items[len(items) - len(lp):]]
        bufs = [re.sub(r"(_\d+)?\.data$", "", v) for v in items[: len(items) - len(lp)]]
        if not all(b in params for b in bufs):
            raise RuntimeError(f"cannot map kernel arguments {bufs} to parameters {params}")
        grid, block, smem = [1, 1, 1], [1, 1, 1], 0
        for tag, v in zip(lp, dims):
            if tag.startswith("blockIdx."):
                grid["xyz".index(tag[-1])] = v
            elif tag.startswith("threadIdx."):
                block["xyz".index(tag[-1])] = v
            elif tag == "tirx.use_dyn_shared_memory":
                smem = v
            else:
                raise RuntimeError(f"unknown launch parameter {tag}")
        launches.append({"kernel": m["name"], "args": bufs, "grid": grid, "block": block, "smem": smem})
    return launches


def generate(name: str, func, rules) -> dict:
    mod = tvm.IRModule({"main": func})
    with TARGET:
        mod = dl.ApplyDefaultSchedule(*rules)(mod)
    ex = tvm.compile(mod, target=TARGET)
    params = [p.name for p in func.params]
    return {"name": name, "params": params, "source": ex.mod.imports[0].inspect_source("cuda"),
            "launches": _launches(mod, params)}


def main() -> None:
    gemv_rules = (dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback())
    mm_rules = (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback())
    entries = []
    for n, k in GEMV_Q4:
        entries.append(generate(f"tvm_gemv_q4_{n}x{k}", gemv_q4(n, k), gemv_rules))
    for n, k in GEMV_F16:
        entries.append(generate(f"tvm_gemv_f16_{n}x{k}", gemv_f16(n, k), gemv_rules))
    for m, n, k in MATMUL:
        entries.append(generate(f"tvm_matmul_f16_{m}x{n}x{k}", matmul_f16(m, n, k), mm_rules))
        entries.append(generate(f"tvm_matmul_q4_{m}x{n}x{k}", matmul_q4(m, n, k), mm_rules))
    for e in entries:
        print(f"{e['name']}: " + "; ".join(f"{l['kernel']} grid {l['grid']} block {l['block']} smem {l['smem']}"
                                           for l in e["launches"]))
    OUT.write_text(json.dumps({"tvm": tvm.__version__, "arch": "sm_90", "kernels": entries}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
