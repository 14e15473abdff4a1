"""Apache TVM's kernels as candidates of the ``linear`` rule list: dlight-scheduled TensorIR, generated
at build time on the CPU (``tvm_codegen``), compiled by our nvcc step with the other kernels.

``rule_tvm`` heads ``rules_linear.RULES["linear"]`` and answers only when the build asks for TVM
(``Target.kernels == "tvm"``, ``grokc build --kernels tvm``) or when ``AUTO_TVM`` lists the arch and
the kind (``auto``: the measured order; empty until a device run shows TVM winning somewhere, so
an ``auto`` build never imports TVM). It covers what dlight expresses in one kernel and refuses the
rest, which the hand-written rules then take:

- ``gemv`` (``M == 1``, dlight's GEMV rule) and ``gemm`` (``M >= 16``, its WMMA Matmul rule);
- f16 weights, or int4 with one scale (and zero, or null ``zeros``: the symmetric code 8) per output
  channel;
- ``act == "none"``, f16 ``x``; ``norm``, ``addend`` and ``bias`` null; ``residual`` null or f16
  (``KernelCall.nulls`` says which optional pointers the launch passes as null);
- ``out`` f16 or f32.

A kernel is specialised to its shapes: symbol ``linear_tvm_<wf>_none_<out>[_z][_res]_m<M>n<N>k<K>``
(``_z``: reads ``zeros``; ``_res``: adds ``residual``). Its
source is TVM's kernel renamed to a ``__device__`` function, called from an ``extern "C"`` entry
point with the op's own parameter list (``abi/ops.py``), so a plan launches it like any grokc
kernel: TVM's argument order (its buffers sorted by name) lives only inside that wrapper. TVM's
prelude (half helpers, ``uint``) is not repeated per kernel: ``kernels/tvm_prelude.cuh`` holds the
union of what TVM 0.27 emits for these kernels, and generation checks each prelude against it.

``GROKC_TVM_KERNELS=DIR``: read kernels from ``DIR/<symbol>.json`` (written by ``save``;
``bench/tvm_kernels_gen.py`` makes them), so a machine without TVM (the GPU node) can build, test and
time them. Without the file, the kernel is generated, which needs TVM.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from grokc.core.errors import TargetError
from grokc.targets.base import KernelCall, KernelChoice, Target, c_params

HEADERS: tuple[str, ...] = ("tvm_prelude.cuh",)
PRELUDE = Path(__file__).resolve().parent / "kernels" / "tvm_prelude.cuh"
KERNELS_ENV = "GROKC_TVM_KERNELS"
GEMM_MIN_M = 16
# arch -> kinds ("gemv", "gemm") for which an ``auto`` build puts TVM first: where a device run
# measured it ahead of the hand-written rule (docs/kernels-linear.md, "Apache TVM candidates")
AUTO_TVM: dict[str, frozenset[str]] = {}
KERNELS_CHOICES = ("auto", "tvm")

_PTR_TYPES = {"out": "void*", "x": "const void*", "weight": "const void*", "scales": "const void*",
              "zeros": "const void*", "norm": "const void*", "residual": "const void*", "addend": "const void*",
              "bias": "const void*"}
_PARAMS = {"x": "x", "w": "weight", "s": "scales", "z": "zeros", "res": "residual", "y": "out"}  # tvm_codegen.PARAMS
_SYMBOL_RE = re.compile(
    r"linear_tvm_(?P<wf>f16|q4)_none_(?P<out>f16|f32)(?P<z>_z)?(?P<res>_res)?_m(?P<m>\d+)n(?P<n>\d+)k(?P<k>\d+)")


@dataclass(frozen=True)
class TvmLinear:
    """A linear call a TVM kernel is generated for."""

    wf: str         # "f16" | "q4" (per channel)
    out: str        # "f16" | "f32"
    zeros: bool     # q4 with a zero per channel (else the code 8)
    residual: bool  # adds an f16 residual
    m: int
    n: int
    k: int

    @property
    def symbol(self) -> str:
        flags = ("_z" if self.zeros else "") + ("_res" if self.residual else "")
        return f"linear_tvm_{self.wf}_none_{self.out}{flags}_m{self.m}n{self.n}k{self.k}"

    @property
    def kind(self) -> str:
        return "gemv" if self.m == 1 else "gemm"


@dataclass(frozen=True)
class TvmKernel:
    """A generated kernel: its source (over ``HEADERS``) and the launch shape TVM's schedule needs."""

    symbol: str
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    tvm: str  # the TVM version that generated it


def parse(symbol: str) -> TvmLinear | None:
    m = _SYMBOL_RE.fullmatch(symbol)
    if m is None:
        return None
    spec = TvmLinear(m["wf"], m["out"], bool(m["z"]), bool(m["res"]), int(m["m"]), int(m["n"]), int(m["k"]))
    return spec if spec.symbol == symbol and _shape_ok(spec) else None


def _shape_ok(s: TvmLinear) -> bool:
    return (s.m == 1 or s.m >= GEMM_MIN_M) and s.n >= 1 and s.k >= 8 and s.k % 8 == 0 and not (s.zeros and s.wf != "q4")


def covers(call: KernelCall) -> TvmLinear | None:
    """The TVM kernel's spec for ``call``, or None when the call is outside what they cover (module doc)."""
    a, d, nulls = call.attrs, call.dims, call.nulls
    if call.op != "linear" or a.get("act") != "none" or a.get("x_dtype", "f16") != "f16" \
            or a.get("residual_dtype", "f16") != "f16" or not {"norm", "addend", "bias"} <= nulls:
        return None
    wf, out = a.get("weight_format"), a.get("out_dtype")
    try:
        m, n, k, gs = int(d["M"]), int(d["N"]), int(d["K"]), int(d["group_size"])
    except KeyError:
        return None
    if out not in ("f16", "f32") or wf not in ("f16", "q4") or (wf == "q4" and gs != 0 and gs < k):
        return None
    spec = TvmLinear(wf, out, wf == "q4" and "zeros" not in nulls, "residual" not in nulls, m, n, k)
    return spec if _shape_ok(spec) else None


def wants_tvm(target: Target, kind: str) -> bool:
    """Whether TVM's kernel of ``kind`` comes first on ``target`` (module doc)."""
    return target.kernels == "tvm" or (target.kernels == "auto" and kind in AUTO_TVM.get(target.name, frozenset()))


def rule_tvm(call: KernelCall, target: Target) -> KernelChoice | None:
    spec = covers(call)
    if spec is None or not wants_tvm(target, spec.kind):
        return None
    kernel = load(spec.symbol)
    if kernel is None or kernel.smem > target.smem_per_block:
        return None
    return KernelChoice(kernel.symbol, kernel.grid, kernel.block, kernel.smem, f"linear.tvm_{spec.kind}")


RULES: dict = {}  # rule_tvm sits in rules_linear's list: an op's order is decided in one file


def kernel_source(symbol: str) -> str | None:
    """The entry point ``symbol`` over ``HEADERS``, or None when it is not a TVM kernel."""
    if parse(symbol) is None:
        return None
    kernel = load(symbol)
    if kernel is None:
        raise TargetError(f"TVM's dlight schedule for {symbol} needs more than one launch; no rule picks it")
    return kernel.source


# ---- generating, storing, loading -------------------------------------------------------------------
_LOADED: dict[str, TvmKernel | None] = {}


def load(symbol: str) -> TvmKernel | None:
    """The kernel ``symbol`` (from ``$GROKC_TVM_KERNELS`` when it holds it, else generated with TVM), or
    None when TVM's schedule for it is not one launch."""
    if symbol not in _LOADED:
        folder = os.environ.get(KERNELS_ENV)
        stored = Path(folder) / f"{symbol}.json" if folder else None
        if stored is not None and stored.is_file():
            _LOADED[symbol] = _read(stored, symbol)
        else:
            _LOADED[symbol] = generate(symbol)
    return _LOADED[symbol]


def generate(symbol: str) -> TvmKernel | None:
    spec = parse(symbol)
    if spec is None:
        raise TargetError(f"'{symbol}' does not name a TVM linear kernel")
    try:
        from grokc.targets import tvm_codegen
        gen = tvm_codegen.generate(spec.wf, spec.out, spec.zeros, spec.residual, spec.m, spec.n, spec.k)
    except ImportError as exc:
        where = f"; or set {KERNELS_ENV} to a folder of generated kernels (bench/tvm_kernels_gen.py)"
        raise TargetError(f"TVM kernel {symbol} needs Apache TVM ({exc}): pip install 'grokc[tvm]'{where}") from None
    if gen is None:
        return None
    return TvmKernel(symbol, wrap(symbol, gen.source, gen.kernel, gen.args), gen.grid, gen.block, gen.smem,
                     gen.version)


_DEF = re.compile(r'extern "C" __global__ void __launch_bounds__\((?P<threads>\d+)\) (?P<name>\w+)\((?P<params>[^)]*)\)')


def wrap(symbol: str, source: str, kernel: str, args: tuple[str, ...]) -> str:
    """TVM's translation unit -> the kernel as a ``__device__`` function and an entry point ``symbol``
    with the op's parameters (module doc). TargetError when its prelude has a line
    ``kernels/tvm_prelude.cuh`` lacks."""
    head = source.find('extern "C" __global__')
    prelude, body = source[:head], source[head:]
    known = set(PRELUDE.read_text().splitlines())
    unknown = [ln for ln in prelude.splitlines() if ln.strip() and ln not in known]
    if unknown:
        raise TargetError(f"TVM's prelude for {symbol} has lines kernels/tvm_prelude.cuh lacks (first: {unknown[0]!r}); "
                          "use apache-tvm==0.27.0.post1 or add them to the header")
    defs = [m for m in _DEF.finditer(body) if m["name"] == kernel]
    if not defs:
        raise TargetError(f"TVM's source for {symbol} has no kernel '{kernel}'")
    params = re.findall(r"(\w+)\* __restrict__ (\w+)_ptr", defs[0]["params"])
    if [name for _, name in params] != list(args) or any(name not in _PARAMS for _, name in params):
        raise TargetError(f"TVM's kernel for {symbol} takes {defs[0]['params']}, not the buffers {args} it launches with")
    body = body.replace(defs[0].group(0) + ";\n", "", 1)  # the forward declaration
    body = body.replace(defs[0].group(0), f"static __device__ __forceinline__ void {symbol}_tvm({defs[0]['params']})", 1)
    decl, _ = c_params("linear", _PTR_TYPES)
    call = ", ".join(f"({ctype}*){_PARAMS[name]}" for ctype, name in params)
    return (f"// {symbol}: TVM's kernel {kernel}, arguments ({', '.join(name for _, name in params)})\n{body.strip()}\n"
            f'extern "C" __global__ void __launch_bounds__({defs[0]["threads"]}) {symbol}({decl}) '
            f"{{ {symbol}_tvm({call}); }}\n")


def save(kernel: TvmKernel, folder: Path) -> Path:
    """Write ``kernel`` as ``folder/<symbol>.json`` (what ``load`` reads under ``$GROKC_TVM_KERNELS``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kernel.symbol}.json"
    path.write_text(json.dumps(asdict(kernel), indent=1, sort_keys=True) + "\n")
    return path


def _read(path: Path, symbol: str) -> TvmKernel:
    try:
        d = json.loads(path.read_text())
        kernel = TvmKernel(d["symbol"], d["source"], tuple(d["grid"]), tuple(d["block"]), int(d["smem"]), d["tvm"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TargetError(f"{path} is not a stored TVM kernel ({type(exc).__name__}: {exc}); regenerate it "
                          "with bench/tvm_kernels_gen.py") from None
    if kernel.symbol != symbol or len(kernel.grid) != 3 or len(kernel.block) != 3:
        raise TargetError(f"{path} holds {kernel.symbol}, not {symbol}; regenerate it with bench/tvm_kernels_gen.py")
    return kernel
