"""Kernel rules for ``attention_prefill`` and ``attention_decode`` (kernels in ``kernels/attention_*.cuh``).

Module protocol (read by ``targets/select.py`` and ``targets/nvcc.py``):

- ``RULES``: op -> ordered rules, fallback last; a rule is ``(call, target) -> KernelChoice | None``.
- ``HEADERS``: the headers under ``targets/kernels/`` a translation unit includes for these kernels.
- ``kernel_source(symbol)``: the C++ defining the ``extern "C" __global__`` entry point ``symbol``
  (a wrapper instantiating a template of the headers), or ``None`` when the symbol is not ours.

Every kernel's C parameter list is exactly ``KERNEL_ABI[op]``. The symbol names the template
arguments (``attn_decode_mma_d64_w4_s4_c8``), so the source is a function of the symbol alone.

Rules, in order:

- prefill: ``prefill_mma`` (tensor-core flash attention; head_dim 64 or 128) then ``prefill_ref``
  (any even head_dim; scores of one row in shared memory, so ``(L + head_dim) * 4`` bytes must fit).
- decode: ``decode_split`` (flash decoding on tensor cores; head_dim 64 or 128, at most 16 query
  heads per kv head; on sm90+ the blocks of one (slot, kv head) form a thread-block cluster of
  ``CS`` and merge through distributed shared memory, so one sequence at long context still spreads
  over ``B * n_kv_heads * CS`` multiprocessors) then ``decode_ref`` (any even head_dim; the
  ``max_blocks * 16`` scores of a slot in shared memory).
"""

from __future__ import annotations

import re

from grokc.abi.ops import KV_BLOCK_SIZE
from grokc.targets.base import Feature, KernelCall, KernelChoice, KernelRule, Target, c_params

CLUSTER_MIN_CONTEXT = 4096
EARLY_MIN_BATCH = 2  # decode attention loads its first cache blocks before the wait from this many slots on
HEADERS: tuple[str, ...] = ("pdl.cuh", "attention_common.cuh", "attention_prefill.cuh", "attention_decode.cuh")

_PTR_TYPES = {
    "out": "half*", "qkv": "const half*", "rope_table": "const float*", "inv_freq": "const float*",
    "k_cache": "half*", "v_cache": "half*", "block_table": "const int*", "slot": "const int*",
    "n_real": "const int*", "positions": "const int*", "active": "const int*",
}
_MMA_HEAD_DIMS = (64, 128)  # the swizzled tiles need head_dim % 64 == 0; register budget caps it at 128
_MAX_GROUP = 16             # query heads per kv head: the 16 rows of one m16n8k16 tile


def _dims(call: KernelCall) -> tuple[int, int, int]:
    return int(call.dims["n_heads"]), int(call.dims["n_kv_heads"]), int(call.dims["head_dim"])


def _heads_ok(nh: int, nkv: int, d: int) -> bool:
    return nkv > 0 and nh % nkv == 0 and d > 0 and d % 2 == 0


# -- prefill ----------------------------------------------------------------------------------

_PREFILL_BM = 64  # query rows per block (PrefillMma::kBM)


def _prefill_tile(d: int) -> int:
    """Key tile of the mma prefill: 64 keys at head_dim 64, 32 at 128 (keeps 128 threads <= 168 regs)."""
    return 64 if d == 64 else 32


def prefill_mma_smem(d: int, bn: int) -> int:
    return (_PREFILL_BM + 4 * bn) * d * 2  # PrefillMma::kSmem


def prefill_mma(call: KernelCall, target: Target) -> KernelChoice | None:
    nh, nkv, d = _dims(call)
    if not _heads_ok(nh, nkv, d) or d not in _MMA_HEAD_DIMS or not target.has(Feature.MMA_F16):
        return None
    bn = _prefill_tile(d)
    smem = prefill_mma_smem(d, bn)
    if smem > target.smem_per_block:
        return None
    L = int(call.dims["L"])
    return KernelChoice(f"attn_prefill_mma_d{d}_n{bn}", (-(-L // _PREFILL_BM), nh, 1), (128, 1, 1), smem,
                        "prefill_mma")


def prefill_ref(call: KernelCall, target: Target) -> KernelChoice | None:
    nh, nkv, d = _dims(call)
    L = int(call.dims["L"])
    smem = (L + d) * 4
    if not _heads_ok(nh, nkv, d) or smem > target.smem_per_block:
        return None
    return KernelChoice("attn_prefill_ref", (L, nh, 1), (128, 1, 1), smem, "prefill_ref")


# -- decode -----------------------------------------------------------------------------------


def decode_mma_smem(d: int, warps: int, stages: int) -> int:
    ch = d // 8
    return (16 * ch + 2 * ch + warps * stages * 2 * KV_BLOCK_SIZE * ch) * 16 + (32 + 16 * d) * 4  # DecodeMma::kSmem


def decode_edge(target: Target, cs: int) -> bool:
    """Whether a decode-attention launch of cluster size ``cs`` joins the launch before it by a
    programmatic edge: on sm_90+, without clusters (a cluster launch cannot start early)."""
    return target.has(Feature.PDL) and cs == 1


def decode_split(call: KernelCall, target: Target) -> KernelChoice | None:
    """Split-K decode: as many blocks per (slot, kv head) as make the grid cover the chip.

    The cluster size is the largest of 1, 2, 4, 8 with ``B * n_kv_heads * CS <= num_sms`` (one
    wave; sm90+ with contexts past ``CLUSTER_MIN_CONTEXT`` only; otherwise CS = 1 and 8 warps when
    the grid is small), capped so that every
    warp has two cache blocks at the longest context (``max_blocks``). Then the deepest cp.async ring
    (4..2 stages) whose shared memory fits the target.

    Without clusters (a cluster launch cannot start early) the launch joins the qkv GEMV by a
    programmatic edge on sm_90+. From ``EARLY_MIN_BATCH`` slots on it is the ``_early`` variant,
    which issues its first cache loads before ``griddepcontrol.wait``, overlapping the GEMV; below,
    the plain kernel waits at entry. Measured on the H200 (Llama-1B shape, context ~200): batch 8
    0.731 -> 0.701 ms a step with ``_early``; at batch 1 ``_early`` lost (0.540 -> 0.546: its blocks
    hold SMs the GEMVs before them still need) while the plain kernel with the edge gained
    (decode_1 graph 514.8 -> 506.1 µs at context 128, eighth session).
    """
    nh, nkv, d = _dims(call)
    if (not _heads_ok(nh, nkv, d) or d not in _MMA_HEAD_DIMS or nh // nkv > _MAX_GROUP
            or not target.has(Feature.MMA_F16)):
        return None
    batch, max_blocks = int(call.dims["B"]), int(call.dims["max_blocks"])
    pairs = batch * nkv
    # Clusters split one (slot, kv head) over up to 8 SMs, which only pays at long contexts; a
    # cluster launch also cannot overlap the kernel before it (programmatic dependent launch),
    # measured on the H200 at +47 us per Llama-1B decode step (16 launches). So: clusters only
    # when the context can exceed CLUSTER_MIN_CONTEXT tokens.
    clusters = target.has(Feature.CLUSTERS) and max_blocks * KV_BLOCK_SIZE > CLUSTER_MIN_CONTEXT
    warps = 4 if clusters or pairs >= target.num_sms else 8
    cs = 1
    if clusters:
        while cs < 8 and 2 * pairs * cs <= target.num_sms and 4 * cs * warps <= max_blocks:
            cs *= 2
    for stages in (4, 3, 2):
        for w in (warps, 4):
            smem = decode_mma_smem(d, w, stages)
            if smem <= target.smem_per_block:
                pdl = decode_edge(target, cs)
                early = pdl and batch >= EARLY_MIN_BATCH
                return KernelChoice(f"attn_decode_mma_d{d}_w{w}_s{stages}_c{cs}" + ("_early" if early else ""),
                                    (nkv * cs, batch, 1),
                                    (32 * w, 1, 1), smem, "decode_split" + ("_cluster" if cs > 1 else ""), pdl=pdl)
    return None


def decode_ref(call: KernelCall, target: Target) -> KernelChoice | None:
    nh, nkv, d = _dims(call)
    smem = (int(call.dims["max_blocks"]) * KV_BLOCK_SIZE + d) * 4
    if not _heads_ok(nh, nkv, d) or smem > target.smem_per_block:
        return None
    return KernelChoice("attn_decode_ref", (nh, int(call.dims["B"]), 1), (128, 1, 1), smem, "decode_ref")


RULES: dict[str, list[KernelRule]] = {
    "attention_prefill": [prefill_mma, prefill_ref],
    "attention_decode": [decode_split, decode_ref],
}


# -- sources ----------------------------------------------------------------------------------

_PREFILL_MMA = re.compile(r"attn_prefill_mma_d(\d+)_n(\d+)")
# decode symbols, groups: head_dim, warps, stages, cluster size, "_early" (bench/probes/plan_variants.py parses them)
DECODE_MMA = re.compile(r"attn_decode_mma_d(\d+)_w(\d+)_s(\d+)_c(\d+)(_early)?")


def _entry(symbol: str, op: str, body: str, threads: int, cluster: int = 1, min_blocks: int = 0,
           waits_inside: bool = False) -> str:
    """The ``extern "C"`` wrapper; ``waits_inside``: the body calls ``grokc_pdl_wait`` and triggers itself."""
    decl, args = c_params(op, _PTR_TYPES)
    attrs = f"__cluster_dims__({cluster}, 1, 1) " if cluster > 1 else ""
    bounds = f"{threads}, {min_blocks}" if min_blocks else f"{threads}"
    entry = "" if waits_inside else "  grokc_pdl_entry();\n"
    return (f'extern "C" __global__ void {attrs}__launch_bounds__({bounds}) {symbol}({decl}) {{\n'
            f"{entry}  {body}({args});\n}}\n")


def kernel_source(symbol: str) -> str | None:
    """The entry point ``symbol`` as C++ over ``HEADERS``, or None when it is not an attention kernel."""
    if symbol == "attn_prefill_ref":
        return _entry(symbol, "attention_prefill", "grokc_attn::attention_prefill_ref", 128)
    if symbol == "attn_decode_ref":
        return _entry(symbol, "attention_decode", "grokc_attn::attention_decode_ref", 128)
    if m := _PREFILL_MMA.fullmatch(symbol):
        d, bn = map(int, m.groups())
        return _entry(symbol, "attention_prefill", f"grokc_attn::attention_prefill_mma<{d}, {bn}>", 128)
    if m := DECODE_MMA.fullmatch(symbol):
        d, w, st, cs = map(int, m.groups()[:4])
        early = m.group(5) is not None
        # one block per multiprocessor is the plan (min_blocks 1): without it ptxas caps the
        # 128-thread variant at 96 registers and spills
        return _entry(symbol, "attention_decode",
                      f"grokc_attn::attention_decode_mma<{d}, {w}, {st}, {cs}, {str(early).lower()}>",
                      32 * w, cluster=cs, min_blocks=1, waits_inside=early)
    return None
