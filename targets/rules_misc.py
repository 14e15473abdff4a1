"""Kernel rules for ``sample``, ``embedding``, ``take_last``, ``rms_norm`` and ``qk_norm`` (kernels in
``kernels/sample.cuh``, ``kernels/misc.cuh``).

Same module protocol as ``rules_attention``: ``RULES`` (op -> ordered rules, fallback last),
``HEADERS`` and ``kernel_source(symbol)``.

- sample: ``sample_cluster`` (sm_90+): a cluster of ``SAMPLE_CLUSTER`` blocks of 1024 threads per
  row, each holding a slice of the row in shared memory, then ``sample_block``: one block per row
  that re-reads the row from L2 on every pass. Both for vocabularies up to 262144 (2048 chunks of
  128 tokens in the final walk); larger vocabularies have no kernel yet.
- embedding / take_last: 16-byte copies when ``hidden % 8 == 0``, else a per-element fallback.
  Quantized tables (``attrs["weight_format"]``): q4 reads 16 bytes (32 codes) per thread step when
  ``hidden % 32 == 0``, else one 32-bit word (the layout needs ``hidden % 8 == 0``; no fallback
  below that); q8 reads 8 codes per step when ``hidden % 8 == 0``, else one.
- rms_norm: one block of 256 threads per row; qk_norm: one warp per (row, head). Any width.
"""

from __future__ import annotations

from grokc.targets.base import Feature, KernelCall, KernelChoice, KernelRule, Target, c_params

HEADERS: tuple[str, ...] = ("pdl.cuh", "cluster.cuh", "sample.cuh", "misc.cuh")

_PTR_TYPES = {
    "embedding": {"out": "half*", "tokens": "const int*", "table": "const void*", "scales": "const half*",
                  "zeros": "const half*"},
    "take_last": {"out": "half*", "x": "const half*", "n_real": "const int*"},
    "rms_norm": {"out": "half*", "x": "const half*", "weight": "const half*", "residual": "const half*"},
    "qk_norm": {"out": "half*", "qkv": "const half*", "q_norm": "const half*", "k_norm": "const half*"},
    "sample": {
        "logits": "const float*", "slot": "const int*", "n_real": "const int*", "temperature": "const float*",
        "top_k": "const int*", "top_p": "const float*", "seed": "const int*", "tokens": "int*",
        "positions": "int*", "active": "int*", "out_tokens": "int*", "out_count": "int*",
        "max_new": "const int*", "eos_ids": "const int*",
    },
}
SAMPLE_THREADS = 1024
SAMPLE_CHUNK = 128             # grokc_sample::kChunk
SAMPLE_MAX_VOCAB = 2048 * SAMPLE_CHUNK  # grokc_sample::kMaxVocab
SAMPLE_CLUSTER = 8             # blocks per row of sample_cluster (a portable cluster size)
SAMPLE_STATIC_SMEM = 20 * 1024  # grokc_sample::Shared<SAMPLE_CLUSTER> rounded up (ptxas: 20032 bytes)


def _copy_block(width: int) -> tuple[int, int, int]:
    """Threads for a row copy of ``width`` items: a multiple of 32, at most 256."""
    return (min(256, max(32, -(-width // 32) * 32)), 1, 1)


def sample_slice_len(vocab: int, cluster: int) -> int:
    """Tokens each block of a ``cluster`` stages: whole chunks (grokc_sample::slice_len)."""
    per_block = -(-vocab // cluster)
    return -(-per_block // SAMPLE_CHUNK) * SAMPLE_CHUNK


def sample_cluster(call: KernelCall, target: Target) -> KernelChoice | None:
    vocab = int(call.dims["V"])
    if not target.has(Feature.CLUSTERS) or not 0 < vocab <= SAMPLE_MAX_VOCAB:
        return None
    smem = sample_slice_len(vocab, SAMPLE_CLUSTER) * 4
    if smem + SAMPLE_STATIC_SMEM > target.smem_per_block:
        return None
    return KernelChoice(f"sample_rows_c{SAMPLE_CLUSTER}", (int(call.dims["M"]) * SAMPLE_CLUSTER, 1, 1),
                        (SAMPLE_THREADS, 1, 1), smem, "sample_cluster")


def sample_block(call: KernelCall, target: Target) -> KernelChoice | None:
    if not 0 < int(call.dims["V"]) <= SAMPLE_MAX_VOCAB:
        return None
    return KernelChoice("sample_rows_c1", (int(call.dims["M"]), 1, 1), (SAMPLE_THREADS, 1, 1), 0, "sample_block")


def _embedding_rule(fmt: str, width: int):
    """The rule for a ``fmt`` table whose rows ``width`` codes per thread step cover exactly."""
    symbol = {"f16": f"embedding_v{width}", "q8": f"embedding_q8_v{width}", "q4": f"embedding_q4_w{width // 8}"}[fmt]

    def rule(call: KernelCall, target: Target) -> KernelChoice | None:
        hidden = int(call.dims["hidden"])
        if call.attrs.get("weight_format", "f16") != fmt or hidden % width:
            return None
        return KernelChoice(symbol, (int(call.dims["n"]), 1, 1), _copy_block(hidden // width), 0, symbol)

    rule.__name__ = symbol
    return rule


embedding_v8, embedding_v1 = _embedding_rule("f16", 8), _embedding_rule("f16", 1)
embedding_q8_v8, embedding_q8_v1 = _embedding_rule("q8", 8), _embedding_rule("q8", 1)
embedding_q4_w4, embedding_q4_w1 = _embedding_rule("q4", 32), _embedding_rule("q4", 8)


def take_last_v8(call: KernelCall, target: Target) -> KernelChoice | None:
    hidden = int(call.dims["hidden"])
    if hidden % 8:
        return None
    return KernelChoice("take_last_v8", (1, 1, 1), _copy_block(hidden // 8), 0, "take_last_v8")


def take_last_v1(call: KernelCall, target: Target) -> KernelChoice | None:
    return KernelChoice("take_last_v1", (1, 1, 1), _copy_block(int(call.dims["hidden"])), 0, "take_last_v1")


def rms_norm_rows(call: KernelCall, target: Target) -> KernelChoice | None:
    return KernelChoice("rms_norm_rows", (int(call.dims["M"]), 1, 1), (256, 1, 1), 0, "rms_norm_rows")


def qk_norm_heads(call: KernelCall, target: Target) -> KernelChoice | None:
    heads = int(call.dims["n_heads"]) + 2 * int(call.dims["n_kv_heads"])
    return KernelChoice("qk_norm_heads", (heads, int(call.dims["M"]), 1), (32, 1, 1), 0, "qk_norm_heads")


RULES: dict[str, list[KernelRule]] = {
    "sample": [sample_cluster, sample_block],
    "rms_norm": [rms_norm_rows],
    "qk_norm": [qk_norm_heads],
    "embedding": [embedding_v8, embedding_v1, embedding_q8_v8, embedding_q8_v1, embedding_q4_w4, embedding_q4_w1],
    "take_last": [take_last_v8, take_last_v1],
}

_SOURCES = {
    "sample_rows_c1": ("sample", "grokc_sample::sample_rows<1>", SAMPLE_THREADS),
    f"sample_rows_c{SAMPLE_CLUSTER}": ("sample", f"grokc_sample::sample_rows<{SAMPLE_CLUSTER}>", SAMPLE_THREADS),
    "embedding_v8": ("embedding", "grokc_misc::embedding_rows<8>", 256),
    "embedding_v1": ("embedding", "grokc_misc::embedding_rows<1>", 256),
    "embedding_q8_v8": ("embedding", "grokc_misc::embedding_q8_rows<8>", 256),
    "embedding_q8_v1": ("embedding", "grokc_misc::embedding_q8_rows<1>", 256),
    "embedding_q4_w4": ("embedding", "grokc_misc::embedding_q4_rows<4>", 256),
    "embedding_q4_w1": ("embedding", "grokc_misc::embedding_q4_rows<1>", 256),
    "take_last_v8": ("take_last", "grokc_misc::take_last_row<8>", 256),
    "take_last_v1": ("take_last", "grokc_misc::take_last_row<1>", 256),
    "rms_norm_rows": ("rms_norm", "grokc_misc::rms_norm_rows", 256),
    "qk_norm_heads": ("qk_norm", "grokc_misc::qk_norm_heads", 32),
}


def kernel_source(symbol: str) -> str | None:
    """The entry point ``symbol`` as C++ over ``HEADERS``, or None when it is not one of these ops."""
    if symbol not in _SOURCES:
        return None
    op, body, threads = _SOURCES[symbol]
    decl, args = c_params(op, _PTR_TYPES[op])
    cluster = f"__cluster_dims__({SAMPLE_CLUSTER}, 1, 1) " if symbol == f"sample_rows_c{SAMPLE_CLUSTER}" else ""
    return (f'extern "C" __global__ void {cluster}__launch_bounds__({threads}) {symbol}({decl}) {{\n'
            f"  grokc_pdl_entry();\n  {body}({args});\n}}\n")
