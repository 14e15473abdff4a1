"""Kernel rules for ``mlp_decode`` and its ``pack_mlp_tiles`` (kernels in ``kernels/mlp_decode.cuh``).

Same module protocol as ``rules_misc``: ``RULES``, ``HEADERS`` and ``kernel_source(symbol)``.

- ``mlp_decode.split_k``: one block of 512 threads per 64 intermediate outputs, the block's 8
  gate/up tiles and its down slice (artifacts/mlp_tiles.py) staged whole in shared memory by bulk
  copies (``102 H + 2560`` bytes), down's partial sums added with vector reductions. sm_90 and newer
  (bulk copies, mbarriers, ``red.v4.f32``), ``H`` a multiple of 256 up to 2048 (the staged weights
  must fit), ``I`` a multiple of 64, q4 per output channel; one symbol per ``H``
  (``mlp_decode_q4_h<H>``: the loops' trip counts are constants). Its launch carries a programmatic
  edge and lets the next launch in at its entry: its blocks request their weights while the launch
  before (the attention output projection) finishes. Registers are capped at 64 a thread
  (``__launch_bounds__(512, 2)``; shared memory still allows one block an SM): 32 K registers are
  left for a block of the next layer's qkv GEMV (256 threads of up to 128), which then joins the
  SM and loads its weights while the MLP runs (docs/performance.md, run 91: 496.9 against 514.2 µs
  a step uncapped, 71 registers).
- ``pack_mlp_tiles.grid_stride``: a word of the layout a thread, 256 threads a block, at most 4096
  blocks (it runs once, at load).

There is no fallback kernel: ``passes/fuse_decode_mlp.py`` creates the ops only where ``fits`` says
this rule answers, for every target of the build (``compiler/build.py``).
"""

from __future__ import annotations

import re

from grokc.targets.base import Feature, KernelCall, KernelChoice, KernelRule, Target, c_params

HEADERS: tuple[str, ...] = ("common.cuh", "pdl.cuh", "mlp_decode.cuh")

THREADS = 512       # grokc::mlp::kThreads
UNITS = 64          # grokc::mlp::kUnits: intermediate outputs per block
NEEDS = (Feature.BULK_COPY, Feature.VECTOR_RED)
MAX_HIDDEN = 2048
PACK_SYMBOL = "pack_mlp_tiles"
PACK_THREADS = 256
_PTR_TYPES = {"acc": "float*", "clear": "float*", "x": "const half*", "norm": "const half*",
              "gate_up_tiles": "const uint8_t*", "gate_up_scales": "const half*", "gate_up_zeros": "const half*",
              "down_tiles": "const uint8_t*", "down_scales": "const half*", "down_zeros": "const half*",
              "out": "uint8_t*", "weight": "const uint8_t*"}


def symbol(hidden: int) -> str:
    return f"mlp_decode_q4_h{hidden}"


def smem_bytes(hidden: int) -> int:
    """Dynamic shared memory of a launch, as mlp_decode.cuh lays it out (MLP_DECODE_SMEM)."""
    return 102 * hidden + 2560


def shape_ok(hidden: int, inter: int) -> bool:
    """Sizes the kernel is written for (whatever the target)."""
    return hidden % 256 == 0 and 256 <= hidden <= MAX_HIDDEN and inter % UNITS == 0 and inter >= UNITS


def available(target: Target) -> bool:
    """Whether ``target`` can run the kernel at all (the pipeline adds the fusion pass only then)."""
    return all(target.has(f) for f in NEEDS) and not target.deterministic


def fits(target: Target, hidden: int, inter: int) -> bool:
    """Whether ``split_k`` takes a batch-1 MLP of these sizes on ``target`` (the fusion pass asks);
    never in a deterministic build (its down sums are f32 vector reductions in any order)."""
    return (available(target) and shape_ok(hidden, inter)
            and smem_bytes(hidden) <= target.smem_per_block)


def split_k(call: KernelCall, target: Target) -> KernelChoice | None:
    h, i = int(call.dims["hidden"]), int(call.dims["inter"])
    if call.attrs.get("weight_format", "q4") != "q4" or not fits(target, h, i):
        return None
    return KernelChoice(symbol(h), (i // UNITS, 1, 1), (THREADS, 1, 1), smem_bytes(h), "mlp_decode.split_k", pdl=True)


def grid_stride(call: KernelCall, target: Target) -> KernelChoice | None:
    h, i = int(call.dims["hidden"]), int(call.dims["inter"])
    if not fits(target, h, i):
        return None
    words = h * i // 4  # either part: (2 I x H or H x I codes) / 8
    blocks = min(4096, -(-words // PACK_THREADS))
    return KernelChoice(PACK_SYMBOL, (blocks, 1, 1), (PACK_THREADS, 1, 1), 0, "pack_mlp_tiles.grid_stride")


RULES: dict[str, list[KernelRule]] = {"mlp_decode": [split_k], "pack_mlp_tiles": [grid_stride]}


_MLP = re.compile(r"mlp_decode_q4_h(?P<h>[1-9]\d*)")


def kernel_source(symbol_: str) -> str | None:
    """The entry point ``symbol_`` as C++ over ``HEADERS``, or None when it is not this module's."""
    if symbol_ == PACK_SYMBOL:
        decl, args = c_params("pack_mlp_tiles", _PTR_TYPES)
        return (f'extern "C" __global__ void __launch_bounds__({PACK_THREADS}) {PACK_SYMBOL}({decl}) {{\n'
                f"  grokc::mlp::pack_mlp_tiles({args});\n}}\n")
    m = _MLP.fullmatch(symbol_)
    if m is None or not shape_ok(int(m["h"]), UNITS):
        return None
    decl, args = c_params("mlp_decode", _PTR_TYPES)
    return (f'extern "C" __global__ void __launch_bounds__({THREADS}, 2) {symbol_}({decl}) {{\n'
            f"  grokc::mlp::mlp_decode<{m['h']}>({args});\n}}\n")
