"""The ``linear`` kernel families' variants: each one's symbol, the C++ that instantiates it over
``rules_linear.HEADERS``, its launch shape and shared memory, and ``parse`` from a symbol back to
its variant. What the rules pick among them is ``rules_linear``'s; the kernels are
``kernels/linear_*.cuh``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GEMV2_MAX_M = 8            # gemv2::MAXM in linear_gemv2.cuh: the batch is the MMA's n = 8
GEMV_X_BUDGET = 64 * 1024  # bytes of staged x per block; gemv::X_BUDGET in linear_gemv.cuh
GEMM_BK = 64               # gemm::BK in linear_gemm.cuh
REF_THREADS = 128          # ref::THREADS in linear_ref.cuh

_WF_CPP = {"f16": "F16", "q4": "Q4", "q4g": "Q4G", "q8": "Q8"}
# The weight formats (symbol ``wf``) each family implements.
GEMV2_FORMATS = ("f16", "q4", "q4g", "q8")
GEMV_FORMATS = GEMM_FORMATS = ("f16", "q4", "q4g")
WGMMA_FORMATS = ("f16", "q4")
REF_FORMATS = ("f16", "q4", "q8")   # any group size: the kernel reads the group from group_size
_ACT_CPP = {"none": "NONE", "silu": "SILU_MUL", "gelu": "GELU_MUL"}
ACT_SYMBOL = {"none": "none", "silu_mul": "silu", "gelu_tanh_mul": "gelu"}
_IO_BITS = {"": 0, "x32": 1, "r32": 2, "x32r32": 3}  # linear_common.cuh's InDtypes
_IO_RE = r"(?:_(?P<io>x32r32|x32|r32))?"


def _io_suffix(io: str) -> str:
    return f"_{io}" if io else ""


# ---- variants ------------------------------------------------------------------------------------
def _bounds(threads: int, minb: int) -> str:
    return f"__launch_bounds__({threads}, {minb})" if minb else f"__launch_bounds__({threads})"


def gemv2_step_k(wf: str) -> int:
    """k per gemv2 step: 4 lanes x one 16-byte chunk per A row (8 halves, 16 int8 or 32 int4 codes)."""
    return {"f16": 32, "q8": 64}.get(wf, 128)


def _cpp_common(wf: str, act: str, out: str) -> str:
    return f"grokc::linear::{_WF_CPP[wf]}, grokc::linear::{_ACT_CPP[act]}, {'true' if out == 'f32' else 'false'}"


@dataclass(frozen=True)
class Gemv:
    wf: str
    act: str
    out: str
    mt: int    # rows of x per MMA: 8 (M <= 8) or 16
    ks: int    # warps splitting K
    rg: int    # row groups (8 weight rows) per block
    u: int     # 16-byte loads per lane per round
    minb: int  # __launch_bounds__ min blocks per SM (0: none)

    @property
    def symbol(self) -> str:
        return (f"linear_gemv_{self.wf}_{self.act}_{self.out}_m{self.mt}k{self.ks}r{self.rg}"
                f"u{self.u}b{self.minb}")

    @property
    def threads(self) -> int:
        return 32 * self.ks * self.rg

    @property
    def step_k(self) -> int:  # k per step: 4 chunks of 16 bytes per weight row
        return 32 if self.wf == "f16" else 128

    def round_k(self) -> int:
        return self.step_k * self.ks * self.u

    def blocks(self, n: int) -> int:
        cols = 8 * self.rg // (2 if self.act != "none" else 1)
        return -(-n // cols)

    def smem(self, m: int, k: int) -> int:
        """Dynamic shared memory, exactly as linear_gemv.cuh lays it out."""
        nsteps = -(-k // self.step_k)
        nrounds = -(-nsteps // (self.ks * self.u))
        rps = max(1, GEMV_X_BUDGET // (m * self.round_k() * 2))
        slab_k = min(rps, nrounds) * self.round_k()
        return (m + 1) * slab_k * 2 + self.ks * m * 8 * self.rg * 4 + m * 4

    def source(self) -> str:
        return (f'extern "C" __global__ void {_bounds(self.threads, self.minb)} {self.symbol}(GROKC_LINEAR_PARAMS) '
                f"{{ grokc::gemv::linear_gemv<{_cpp_common(self.wf, self.act, self.out)}, {self.mt}, {self.ks}, "
                f"{self.rg}, {self.u}>(GROKC_LINEAR_ARGS); }}\n")


@dataclass(frozen=True)
class Gemv2:
    """``linear_gemv2_<wf>_<act>_<out>_r<R>k<KS>w<WN>d<D>p<PF>n<NL>b<B>[t1]`` (``kernels/linear_gemv2.cuh``)."""

    wf: str
    act: str
    out: str
    r: int     # row groups (16 A rows) per warp
    ks: int    # warps splitting K
    wn: int    # warps along N
    d: int     # steps of weight loads in flight per lane (2 * r 16-byte loads each)
    pf: int    # L2 prefetch with each weight load: 0 none, 1 128 B, 2 256 B
    nl: int    # RMSNorm: 0 a pass over the staged x, 1 per step in registers (sums of squares on the MMA)
    minb: int  # __launch_bounds__ min blocks per SM (0: 1, i.e. no cap below 255 registers)
    tr: int = 0  # the next launch may start: 0 at entry, 1 after griddepcontrol.wait
    io: str = ""  # f32 inputs: "", "x32", "r32", "x32r32"

    @property
    def symbol(self) -> str:
        return (f"linear_gemv2_{self.wf}_{self.act}_{self.out}_r{self.r}k{self.ks}w{self.wn}d{self.d}"
                f"p{self.pf}n{self.nl}b{self.minb}" + (f"t{self.tr}" if self.tr else "") + _io_suffix(self.io))

    @property
    def threads(self) -> int:
        return 32 * self.ks * self.wn

    @property
    def step_k(self) -> int:
        return gemv2_step_k(self.wf)

    @property
    def cols(self) -> int:
        """Outputs per block."""
        br = 16 * self.r * self.wn
        return br // 2 if self.act != "none" else br

    def blocks(self, n: int) -> int:
        return -(-n // self.cols)

    def smem(self, m: int, k: int) -> int:
        """Dynamic shared memory, exactly as linear_gemv2.cuh lays it out."""
        kp = -(-k // 128) * 128
        red = self.ks * m * 16 * self.r * self.wn * 4 if self.ks > 1 else 0
        return (m + 1) * kp * 2 + self.ks * self.wn * 8 * 4 + red

    def source(self) -> str:
        # minb 0 still names 1: with a thread count alone ptxas aims at an occupancy of its own and
        # caps registers (64 at 256 threads), spilling the ring of loads
        return (f'extern "C" __global__ void {_bounds(self.threads, max(1, self.minb))} {self.symbol}(GROKC_LINEAR_PARAMS) '
                f"{{ grokc::gemv2::linear_gemv2<{_cpp_common(self.wf, self.act, self.out)}, {self.r}, {self.ks}, "
                f"{self.wn}, {self.d}, {self.pf}, {self.nl}, {self.tr}, {_IO_BITS[self.io]}>(GROKC_LINEAR_ARGS); }}\n")


@dataclass(frozen=True)
class Gemm:
    wf: str
    act: str
    out: str
    bm: int
    bn: int
    wm: int
    wn: int
    stages: int
    minb: int  # __launch_bounds__ min blocks per SM (0: none)

    @property
    def symbol(self) -> str:
        return (f"linear_gemm_{self.wf}_{self.act}_{self.out}_m{self.bm}n{self.bn}"
                f"w{self.wm}x{self.wn}s{self.stages}b{self.minb}")

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    def valid(self) -> bool:
        tm, tn = self.bm // self.wm, self.bn // self.wn
        b_pieces = self.bn * (8 if self.wf == "f16" else 2)
        return (self.bm % self.wm == 0 and self.bn % self.wn == 0 and tm % 16 == 0 and tn % 8 == 0
                and (self.act == "none" or (tn // 8) % 2 == 0)
                and (self.bm * 8) % self.threads == 0 and b_pieces % self.threads == 0
                and self.stages >= 2)

    def smem(self) -> int:
        """Dynamic shared memory, exactly as linear_gemm.cuh lays it out."""
        b_row = GEMM_BK * 2 if self.wf == "f16" else GEMM_BK // 2
        return self.stages * (self.bm * GEMM_BK * 2 + self.bn * b_row + GEMM_BK * 2) + self.bm * 4

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        cols = self.bn // (2 if self.act != "none" else 1)
        return (-(-n // cols), -(-m // self.bm), 1)

    def source(self) -> str:
        return (f'extern "C" __global__ void {_bounds(self.threads, self.minb)} {self.symbol}(GROKC_LINEAR_PARAMS) '
                f"{{ grokc::gemm::linear_gemm<{_cpp_common(self.wf, self.act, self.out)}, {self.bm}, {self.bn}, "
                f"{self.wm}, {self.wn}, {self.stages}>(GROKC_LINEAR_ARGS); }}\n")


@dataclass(frozen=True)
class Wgmma:
    wf: str
    act: str
    out: str
    bm: int      # rows of x per block: 64 per warpgroup
    bn: int      # weight rows per block (gate and up halves when gated): one wgmma's N
    stages: int  # cp.async stages, STAGES - 2 tiles in flight

    @property
    def symbol(self) -> str:
        return f"linear_wgmma_{self.wf}_{self.act}_{self.out}_m{self.bm}n{self.bn}s{self.stages}"

    @property
    def threads(self) -> int:
        return 2 * self.bm + 128  # a consumer warpgroup per 64 rows, one producer warpgroup

    def valid(self) -> bool:
        return self.bm in (64, 128) and self.bn in (128, 256) and 3 <= self.stages <= 8 and self.wf in WGMMA_FORMATS

    def grid(self, m: int, n: int) -> tuple[int, int, int]:
        cols = self.bn // 2 if self.act != "none" else self.bn
        return (-(-n // cols), -(-m // self.bm), 1)

    def smem(self) -> int:
        """Dynamic shared memory, exactly as linear_wgmma.cuh lays it out (1024 of it for alignment)."""
        w_raw = self.bn * 128 if self.wf == "f16" else self.bn * 32
        conv = 3 * self.bn * 128 if self.wf == "q4" else 0
        return 1024 + self.stages * (self.bm * 128 + w_raw + 128 + 16) + conv + self.bm * 4

    def source(self) -> str:
        return (f'extern "C" __global__ void {_bounds(self.threads, 1)} {self.symbol}(GROKC_LINEAR_PARAMS) '
                f"{{ grokc::wgmma::linear_wgmma<{_cpp_common(self.wf, self.act, self.out)}, {self.bm // 64}, "
                f"{self.bn}, {self.stages}>(GROKC_LINEAR_ARGS); }}\n")


@dataclass(frozen=True)
class Ref:
    wf: str  # "f16", "q4" or "q8" (any group size)
    act: str
    out: str
    io: str = ""

    @property
    def symbol(self) -> str:
        return f"linear_ref_{self.wf}_{self.act}_{self.out}" + _io_suffix(self.io)

    def source(self) -> str:
        return (f'extern "C" __global__ void {_bounds(REF_THREADS, 0)} {self.symbol}(GROKC_LINEAR_PARAMS) '
                f"{{ grokc::ref::linear_ref<{_cpp_common(self.wf, self.act, self.out)}, {_IO_BITS[self.io]}>"
                f"(GROKC_LINEAR_ARGS); }}\n")


@dataclass(frozen=True)
class Rows:
    """``linear_rows_f16_none_<out>_w<W>u<U>b<B>[t1]`` (``kernels/linear_rows.cuh``): M = 1, f16
    weights, act none; one warp per row, U 16-byte loads per lane in flight, a persistent grid."""

    out: str
    w: int     # warps per block
    u: int     # 16-byte loads per lane in flight
    minb: int  # blocks per SM the launch bounds ask for (the grid is num_sms * minb)
    tr: int = 0  # the next launch may start: 0 at entry, 1 after griddepcontrol.wait
    io: str = ""  # f32 inputs: "", "x32", "r32", "x32r32"

    @property
    def symbol(self) -> str:
        return (f"linear_rows_f16_none_{self.out}_w{self.w}u{self.u}b{self.minb}" + (f"t{self.tr}" if self.tr else "")
                + _io_suffix(self.io))

    @property
    def threads(self) -> int:
        return 32 * self.w

    def blocks(self, n: int, num_sms: int) -> int:
        return min(-(-n // self.w), num_sms * self.minb)

    def smem(self, k: int) -> int:
        """Dynamic shared memory, as linear_rows.cuh lays it out: x, then the warps' sums of squares."""
        return 2 * k + 4 * self.w

    def source(self) -> str:
        return (f'extern "C" __global__ void {_bounds(self.threads, self.minb)} {self.symbol}(GROKC_LINEAR_PARAMS) '
                f"{{ grokc::rows::linear_rows<{self.w}, {self.u}, {'true' if self.out == 'f32' else 'false'}, "
                f"{self.tr}, {_IO_BITS[self.io]}>(GROKC_LINEAR_ARGS); }}\n")


_COMMON = r"(?P<wf>f16|q4g|q4|q8)_(?P<act>none|silu|gelu)_(?P<out>f16|f32)"
_GEMV_RE = re.compile(rf"linear_gemv_{_COMMON}_m(?P<mt>\d+)k(?P<ks>\d+)r(?P<rg>\d+)u(?P<u>\d+)b(?P<b>\d+)")
_GEMV2_RE = re.compile(
    rf"linear_gemv2_{_COMMON}_r(?P<r>\d+)k(?P<ks>\d+)w(?P<wn>\d+)d(?P<d>\d+)p(?P<pf>\d+)n(?P<nl>\d+)b(?P<b>\d+)(?:t(?P<tr>\d))?{_IO_RE}")
_GEMM_RE = re.compile(
    rf"linear_gemm_{_COMMON}_m(?P<bm>\d+)n(?P<bn>\d+)w(?P<wm>\d+)x(?P<wn>\d+)s(?P<st>\d+)b(?P<b>\d+)")
_WGMMA_RE = re.compile(rf"linear_wgmma_{_COMMON}_m(?P<bm>\d+)n(?P<bn>\d+)s(?P<st>\d+)")
_REF_RE = re.compile(rf"linear_ref_{_COMMON}{_IO_RE}")
_ROWS_RE = re.compile(rf"linear_rows_f16_none_(?P<out>f16|f32)_w(?P<w>\d+)u(?P<u>\d+)b(?P<b>\d+)(?:t(?P<tr>\d))?{_IO_RE}")


def parse(symbol: str) -> Gemv2 | Gemv | Gemm | Wgmma | Ref | Rows | None:
    """The variant a linear kernel symbol names, or None if it is not a valid one."""
    if m := _ROWS_RE.fullmatch(symbol):
        rows = Rows(m["out"], int(m["w"]), int(m["u"]), int(m["b"]), int(m["tr"] or 0), m["io"] or "")
        ok = 1 <= rows.w <= 32 and 1 <= rows.u <= 16 and 1 <= rows.minb <= 8 and rows.tr in (0, 1)
        return rows if ok and rows.symbol == symbol else None
    if m := _GEMV2_RE.fullmatch(symbol):
        v2 = Gemv2(m["wf"], m["act"], m["out"], int(m["r"]), int(m["ks"]), int(m["wn"]), int(m["d"]), int(m["pf"]),
                   int(m["nl"]), int(m["b"]), int(m["tr"] or 0), m["io"] or "")
        ok = (v2.r in (1, 2, 3, 4) and v2.ks in (1, 2, 4, 8, 16) and v2.wn in (1, 2, 4, 8) and 1 <= v2.d <= 8
              and v2.r * v2.d <= 8 and v2.pf in (0, 1, 2) and v2.nl in (0, 1) and v2.tr in (0, 1)  # ring: 8 * R * D registers
              and v2.threads <= 512 and 0 <= v2.minb <= 8 and v2.wf in GEMV2_FORMATS)
        return v2 if ok and v2.symbol == symbol else None
    if m := _GEMV_RE.fullmatch(symbol):
        v = Gemv(m["wf"], m["act"], m["out"], int(m["mt"]), int(m["ks"]), int(m["rg"]), int(m["u"]), int(m["b"]))
        ok = (v.mt in (8, 16) and v.ks in (1, 2, 4, 8) and 1 <= v.rg <= 8 and 1 <= v.u <= 8
              and v.threads <= 512 and 0 <= v.minb <= 8 and v.wf in GEMV_FORMATS)
        return v if ok and v.symbol == symbol else None
    if m := _GEMM_RE.fullmatch(symbol):
        v = Gemm(m["wf"], m["act"], m["out"], int(m["bm"]), int(m["bn"]), int(m["wm"]), int(m["wn"]), int(m["st"]),
                 int(m["b"]))
        ok = v.valid() and v.threads <= 512 and 0 <= v.minb <= 4 and v.wf in GEMM_FORMATS
        return v if ok and v.symbol == symbol else None
    if m := _WGMMA_RE.fullmatch(symbol):
        w = Wgmma(m["wf"], m["act"], m["out"], int(m["bm"]), int(m["bn"]), int(m["st"]))
        return w if w.valid() and w.symbol == symbol else None
    if m := _REF_RE.fullmatch(symbol):
        return Ref(m["wf"], m["act"], m["out"], m["io"] or "") if m["wf"] in REF_FORMATS else None
    return None


def kernel_source(symbol: str) -> str | None:
    """C++ defining the ``extern "C"`` kernel ``symbol`` (after HEADERS), or None if not ours."""
    v = parse(symbol)
    return None if v is None else v.source()
