"""TVM's code for a ``linear`` call: TensorIR from TE, dlight's default GPU schedule, and the CUDA
source, launch shape and argument order TVM's own lowering gives it. No GPU and no nvcc needed.

Imported only when a TVM candidate is asked for (``rules_tvm.load``); needs Apache TVM 0.27
(``pip install 'grokc[tvm]'``: ``apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1``;
/work/shared/notes/tvm.md has why the ffi pin). ``generate(spec)`` is a pure function of the spec:
the same spec gives the same source (tests/targets/test_tvm_rules.py checks it across processes).

What the PrimFunc computes, on the op's own layouts (``abi/ops.py``, ``abi/int4.py``):

- q4, M = 1 (dlight's GEMV rule): ``acc[i, j] = sum_k f32(x[i, k]) * (f32(code[j, k]) - 8)``, the
  per-channel scale applied after the sum (the form the GEMV rule accepts; inside the sum it refuses);
- q4, M > 1 (dlight's Matmul rule, 16x16x16 WMMA): the codes dequantised to f16 ``code - 8`` in a
  block of their own that the schedule inlines into the shared-memory load, then the same sum;
- f16: ``acc[i, j] = sum_k f32(x[i, k]) * f32(w[j, k])``;
- with ``zeros``, ``z[j]`` (f16) takes the place of the code 8 (in the sum at M = 1: dlight then
  schedules it as a reduction, one block per row, not as a GEMV);
- epilogue: ``y[i, j] = out_dtype(acc[i, j] * f32(s[j]) + f32(res[i, j]))`` (no ``s`` for f16,
  no ``res`` without a residual), one rounding.

The codes are read as u32 words ``w[j, k // 8]``, nibble ``(k % 8) // 2 + 4 (k % 2)``.
"""

from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# TVM's parameter names: the PrimFunc's buffers, and the kernel ABI parameter each one is.
PARAMS = {"x": "x", "w": "weight", "s": "scales", "z": "zeros", "res": "residual", "y": "out"}
# dlight's default GPU rules, in ApplyDefaultSchedule order (the first that applies schedules a block)
TVM_TARGET = {"kind": "cuda", "arch": "sm_80", "max_shared_memory_per_block": 49152, "max_threads_per_block": 1024}


@dataclass(frozen=True)
class Generated:
    """One kernel as TVM emitted it."""

    source: str                  # TVM's whole CUDA translation unit (its prelude, then the kernel)
    kernel: str                  # the kernel's name in it
    args: tuple[str, ...]        # the kernel's pointer parameters in order, as PARAMS keys
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int                    # dynamic shared memory, bytes
    version: str                 # TVM's version


def _fast_stack(context: int = 1) -> list:
    """``inspect.stack`` without reading source lines: TVMScript's decorators call it per frame, which made
    ``import tvm.s_tir.tensor_intrin`` take 31-47 s (notes/tvm.md); the generated code is the same."""
    frames, f = [], sys._getframe(1)
    while f is not None:
        frames.append(inspect.FrameInfo(f, f.f_code.co_filename, f.f_lineno, f.f_code.co_name, None, None))
        f = f.f_back
    return frames


@lru_cache(maxsize=1)
def _tvm() -> Any:
    orig = inspect.stack
    inspect.stack = _fast_stack
    try:
        import tvm
        import tvm.s_tir.dlight  # noqa: F401
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the WMMA intrinsics of dlight's Matmul)
        import tvm.tirx.build  # noqa: F401
        from tvm import te  # noqa: F401
    finally:
        inspect.stack = orig
    return tvm


def _code(tvm, w, j, k):
    shift = ((k % 8) // 2 * 4 + k % 2 * 16).astype("uint32")
    return (w[j, k // 8] >> shift) & tvm.tirx.const(15, "uint32")


def prim_func(tvm, wf: str, out: str, zeros: bool, residual: bool, m: int, n: int, k: int):
    """The PrimFunc of a linear call (module doc); its parameters in ``PARAMS`` names."""
    te = tvm.te
    f32 = "float32"
    x = te.placeholder((m, k), "float16", "x")
    r = te.reduce_axis((0, k), "r")
    if wf == "q4":
        w = te.placeholder((n, k // 8), "uint32", "w")
        s = te.placeholder((n,), "float16", "s")
        ins = [x, w, s]
        dq = "float16" if m > 1 else f32  # the codes minus their zero, in the type the product reads
        if zeros:
            z = te.placeholder((n,), "float16", "z")
            ins.append(z)

            def zero(j):
                return z[j].astype(dq)
        else:
            def zero(j):
                return tvm.tirx.const(8, dq)
        if m > 1:
            deq = te.compute((n, k), lambda j, kk: _code(tvm, w, j, kk).astype(dq) - zero(j), name="deq")
            acc = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype(f32) * deq[j, r].astype(f32), axis=r), name="acc")
        else:
            acc = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype(f32) * (_code(tvm, w, j, r).astype(f32) - zero(j)),
                                                         axis=r), name="acc")

        def scaled(i, j):
            return acc[i, j] * s[j].astype(f32)
    else:
        w = te.placeholder((n, k), "float16", "w")
        acc = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype(f32) * w[j, r].astype(f32), axis=r), name="acc")
        ins = [x, w]

        def scaled(i, j):
            return acc[i, j]
    dtype = {"f16": "float16", "f32": f32}[out]
    if residual:
        res = te.placeholder((m, n), "float16", "res")
        ins.append(res)
        y = te.compute((m, n), lambda i, j: (scaled(i, j) + res[i, j].astype(f32)).astype(dtype), name="y")
    else:
        y = te.compute((m, n), lambda i, j: scaled(i, j).astype(dtype), name="y")
    return te.create_prim_func([*ins, y]).with_attr("global_symbol", "main")


_CALL = re.compile(r'T\.call_ffi_kernel\("(?P<name>[^"]+)", (?P<args>.*?), launch_params=\[(?P<lp>[^\]]*)\]')


def _launches(tvm, mod, target) -> list[tuple[str, list[str], list[int], list[int], int]]:
    """(kernel, pointer args, grid, block, dynamic smem) of each launch in TVM's lowered host code."""
    bound = tvm.tirx.transform.BindTarget(target)(mod)
    pipe, _, _ = tvm.tirx.get_default_tir_pipeline(target)
    host, _ = sys.modules["tvm.tirx.build"].split_host_device_mods(pipe(bound))
    launches = []
    for m in _CALL.finditer(host.script()):
        lp = [s.strip().strip('"') for s in m["lp"].split(",") if s.strip()]
        items = [s.strip() for s in m["args"].split(",")]
        dims = [int(re.sub(r"^T\.int\d+\((\d+)\)$", r"\1", v)) for v in items[len(items) - len(lp):]]
        bufs = [re.sub(r"(_\d+)?\.data$", "", v) for v in items[: len(items) - len(lp)]]
        grid, block, smem = [1, 1, 1], [1, 1, 1], 0
        for tag, v in zip(lp, dims):
            if tag.startswith("blockIdx."):
                grid["xyz".index(tag[-1])] = v
            elif tag.startswith("threadIdx."):
                block["xyz".index(tag[-1])] = v
            elif tag == "tirx.use_dyn_shared_memory":
                smem = v
            else:
                raise ValueError(f"TVM launch parameter {tag!r} is not one grokc reads")
        launches.append((m["name"], bufs, grid, block, smem))
    return launches


def generate(wf: str, out: str, zeros: bool, residual: bool, m: int, n: int, k: int) -> Generated | None:
    """TVM's kernel for the call, or None when dlight's schedule needs more than one launch (or reads a
    buffer grokc does not pass)."""
    tvm = _tvm()
    dl = tvm.s_tir.dlight
    target = tvm.target.Target(TVM_TARGET, host={"kind": "llvm"})
    mod = tvm.IRModule({"main": prim_func(tvm, wf, out, zeros, residual, m, n, k)})
    with target:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Reduction(),
                                      dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)
    launches = _launches(tvm, mod, target)
    if len(launches) != 1 or not set(launches[0][1]) <= set(PARAMS):
        return None
    name, args, grid, block, smem = launches[0]
    source = tvm.compile(mod, target=target).mod.imports[0].inspect_source("cuda")
    return Generated(source, name, tuple(args), tuple(grid), tuple(block), smem, tvm.__version__)
