"""Kernel rules for the mixture-of-experts ops (``kernels/moe.cuh``): ``moe_route``, ``moe_gather``,
``moe_linear``, ``moe_combine``.

- ``moe_route``: one block of ``ROUTE_THREADS`` (the routing of a bucket is a few microseconds of
  work; its phases need the whole bucket's counts), for up to ``MAX_ROUTED`` routed experts and
  ``MAX_STACKED`` stacked ones.
- ``moe_gather``: one warp per row, ``GATHER_WARPS`` rows a block (``hidden % 8 == 0``).
- ``moe_linear``, in order: ``gemv2`` when no expert can have more than 8 rows (``T <= 8``: decode),
  linear_gemv2.cuh's body per active expert with the tiling ``rules_linear.gemv2_variant`` picks
  for one expert's rows (``M = T``) on its share of the SMs (the up to ``min(E', R)`` experts with
  rows run side by side), grid ``(blocks of N, min(E', R))``; ``gemm`` (prefill),
  linear_gemm.cuh's body per tile of an expert's rows, the tile ``rules_linear.gemm_variant``
  picks for ``M = R``, grid ``(blocks of N, ceil(R / BM) + min(E', R))``; ``ref``, one thread per
  output. Symbols are ``moe_`` + the linear variant's (``moe_linear_gemv2_q4_silu_f16_r1k4...``).
  Both fast families need ``Feature.MMA_F16``; ``ref`` runs anywhere.
- ``moe_combine``: one block of ``COMBINE_THREADS`` per token.

Same module protocol as ``rules_linear``: ``RULES``, ``HEADERS``, ``kernel_source(symbol)``.
"""

from __future__ import annotations

import dataclasses

from grokc.targets import rules_linear
from grokc.targets.base import Feature, KernelCall, KernelChoice, KernelRule, Target, c_params
from grokc.targets.linear_variants import REF_THREADS, Gemm, Gemv2, Ref, _bounds, _cpp_common

HEADERS: tuple[str, ...] = ("common.cuh", "pdl.cuh", "linear_common.cuh", "linear_gemv2.cuh", "linear_gemm.cuh",
                            "linear_ref.cuh", "moe.cuh")

ROUTE_THREADS = 256    # grokc::moe::ROUTE_THREADS
MAX_ROUTED = 256       # grokc::moe::MAX_ROUTED
MAX_STACKED = 1024     # grokc::moe::MAX_STACKED
GATHER_WARPS = 8
COMBINE_THREADS = 256
GEMM_STATIC_SMEM = 64  # gemm_tile's own shared variables, beside the body's dynamic shared memory

_PTR_TYPES = {
    "moe_route": {"weights": "float*", "slot_rows": "int*", "row_token": "int*", "offsets": "int*", "active": "int*",
                  "logits": "const float*", "n_real": "const int*"},
    "moe_gather": {"out": "half*", "x": "const half*", "norm": "const half*", "row_token": "const int*",
                   "offsets": "const int*"},
    "moe_combine": {"out": "half*", "y": "const float*", "weights": "const float*", "slot_rows": "const int*",
                    "residual": "const half*"},
}
_SOURCES = {  # symbol -> (op, device function, threads)
    "moe_route": ("moe_route", "grokc::moe::route", ROUTE_THREADS),
    f"moe_gather_w{GATHER_WARPS}": ("moe_gather", f"grokc::moe::gather<{GATHER_WARPS}>", 32 * GATHER_WARPS),
    "moe_combine": ("moe_combine", "grokc::moe::combine", COMBINE_THREADS),
}


def rule_route(call: KernelCall, target: Target) -> KernelChoice | None:
    d = call.dims
    e, k, c = int(d["n_experts"]), int(d["top_k"]), int(d["n_shared"])
    if not 1 <= k <= e <= MAX_ROUTED or c < 0 or e + c > MAX_STACKED:
        return None
    return KernelChoice("moe_route", (1, 1, 1), (ROUTE_THREADS, 1, 1), 0, "moe.route")


def rule_gather(call: KernelCall, target: Target) -> KernelChoice | None:
    if int(call.dims["hidden"]) % 8:
        return None
    symbol = f"moe_gather_w{GATHER_WARPS}"
    return KernelChoice(symbol, (-(-int(call.dims["R"]) // GATHER_WARPS), 1, 1), (32 * GATHER_WARPS, 1, 1), 0,
                        "moe.gather")


def rule_combine(call: KernelCall, target: Target) -> KernelChoice | None:
    return KernelChoice("moe_combine", (int(call.dims["T"]), 1, 1), (COMBINE_THREADS, 1, 1), 0, "moe.combine")


def _moe_linear(call: KernelCall, m: int) -> rules_linear._Linear | None:
    """The call as ``rules_linear`` sees one expert's product of ``m`` rows."""
    d = call.dims
    if call.attrs.get("weight_format") not in ("f16", "q4"):
        return None
    dims = {"M": m, "N": d["N"], "K": d["K"], "group_size": d["group_size"]}
    return rules_linear._linear(KernelCall("linear", dict(call.attrs), dims))


def _stacked_rows(call: KernelCall) -> tuple[int, int]:
    """``(R, most experts with rows)`` of a moe_linear call."""
    r = int(call.dims["R"])
    return r, min(int(call.dims["n_experts"]), r)


def rule_gemv2(call: KernelCall, target: Target) -> KernelChoice | None:
    t = int(call.dims["T"])
    if not target.has(Feature.MMA_F16) or t > rules_linear.GEMV2_MAX_M:
        return None
    lin = _moe_linear(call, t)
    if lin is None or not lin.gemv2_ok:
        return None
    experts = _stacked_rows(call)[1]
    # the experts' GEMVs run side by side: each is tiled as if it had its share of the SMs
    v = rules_linear.gemv2_variant(lin, dataclasses.replace(target, num_sms=max(1, target.num_sms // experts)))
    smem = v.smem(lin.m, lin.k)
    if smem > target.smem_per_block:
        return None
    return KernelChoice(f"moe_{v.symbol}", (v.blocks(lin.n), experts, 1), (v.threads, 1, 1), smem, "moe.gemv2")


def rule_gemm(call: KernelCall, target: Target) -> KernelChoice | None:
    r, experts = _stacked_rows(call)
    lin = _moe_linear(call, r)
    if not target.has(Feature.MMA_F16) or lin is None or not lin.fast_ok:
        return None
    v = rules_linear.gemm_variant(lin, target)
    if v is None or v.smem() + GEMM_STATIC_SMEM > target.smem_per_block:
        return None
    return KernelChoice(f"moe_{v.symbol}", (v.grid(r, lin.n)[0], -(-r // v.bm) + experts, 1), (v.threads, 1, 1),
                        v.smem(), "moe.gemm")


def rule_ref(call: KernelCall, target: Target) -> KernelChoice | None:
    lin = _moe_linear(call, 1)
    if lin is None:
        return None
    v = Ref(lin.fmt, lin.act, lin.out)
    return KernelChoice(f"moe_{v.symbol}", (-(-lin.n // REF_THREADS), int(call.dims["R"]), 1), (REF_THREADS, 1, 1), 0,
                        "moe.ref")


RULES: dict[str, list[KernelRule]] = {
    "moe_route": [rule_route],
    "moe_gather": [rule_gather],
    "moe_linear": [rule_gemv2, rule_gemm, rule_ref],
    "moe_combine": [rule_combine],
}


def _linear_source(symbol: str) -> str | None:
    v = rules_linear.parse(symbol.removeprefix("moe_"))
    decl, args = c_params("moe_linear", {"out": "void*", "x": "const half*", "weight": "const void*",
                                         "scales": "const half*", "zeros": "const half*", "offsets": "const int*",
                                         "active": "const int*"})
    common = _cpp_common(v.wf, v.act, v.out) if isinstance(v, (Gemv2, Gemm, Ref)) else None
    if isinstance(v, Gemv2) and not v.io:
        bounds, body = _bounds(v.threads, max(1, v.minb)), (f"linear_gemv2<{common}, {v.r}, {v.ks}, {v.wn}, {v.d}, "
                                                          f"{v.pf}, {v.nl}, {v.tr}>")
    elif isinstance(v, Gemm):
        bounds, body = _bounds(v.threads, v.minb), f"linear_gemm<{common}, {v.bm}, {v.bn}, {v.wm}, {v.wn}, {v.stages}>"
    elif isinstance(v, Ref) and not v.io:
        bounds, body = _bounds(REF_THREADS, 0), f"linear_ref<{common}>"
    else:
        return None
    return f'extern "C" __global__ void {bounds} {symbol}({decl}) {{ grokc::moe::{body}({args}); }}\n'


def kernel_source(symbol: str) -> str | None:
    """The entry point ``symbol`` as C++ over ``HEADERS``, or None when it is not one of these ops."""
    if symbol.startswith("moe_linear_"):
        return _linear_source(symbol)
    if symbol not in _SOURCES:
        return None
    op, body, threads = _SOURCES[symbol]
    decl, args = c_params(op, _PTR_TYPES[op])
    return (f'extern "C" __global__ void __launch_bounds__({threads}) {symbol}({decl}) {{\n'
            f"  grokc_pdl_entry();\n  {body}({args});\n}}\n")
