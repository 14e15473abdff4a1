"""What a plan must satisfy before an executor binds it: the one check both executors rely on.

``check_plan`` raises ``ArtifactError`` (one line naming the graph, the launch and the field)
unless

- the arena holds every buffer at a 256-byte aligned offset, and no ``io`` or ``state`` buffer
  overlaps another buffer (``scratch`` buffers may share memory, never while both are live: inside
  a graph, a scratch buffer is written before it is read, and two that overlap are not live at
  the same launch);
- every launch names a known op with its ABI parameters in order, a pointer (a known buffer or
  weight, or null where optional) for each pointer and a number in range for each scalar, known
  variants, a grid and block the hardware can launch and at most ``MAX_SMEM`` bytes of shared memory;
- every pointer holds at least what the launch touches through it, in the ABI's dtype
  (``abi/extents.py``), weights included when their dtypes and shapes are given, and a sparse
  residual's CSR arrays are consistent when their values are;
- with the kernels file's symbols: every launch's kernel is one of them;
- with the manifest's shapes and vocabulary: one prefill graph per bucket and one decode graph per
  decode batch, the per-step buffers the engine writes shaped as it writes them, the KV cache as
  large as the pool, and each graph's logits ``f32 [rows, vocab]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from grokc.abi.extents import extents
from grokc.abi.ops import KERNEL_ABI, ArgKind
from grokc.artifacts.plan import _ITEMSIZE, ARENA_ALIGN, IO, BufferKind, GraphPlan, Launch, Plan
from grokc.core.errors import ArtifactError
from grokc.core.meta import Shapes

I32_RANGE = (-(2**31), 2**31 - 1)
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
MAX_SMEM = 227 * 1024   # the most any supported GPU gives one block (sm_90, sm_100)


def check_plan(plan: Plan, where: str, *, weights: Mapping[str, Any] | None = None, shapes: Shapes | None = None,
               vocab: int | None = None, kernels: frozenset[str] | None = None) -> None:
    """Raise ``ArtifactError`` unless ``plan`` is safe to bind (see the module docstring).

    ``weights`` maps names to anything with ``dtype`` and ``shape`` (arrays, ``SyntheticTensor``)."""
    def bad(what: str) -> ArtifactError:
        return ArtifactError(f"{where}: {what}; the plan is corrupt, rebuild the artifact")

    _check_buffers(plan, bad)
    if shapes is not None:   # first: a plan built for other shapes is named as such, not by a launch
        try:
            _check_against_shapes(plan, shapes, vocab)
        except ValueError as exc:
            raise bad(str(exc)) from None
    batch, kv_blocks = (shapes.batch, shapes.kv_blocks) if shapes is not None else (1, 1)
    for g in plan.graphs.values():
        if g.logits and g.logits not in plan.buffers:
            raise bad(f"graph {g.name!r} returns logits in {g.logits!r}, which the plan lacks")
        for launch in g.launches:
            at = f"launch {launch.node or launch.kernel!r} of graph {g.name!r}"
            try:
                _check_launch(plan, g, launch, weights, kernels, batch, kv_blocks)
            except ValueError as exc:
                raise bad(f"{at}: {exc}") from None
        try:
            _check_scratch_lifetimes(plan, g)
        except ValueError as exc:
            raise bad(f"graph {g.name!r}: {exc}") from None


def _check_buffers(plan: Plan, bad) -> None:
    if plan.arena_bytes < 0:
        raise bad(f"the arena has {plan.arena_bytes} bytes")
    end = 0
    for name, b in plan.buffers.items():
        if b.name != name or b.dtype not in _ITEMSIZE or any(d < 0 for d in b.shape):
            raise bad(f"buffer {name!r} has dtype {b.dtype!r} and shape {list(b.shape)}")
        if b.offset < 0 or b.offset % ARENA_ALIGN or b.offset + b.nbytes > plan.arena_bytes:
            raise bad(f"buffer {name!r} at offset {b.offset} ({b.nbytes} bytes) lies outside the "
                      f"{plan.arena_bytes}-byte arena or off its {ARENA_ALIGN}-byte alignment")
        end = max(end, b.offset + b.nbytes)
    if plan.arena_bytes > -(-end // ARENA_ALIGN) * ARENA_ALIGN:
        raise bad(f"the arena of {plan.arena_bytes} bytes is larger than its buffers need ({end})")
    spans = sorted((b.offset, b.offset + b.nbytes, name) for name, b in plan.buffers.items() if b.nbytes)
    persistent = {n for n, b in plan.buffers.items() if b.kind is not BufferKind.SCRATCH}
    open_spans: list[tuple[int, str]] = []   # (end, name) of spans that began before this one
    for begin, stop, name in spans:
        open_spans = [(e, n) for e, n in open_spans if e > begin]
        for _, other in open_spans:
            if name in persistent or other in persistent:
                raise bad(f"buffer {name!r} overlaps {other!r}, and {'/'.join(sorted({name, other} & persistent))} "
                          "must have memory of its own")
        open_spans.append((stop, name))


def _check_launch(plan: Plan, g: GraphPlan, launch: Launch, weights: Mapping[str, Any] | None,
                  kernels: frozenset[str] | None, batch: int, kv_blocks: int) -> None:
    if launch.op not in KERNEL_ABI:
        raise ValueError(f"op {launch.op!r} is not one this grokc knows ({', '.join(KERNEL_ABI)})")
    if kernels is not None and launch.kernel not in kernels:
        raise ValueError(f"kernel {launch.kernel!r} is not in the kernels file")
    if any(not 1 <= n <= m for n, m in zip(launch.grid, MAX_GRID)) or \
            any(not 1 <= n <= m for n, m in zip(launch.block, MAX_BLOCK)) or math.prod(launch.block) > MAX_THREADS:
        raise ValueError(f"grid {list(launch.grid)} and block {list(launch.block)} are beyond what a GPU launches")
    if not 0 <= launch.smem <= MAX_SMEM:
        raise ValueError(f"{launch.smem} bytes of shared memory is outside [0, {MAX_SMEM}]")
    params = KERNEL_ABI[launch.op]
    got, want = [a.param for a in launch.args], [p.name for p in params]
    if got != want:
        raise ValueError(f"args {got} are not the ABI's {want}")
    scalars = {}
    for p, a in zip(params, launch.args):
        is_ptr = p.kind is ArgKind.PTR
        if (a.buffer is not None) + (a.weight is not None) + (a.value is not None) > 1 or \
                (is_ptr and a.value is not None) or (not is_ptr and a.value is None):
            raise ValueError(f"{p.name} must be {'a buffer, a weight or null' if is_ptr else 'a number'}")
        if is_ptr and a.buffer is None and a.weight is None and not p.optional:
            raise ValueError(f"{p.name} must not be null")
        if a.buffer is not None and a.buffer not in plan.buffers:
            raise ValueError(f"{p.name} names buffer {a.buffer!r}, which the plan lacks")
        if a.weight is not None and weights is not None and a.weight not in weights:
            raise ValueError(f"{p.name} names weight {a.weight!r}, which the weights file lacks")
        if p.kind is ArgKind.I32 and (not isinstance(a.value, int) or not I32_RANGE[0] <= a.value <= I32_RANGE[1]):
            raise ValueError(f"scalar {p.name}={a.value!r} is not a 32-bit integer")
        if p.kind is ArgKind.F32 and not (isinstance(a.value, (int, float)) and math.isfinite(a.value)
                                          and abs(a.value) <= 3.4e38):
            raise ValueError(f"scalar {p.name}={a.value!r} is not a finite 32-bit float")
        if not is_ptr:
            scalars[p.name] = a.value
    touched = extents(launch.op, scalars, launch.attrs, batch=batch, kv_blocks=kv_blocks, rows=g.tokens)
    for a in launch.args:
        need = touched.get(a.param)
        if need is None or (a.buffer is None and (a.weight is None or weights is None)):
            continue
        if a.buffer is not None:
            b = plan.buffers[a.buffer]
            dtype, size, what = b.dtype, math.prod(b.shape), f"buffer {a.buffer!r}"
        else:
            w = weights[a.weight]
            dtype, size, what = np.dtype(w.dtype).name, math.prod(w.shape), f"weight {a.weight!r}"
        if dtype != need.dtype or size < need.elements:
            raise ValueError(f"{a.param} reads {need.elements} {need.dtype} from {what}, which holds {size} {dtype}")
    if launch.op == "sparse_residual" and weights is not None:
        _check_csr(launch, weights, scalars)


def _check_csr(launch: Launch, weights: Mapping[str, Any], scalars: Mapping[str, Any]) -> None:
    """The CSR arrays of a sparse residual, where they are stored weights: rowptr from 0, never
    decreasing, ending within cols and vals; every column inside [0, K)."""
    arrays = {p: weights.get(launch.arg(p).weight) for p in ("rowptr", "cols", "vals")}
    if not all(isinstance(a, np.ndarray) for a in arrays.values()):
        return
    rowptr = arrays["rowptr"].reshape(-1)[:scalars["NW"] + 1].astype(np.int64)
    nnz = int(rowptr[-1])
    if rowptr[0] != 0 or np.any(np.diff(rowptr) < 0) or nnz > min(arrays["cols"].size, arrays["vals"].size):
        raise ValueError("rowptr does not start at 0, decreases, or ends past cols and vals")
    cols = arrays["cols"].reshape(-1)[:nnz]
    if nnz and (cols.min() < 0 or cols.max() >= scalars["K"]):
        raise ValueError(f"a column of the sparse residual lies outside [0, {scalars['K']})")


def _check_scratch_lifetimes(plan: Plan, g: GraphPlan) -> None:
    """Scratch buffers: written before read inside the graph; overlapping ones never live together."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, launch in enumerate(g.launches):
        scalars = {a.param: a.value for a in launch.args if a.value is not None}
        touched = extents(launch.op, scalars, launch.attrs, rows=g.tokens)
        for a in launch.args:
            if a.buffer is None or plan.buffers[a.buffer].kind is not BufferKind.SCRATCH:
                continue
            if a.buffer not in first and not touched[a.param].written:
                raise ValueError(f"launch {i} ({launch.node or launch.kernel}) reads scratch buffer {a.buffer!r} "
                                 "before any launch of the graph writes it")
            first.setdefault(a.buffer, i)
            last[a.buffer] = i
    if g.logits in first:
        last[g.logits] = len(g.launches)
    live = sorted(first)
    spans = sorted((plan.buffers[n].offset, plan.buffers[n].offset + plan.buffers[n].nbytes, n) for n in live)
    for j, (begin, stop, name) in enumerate(spans):
        for begin2, _, other in spans[j + 1:]:
            if begin2 >= stop:
                break
            if first[name] <= last[other] and first[other] <= last[name]:
                raise ValueError(f"scratch buffers {name!r} and {other!r} share memory while both are live")


_PER_SLOT = (IO.TOKENS, IO.POSITIONS, IO.ACTIVE, IO.TEMPERATURE, IO.TOP_K, IO.TOP_P, IO.SEED, IO.MAX_NEW,
             IO.OUT_COUNT)
_IO_DTYPE = {IO.TEMPERATURE: "float32", IO.TOP_P: "float32"}


def _check_against_shapes(plan: Plan, s: Shapes, vocab: int | None) -> None:
    want_graphs = {**{f"prefill_{b}": b for b in s.buckets}, **{f"decode_{b}": b for b in s.decode_batches}}
    for name, tokens in want_graphs.items():
        if name not in plan.graphs or plan.graphs[name].tokens != tokens:
            raise ValueError(f"the manifest's shapes need graph {name!r} of {tokens} tokens, which the plan lacks")
    extra = sorted(set(plan.graphs) - set(want_graphs) - {"init"})
    if extra:
        raise ValueError(f"graph {extra[0]!r} is none of those the manifest's shapes describe")
    shapes = {**{r: (s.batch,) for r in _PER_SLOT}, IO.PROMPT: (s.buckets[-1],), IO.N_REAL: (1,), IO.SLOT: (1,),
              IO.BLOCK_TABLE: (s.batch, s.max_blocks_per_seq), IO.OUT_TOKENS: (s.batch, s.max_seq)}
    for role, shape in shapes.items():
        b = plan.buffers.get(role.value)
        dtype = _IO_DTYPE.get(role, "int32")
        if b is None or b.kind is not BufferKind.IO or b.shape != shape or b.dtype != dtype:
            raise ValueError(f"buffer {role.value!r} must be an io buffer {dtype} {list(shape)} for the manifest's "
                             f"shapes, not {None if b is None else (b.kind.value, b.dtype, list(b.shape))}")
    for name, g in plan.graphs.items():
        if name == "init":
            continue
        b = plan.buffers.get(g.logits)
        rows = 1 if name.startswith("prefill_") else g.tokens
        if b is None or b.dtype != "float32" or len(b.shape) != 2 or b.shape[0] < rows or \
                (vocab is not None and b.shape[1] != vocab):
            raise ValueError(f"graph {name!r} returns logits in {g.logits!r}, not f32 [{rows}, {vocab or 'vocab'}]")
