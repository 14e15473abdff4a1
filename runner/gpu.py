"""The GPU executor: a plan's graphs as CUDA graphs, replayed on one stream.

At load (``GpuExecutor.__init__``), and never again:

1. check the plan (``Plan.validate`` with the weights and the cubin's symbols: every launch stays
   inside its buffers and weights, as the CPU executor's reads check as they go), that the device
   is the plan's architecture (``check_device``) and that the memory fits;
2. allocate ONE arena of ``plan.arena_bytes`` (zeroed) and ONE weights allocation, every weight at
   a 256-byte aligned offset, and upload the weights;
3. load the cubin and resolve every launch: its kernel, and its arguments in ``KERNEL_ABI`` order
   (``Arg.buffer`` -> arena base + buffer offset, ``Arg.weight`` -> that weight's address,
   ``Arg.value`` -> an i32 or f32 by the ABI, none -> a null pointer);
4. build one CUDA graph per ``GraphPlan`` (explicit kernel nodes in a chain) and instantiate it.

Then ``replay`` only launches a graph; ``write`` and ``read`` copy to and from arena buffers in
stream order. This implements ``runner/executor.py``'s ``Executor``. All calls must come from the
thread that built the executor (or call ``ctx.make_current()`` first on another thread).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from grokc.abi.ops import KERNEL_ABI, ArgKind
from grokc.abi.synthetic import SyntheticTensor
from grokc.artifacts import kernels_file
from grokc.artifacts.plan import Buffer, GraphPlan, Launch, Plan
from grokc.core.errors import ArtifactError, TargetError
from grokc.runner import cuda_driver as cd
from grokc.runner.arch import pick_arch
from grokc.runner.cuda_driver import CudaError, NoCudaDevice  # noqa: F401  (re-exported for the CLI)

WEIGHT_ALIGN = 256
_PARAM_BYTES = {ArgKind.PTR: 8, ArgKind.I32: 4, ArgKind.F32: 4}


def check_device(archs: Mapping[str, bool], ordinal: int = 0) -> str:
    """The arch of ``archs`` (name -> carries PTX) to run on GPU ``ordinal`` (``arch.pick_arch``).

    Raises ``TargetError`` when the artifact holds no code for this GPU, and ``NoCudaDevice`` when
    there is no CUDA driver or GPU at all (the CLI falls back to the CPU on that one).
    """
    with cd.Context(ordinal) as ctx:
        major, minor = ctx.compute_capability
        arch = pick_arch(major, minor, archs)
        if arch is None:
            raise TargetError(
                f"GPU {ctx.ordinal} ({ctx.name}) has compute capability {major}.{minor} (sm{major}{minor}) but the "
                f"artifact holds only {', '.join(sorted(archs)) or 'no archs'}; rebuild with --arch sm{major}{minor}"
            )
        return arch


def _weight_layout(weights: Mapping[str, np.ndarray | SyntheticTensor]) -> tuple[dict[str, int], int]:
    """Byte offset of each weight (sorted by name, each 256-byte aligned) and the total size."""
    offsets, end = {}, 0
    for name in sorted(weights):
        offsets[name] = end
        end += -(-weights[name].nbytes // WEIGHT_ALIGN) * WEIGHT_ALIGN
    return offsets, end


class GpuExecutor:
    """Replays a ``Plan``'s graphs on a GPU (see the module docstring)."""

    def __init__(self, plan: Plan, weights: Mapping[str, np.ndarray | SyntheticTensor], cubin: bytes, ordinal: int = 0):
        # The CPU executor's own reads would catch a launch past its buffers; a kernel would not.
        kernels = kernels_file.read(cubin, f"the {plan.arch} kernels")
        plan.validate(weights=weights, kernels=kernels.symbols)
        self.plan = plan
        self.ctx = cd.Context(ordinal)
        self._handles: list[Any] = []  # everything to free on close, in creation order
        self._pending: list[np.ndarray] = []  # host copies of queued writes, kept until a sync
        try:
            major, minor = self.ctx.compute_capability
            ptx = bool(kernels.ptx_archs)
            if pick_arch(major, minor, {plan.arch: ptx}) != plan.arch:
                raise TargetError(f"the {plan.arch} plan cannot run on GPU {ordinal} ({self.ctx.name}, compute "
                                  f"capability {major}.{minor}); rebuild with --arch sm{major}{minor}")
            self._load(weights, cubin)
        except BaseException:
            with contextlib.suppress(Exception):  # keep the original error
                self.close()
            raise

    def _load(self, weights: Mapping[str, np.ndarray | SyntheticTensor], cubin: bytes) -> None:
        offsets, weight_bytes = _weight_layout(weights)
        need, free = self.plan.arena_bytes + weight_bytes, self.ctx.free_memory()
        if need > free:
            raise TargetError(
                f"the artifact needs {need / 2**30:.2f} GiB on the GPU (arena and weights) but GPU "
                f"{self.ctx.ordinal} ({self.ctx.name}) has {free / 2**30:.2f} GiB free; free the GPU "
                "or build with a smaller batch or context"
            )
        self.stream = self._own(cd.Stream())
        self.arena = self._own(cd.DeviceBuffer(self.plan.arena_bytes))
        self.arena.memset_zero()
        self.weights = self._own(cd.DeviceBuffer(weight_bytes))
        self._weight_ptr = {}
        for name, offset in offsets.items():
            if not isinstance(weights[name], SyntheticTensor):   # synthetic ones are filled by the init graph
                self.weights.upload(np.asarray(weights[name]), offset)
            self._weight_ptr[name] = self.weights.ptr + offset
        self.module = self._own(cd.Module(cubin))
        self._checked_kernels: set[str] = set()
        self.ctx.synchronize()  # uploads are done before graphs are captured on the stream
        self.launches = {name: [self._resolve(g, launch) for launch in g.launches] for name, g in self.plan.graphs.items()}
        self.graphs = {name: self._own(cd.Graph(launches, self.stream)) for name, launches in self.launches.items()}
        self.ctx.synchronize()  # the memset and uploads are done before the first replay

    def _own(self, handle: Any) -> Any:
        self._handles.append(handle)
        return handle

    # -- load-time resolution -------------------------------------------------------------------
    def _resolve(self, g: GraphPlan, launch: Launch) -> cd.KernelLaunch:
        where = f"launch {launch.node or launch.kernel!r} of graph {g.name!r}"
        params = KERNEL_ABI[launch.op]
        values: list[Any] = []
        for p, a in zip(params, launch.args):
            if a.buffer is not None:
                values.append(self.arena.ptr + self.plan.buffers[a.buffer].offset)
            elif a.weight is not None:
                if a.weight not in self._weight_ptr:
                    raise ArtifactError(f"{where} uses weight {a.weight!r}, which the weights file lacks; "
                                        "rebuild the artifact")
                values.append(self._weight_ptr[a.weight])
            else:
                values.append(a.value)
        try:
            packed = cd.pack_args(params, values)
        except ValueError as exc:
            raise ArtifactError(f"{where}: {exc}; rebuild the artifact") from exc
        function = self._function(launch)
        if launch.smem > cd.DEFAULT_DYNAMIC_SMEM and launch.smem > self.ctx.max_dynamic_smem:
            raise TargetError(f"{where} asks for {launch.smem} bytes of shared memory but {self.ctx.name} "
                              f"allows {self.ctx.max_dynamic_smem}; rebuild for this GPU's arch")
        return cd.KernelLaunch(function, tuple(launch.grid), tuple(launch.block), launch.smem, packed, launch.pdl)

    def _function(self, launch: Launch) -> cd.Function:
        """The launch's kernel, checked once against the ABI: same parameter count and sizes."""
        try:
            function = self.module.function(launch.kernel)
        except CudaError as exc:
            raise ArtifactError(f"kernel {launch.kernel!r} is not in the {self.plan.arch} cubin; "
                                "rebuild the artifact") from exc
        if launch.kernel not in self._checked_kernels:
            want = tuple(_PARAM_BYTES[p.kind] for p in KERNEL_ABI[launch.op])
            got = function.param_sizes()
            if got is not None and got != want:
                raise ArtifactError(f"kernel {launch.kernel!r} takes parameters of {list(got)} bytes but "
                                    f"op {launch.op!r} needs {list(want)}; rebuild the artifact")
            self._checked_kernels.add(launch.kernel)
        return function

    # -- the Executor protocol ------------------------------------------------------------------
    def _buffer(self, name: str) -> Buffer:
        try:
            return self.plan.buffers[name]
        except KeyError:
            raise KeyError(f"the plan has no buffer {name!r}") from None

    def write(self, buffer: str, value: np.ndarray, index: int | tuple[int, ...] = ()) -> None:
        """Queue a copy of ``value`` into ``buffer`` (or its sub-array at ``index``) on the stream."""
        buf = self._buffer(buffer)
        index = (index,) if isinstance(index, (int, np.integer)) else tuple(index)
        if len(index) > len(buf.shape):
            raise IndexError(f"index {index} has more dimensions than {buffer} {list(buf.shape)}")
        flat = 0
        for i, n in zip(index, buf.shape):
            if not -n <= i < n:
                raise IndexError(f"index {index} is out of range for {buffer} {list(buf.shape)}")
            flat = flat * n + int(i) % n
        sub_shape = buf.shape[len(index):]
        host = np.ascontiguousarray(np.broadcast_to(np.asarray(value, dtype=buf.dtype), sub_shape))
        offset = buf.offset + flat * host.nbytes  # the sub-array is contiguous in C order
        self._pending.append(self.arena.upload(host, offset, self.stream))

    def read(self, buffer: str) -> np.ndarray:
        """Wait for queued work, then return a host copy of ``buffer`` (its plan dtype and shape)."""
        buf = self._buffer(buffer)
        raw = self.arena.download(buf.offset, buf.nbytes, self.stream)
        self._pending.clear()
        return raw.view(buf.dtype).reshape(buf.shape)

    def replay(self, graph: str) -> None:
        """Queue one run of ``graph`` on the stream (returns at once)."""
        try:
            g = self.graphs[graph]
        except KeyError:
            raise KeyError(f"the plan has no graph {graph!r}; it has {sorted(self.graphs)}") from None
        g.launch(self.stream)

    def replay_timed(self, graph: str) -> list[tuple[float, float]]:
        """Run ``graph``'s launches one by one, a CUDA event before each and after the last; each
        launch's (start from the first event, duration) in seconds (``runner/executor.py``)."""
        launches = self.launches.get(graph)
        if launches is None:
            raise KeyError(f"the plan has no graph {graph!r}; it has {sorted(self.graphs)}")
        events = [cd.Event() for _ in range(len(launches) + 1)]
        try:
            for event, k in zip(events, launches):
                event.record(self.stream)
                cd.launch(k.function, k.grid, k.block, k.smem, k.args, self.stream)
            events[-1].record(self.stream)
            ms = [events[0].elapsed_ms(e) for e in events]
        finally:
            for e in events:
                e.close()
        return [(ms[i] / 1e3, (ms[i + 1] - ms[i]) / 1e3) for i in range(len(launches))]

    def synchronize(self) -> None:
        self.stream.synchronize()
        self._pending.clear()

    # -- addresses (tests, debugging) -----------------------------------------------------------
    def buffer_address(self, name: str) -> int:
        return self.arena.ptr + self._buffer(name).offset

    def weight_address(self, name: str) -> int:
        return self._weight_ptr[name]

    def close(self) -> None:
        """Free every device object, newest first, then release the context. Idempotent."""
        try:
            if self._handles:
                self.ctx.synchronize()
        finally:
            while self._handles:
                self._handles.pop().close()
            self.ctx.close()

    def __enter__(self) -> "GpuExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
