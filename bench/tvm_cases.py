"""The ``linear`` calls on which Apache TVM's kernels (``targets/rules_tvm.py``) are checked and timed,
and their random inputs on the host. Shared by ``bench/kernels_tvm.py`` (timing),
``tests/gpu/test_kernels_tvm.py`` (the numpy oracle) and ``bench/tvm_kernels_gen.py`` (which
generates their TVM kernels on a machine with TVM, for a GPU node without it).

``BENCH``: Llama-3.2-1B's matrices (bench/llama-3.2-1b-shape.json: qkv 3072x2048, o 2048x2048,
gate_up 16384x2048, down 2048x8192, the f16 LM head 128256x2048) at M = 1, also with a zero per
channel (the default int4 recipe's format); the four at M = 512, gate_up and down at M = 2048. As
TVM covers them: no norm and no activation (gate_up as one 16384-row matrix), o and down adding
their residual. ``ODD``: shapes no tile divides, for the GPU test only. ``tiny_tvm_build``: a small
synthetic Llama built with ``--kernels tvm``, which the GPU test runs on the GPU against the CPU.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grokc.abi import int4
from grokc.abi.ops import KERNEL_ABI
from grokc.targets import KernelCall, get_target
from grokc.targets.rules_tvm import covers

F16, F32 = np.float16, np.float32
SM90_TVM = dataclasses.replace(get_target("sm90"), kernels="tvm")
OPTIONAL = frozenset(p.name for p in KERNEL_ABI["linear"] if p.optional)


@dataclass(frozen=True)
class Case:
    name: str
    m: int
    n: int
    k: int
    wf: str = "q4"         # f16 | q4 (per output channel)
    out: str = "f16"
    zeros: bool = False
    residual: bool = False

    @property
    def attrs(self) -> dict[str, str]:
        return {"weight_format": self.wf, "act": "none", "out_dtype": self.out}

    @property
    def dims(self) -> dict[str, int | float]:
        return {"M": self.m, "N": self.n, "K": self.k, "group_size": 0, "eps": 1e-5}

    def call(self) -> KernelCall:
        given = {"scales"} | ({"zeros"} if self.zeros else set()) | ({"residual"} if self.residual else set())
        return KernelCall("linear", self.attrs, self.dims, OPTIONAL - given)

    @property
    def symbol(self) -> str:
        spec = covers(self.call())
        assert spec is not None, f"{self} is not a call TVM's kernels cover"
        return spec.symbol

    @property
    def weight_bytes(self) -> int:
        if self.wf == "f16":
            return self.n * self.k * 2
        return self.n * self.k // 2 + self.n * 2 * (2 if self.zeros else 1)

    @property
    def label(self) -> str:
        return f"{self.name} M={self.m}{' zeros' if self.zeros else ''}"


_LLAMA = [Case("qkv", 1, 3072, 2048), Case("o", 1, 2048, 2048, residual=True), Case("gate_up", 1, 16384, 2048),
          Case("down", 1, 2048, 8192, residual=True)]
BENCH = (_LLAMA + [dataclasses.replace(c, zeros=True) for c in _LLAMA]
         + [Case("lm_head", 1, 128256, 2048, wf="f16", out="f32")]
         + [dataclasses.replace(c, m=512) for c in _LLAMA]
         + [dataclasses.replace(c, m=2048) for c in _LLAMA if c.name in ("gate_up", "down")])
ODD = [Case("odd", 1, 200, 576), Case("odd", 1, 1000, 1536, out="f32", zeros=True, residual=True),
       Case("odd", 1, 40, 64, wf="f16", out="f32"), Case("odd", 1, 300, 1000, wf="f16", residual=True),
       Case("odd", 16, 200, 576, residual=True), Case("odd", 17, 300, 1536, out="f32", zeros=True),
       Case("odd", 100, 1000, 2048, zeros=True, residual=True), Case("odd", 130, 72, 8192),
       Case("odd", 64, 96, 64, wf="f16", residual=True), Case("odd", 33, 250, 200, wf="f16", out="f32")]


def host_args(c: Case, seed: int = 0) -> dict:
    """Every ``linear`` argument of ``c`` by parameter name: weights of std ~1/sqrt(K), ``out`` NaN."""
    rng = np.random.default_rng((seed, c.m, c.n, c.k, c.zeros, c.residual))
    a = {p.name: None for p in KERNEL_ABI["linear"] if p.optional} | c.dims
    a["x"] = rng.standard_normal((c.m, c.k)).astype(F16)
    if c.wf == "f16":
        a["weight"] = (rng.standard_normal((c.n, c.k)) / np.sqrt(c.k)).astype(F16)
    else:
        a["weight"] = int4.pack(rng.integers(0, 16, (c.n, c.k), dtype=np.uint8))
        a["scales"] = (rng.uniform(0.5, 1.5, (c.n, 1)) / (4 * np.sqrt(c.k))).astype(F16)
        if c.zeros:
            a["zeros"] = rng.integers(5, 12, (c.n, 1)).astype(F16)   # integer zero-points, as the quantizers store
    if c.residual:
        a["residual"] = rng.standard_normal((c.m, c.n)).astype(F16)
    a["out"] = np.full((c.m, c.n), np.nan, F16 if c.out == "f16" else F32)
    return a


TINY_CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 512,
               "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}
TINY_BUCKETS = (16, 64)


def tiny_tvm_build(folder: Path, arch: str) -> Path:
    """Build ``TINY_CONFIG`` (synthetic int4 weights, batch 2) with ``--kernels tvm`` for ``arch`` under
    ``folder``; the artifact's path. Its TVM kernels: o and down in every prefill bucket (``tvm_gemm``)
    and o in ``decode_1`` (``tvm_gemv``; down is in ``mlp_decode`` there)."""
    from grokc.compiler.build import BuildOptions, build

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    build(folder / "config.json", folder / "art", BuildOptions(archs=(arch,), batch=2, buckets=TINY_BUCKETS, max_seq=128,
                                                                synthetic_seed=3, kernels="tvm"))
    return folder / "art"
