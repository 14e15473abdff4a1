"""A thin, checked wrapper over the CUDA driver API (``cuda.bindings.driver``), nothing more.

Every driver call goes through ``check``: a result other than ``CUDA_SUCCESS`` raises ``CudaError``
naming the call and the error (``cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY``). No torch, no cupy,
no runtime API. ``cuda.bindings`` is imported on first use, so this module imports on a machine
without CUDA; there, ``Context()`` raises ``NoCudaDevice`` (the CLI falls back to the CPU on it).

What is here:

- ``Context(ordinal)``: the device's primary context, made current on the calling thread.
- ``DeviceBuffer(nbytes)``: one ``cuMemAlloc``; ``upload`` / ``download`` / ``memset_zero``.
- ``Stream``, ``Event`` (timing), ``Module(cubin)`` and its ``Function`` handles.
- ``pack_args(params, values)``: an ABI parameter list plus values -> ``PackedArgs``, the host
  memory ``cuLaunchKernel`` and ``CUDA_KERNEL_NODE_PARAMS.kernelParams`` read (see its docstring).
- ``launch(...)``: one ``cuLaunchKernel``; ``Graph(launches)``: a CUDA graph built explicitly with
  ``cuGraphAddKernelNode``, each node depending on the one before, instantiated once.

Handles are freed by ``close()`` (every class here has one and is a context manager); nothing
relies on ``__del__``. Free things before the ``Context`` they were made in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from grokc.abi.ops import ArgKind, Param
from grokc.core.errors import GrokcError

# A kernel may use this much dynamic shared memory without opting in (cuFuncSetAttribute).
DEFAULT_DYNAMIC_SMEM = 48 * 1024
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


class CudaError(GrokcError):
    """A CUDA driver call failed."""


class NoCudaDevice(CudaError):
    """No usable CUDA driver or GPU on this machine (cuda-python missing, no libcuda, no device)."""


_DRIVER: Any = None


def driver() -> Any:
    """The ``cuda.bindings.driver`` module, imported on first use."""
    global _DRIVER
    if _DRIVER is None:
        try:
            from cuda.bindings import driver as d
        except ImportError as exc:
            raise NoCudaDevice(
                f"cuda-python is not installed ({exc}); install it with `pip install cuda-python` "
                "or run on the CPU with --device cpu"
            ) from exc
        _DRIVER = d
    return _DRIVER


def check(result: tuple, call: str) -> Any:
    """Unpack a driver call's result tuple ``(CUresult, *values)``; raise ``CudaError`` on failure.

    Returns ``None`` when the call returns no value, the value when it returns one, else the
    tuple of values.
    """
    err, values = result[0], result[1:]
    if err != driver().CUresult.CUDA_SUCCESS:
        raise CudaError(f"{call} failed: {error_name(err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def error_name(err: Any) -> str:
    """``CUDA_ERROR_OUT_OF_MEMORY`` for a ``CUresult``; the number when the driver does not know it."""
    try:
        status, name = driver().cuGetErrorName(err)
        if status == driver().CUresult.CUDA_SUCCESS and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # an unknown code: fall through to the number
        pass
    return getattr(err, "name", None) or f"CUresult {int(err)}"


# -- context ------------------------------------------------------------------------------------


class Context:
    """The primary context of GPU ``ordinal``, retained and made current on this thread.

    Raises ``NoCudaDevice`` when there is no driver or no GPU. The primary context is shared:
    several ``Context(0)`` objects retain the same one, and each ``close()`` releases once.
    """

    def __init__(self, ordinal: int = 0):
        d = driver()
        try:
            (err,) = d.cuInit(0)
        except Exception as exc:  # cuda-bindings raises when libcuda.so cannot be loaded at all
            raise NoCudaDevice(
                f"no CUDA driver found ({type(exc).__name__}); install the NVIDIA driver or run on "
                "the CPU with --device cpu"
            ) from exc
        if err != d.CUresult.CUDA_SUCCESS:
            raise NoCudaDevice(
                f"the CUDA driver did not start (cuInit: {error_name(err)}); check the GPU with "
                "nvidia-smi or run on the CPU with --device cpu"
            )
        count = check(d.cuDeviceGetCount(), "cuDeviceGetCount")
        if count == 0:
            raise NoCudaDevice("the CUDA driver sees no GPU; run on the CPU with --device cpu")
        if not 0 <= ordinal < count:
            raise CudaError(f"GPU {ordinal} does not exist (this machine has {count}); pick 0..{count - 1}")
        self.ordinal = ordinal
        self.device = check(d.cuDeviceGet(ordinal), "cuDeviceGet")
        self.handle = check(d.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.make_current()

    def make_current(self) -> None:
        """Bind the context to the calling thread (needed once per thread that issues CUDA calls)."""
        check(driver().cuCtxSetCurrent(self.handle), "cuCtxSetCurrent")

    def attribute(self, attr: str) -> int:
        """A device attribute by its ``CU_DEVICE_ATTRIBUTE_`` suffix, e.g. ``"MULTIPROCESSOR_COUNT"``."""
        d = driver()
        enum = getattr(d.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_" + attr)
        return int(check(d.cuDeviceGetAttribute(enum, self.device), "cuDeviceGetAttribute"))

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self.attribute("COMPUTE_CAPABILITY_MAJOR"), self.attribute("COMPUTE_CAPABILITY_MINOR")

    @property
    def name(self) -> str:
        raw = check(driver().cuDeviceGetName(256, self.device), "cuDeviceGetName")
        return raw.split(b"\0", 1)[0].decode(errors="replace").strip()

    @property
    def total_memory(self) -> int:
        return int(check(driver().cuDeviceTotalMem(self.device), "cuDeviceTotalMem"))

    def free_memory(self) -> int:
        free, _total = check(driver().cuMemGetInfo(), "cuMemGetInfo")
        return int(free)

    @property
    def max_dynamic_smem(self) -> int:
        """The most shared memory one block may opt into (bytes)."""
        return self.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")

    def synchronize(self) -> None:
        check(driver().cuCtxSynchronize(), "cuCtxSynchronize")

    def close(self) -> None:
        if self.handle is not None:
            check(driver().cuDevicePrimaryCtxRelease(self.device), "cuDevicePrimaryCtxRelease")
            self.handle = None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- memory, streams, events --------------------------------------------------------------------


class Stream:
    """A blocking stream (ordered with the legacy default stream, so plain copies stay ordered)."""

    def __init__(self) -> None:
        self.handle = check(driver().cuStreamCreate(0), "cuStreamCreate")  # 0 = CU_STREAM_DEFAULT

    def synchronize(self) -> None:
        check(driver().cuStreamSynchronize(self.handle), "cuStreamSynchronize")

    def close(self) -> None:
        if self.handle is not None:
            check(driver().cuStreamDestroy(self.handle), "cuStreamDestroy")
            self.handle = None

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DeviceBuffer:
    """``nbytes`` of device memory from ``cuMemAlloc`` (256-byte aligned or better) at ``.ptr``."""

    def __init__(self, nbytes: int):
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        self.nbytes = int(nbytes)
        # cuMemAlloc refuses 0 bytes; a 1-byte allocation keeps .ptr a valid, non-null address.
        self.handle = check(driver().cuMemAlloc(max(self.nbytes, 1)), "cuMemAlloc")
        self.ptr = int(self.handle)

    def _range(self, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"bytes [{offset}, {offset + nbytes}) fall outside a {self.nbytes}-byte buffer")

    def upload(self, array: np.ndarray | bytes, offset: int = 0, stream: Stream | None = None) -> np.ndarray:
        """Copy ``array``'s bytes to ``offset``. Without a stream the copy is synchronous.

        With a stream it is queued on it (``cuMemcpyHtoDAsync``); the host copy this returns must
        stay alive until the stream has passed it (the driver stages pageable memory before
        returning, but keeping it costs nothing and needs no such reading of the docs).
        """
        host = np.ascontiguousarray(np.frombuffer(array, np.uint8) if isinstance(array, bytes) else array)
        self._range(offset, host.nbytes)
        if host.nbytes == 0:
            return host
        d = driver()
        if stream is None:
            check(d.cuMemcpyHtoD(self.ptr + offset, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
        else:
            check(d.cuMemcpyHtoDAsync(self.ptr + offset, host.ctypes.data, host.nbytes, stream.handle),
                  "cuMemcpyHtoDAsync")
        return host

    def download(self, offset: int = 0, nbytes: int | None = None,
                 stream: Stream | None = None) -> np.ndarray:
        """A host copy (``uint8`` array) of ``nbytes`` at ``offset``; waits for ``stream`` first."""
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        self._range(offset, nbytes)
        if stream is not None:
            stream.synchronize()
        out = np.empty(nbytes, np.uint8)
        if nbytes:
            check(driver().cuMemcpyDtoH(out.ctypes.data, self.ptr + offset, nbytes), "cuMemcpyDtoH")
        return out

    def memset_zero(self) -> None:
        """Zero the whole buffer (asynchronous to the host; ordered on the legacy default stream)."""
        if self.nbytes:
            check(driver().cuMemsetD8(self.ptr, 0, self.nbytes), "cuMemsetD8")

    def close(self) -> None:
        if self.handle is not None:
            check(driver().cuMemFree(self.handle), "cuMemFree")
            self.handle = None

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Event:
    """A timing event: ``start.record(s); ...; end.record(s); start.elapsed_ms(end)``."""

    def __init__(self) -> None:
        self.handle = check(driver().cuEventCreate(0), "cuEventCreate")  # 0 = CU_EVENT_DEFAULT (timed)

    def record(self, stream: Stream) -> None:
        check(driver().cuEventRecord(self.handle, stream.handle), "cuEventRecord")

    def synchronize(self) -> None:
        check(driver().cuEventSynchronize(self.handle), "cuEventSynchronize")

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (waits for ``end``)."""
        end.synchronize()
        return float(check(driver().cuEventElapsedTime(self.handle, end.handle), "cuEventElapsedTime"))

    def close(self) -> None:
        if self.handle is not None:
            check(driver().cuEventDestroy(self.handle), "cuEventDestroy")
            self.handle = None


# -- modules and functions ----------------------------------------------------------------------


class Function:
    """A kernel in a loaded module."""

    def __init__(self, handle: Any, name: str):
        self.handle = handle
        self.name = name
        self._smem_limit = DEFAULT_DYNAMIC_SMEM

    def require_smem(self, nbytes: int) -> None:
        """Raise the kernel's dynamic shared-memory limit to ``nbytes`` when past the 48 KB default."""
        if nbytes > self._smem_limit:
            d = driver()
            attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(d.cuFuncSetAttribute(self.handle, attr, int(nbytes)),
                  f"cuFuncSetAttribute({self.name}, MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes})")
            self._smem_limit = nbytes

    def param_sizes(self) -> tuple[int, ...] | None:
        """The byte size of each of the kernel's parameters, or ``None`` where the driver can't say.

        Uses ``cuFuncGetParamInfo`` (CUDA 12.4+), which answers ``CUDA_ERROR_INVALID_VALUE`` one
        past the last parameter.
        """
        d = driver()
        if not hasattr(d, "cuFuncGetParamInfo"):
            return None
        sizes = []
        while True:
            err, _offset, size = d.cuFuncGetParamInfo(self.handle, len(sizes))
            if err == d.CUresult.CUDA_ERROR_INVALID_VALUE:
                return tuple(sizes)
            if err != d.CUresult.CUDA_SUCCESS:
                return None  # e.g. CUDA_ERROR_NOT_SUPPORTED on an older driver
            sizes.append(int(size))


class Module:
    """A cubin (or fatbin) loaded with ``cuModuleLoadData`` into the current context."""

    def __init__(self, image: bytes):
        # A private, contiguous copy: the driver reads the image during the call only.
        self._image = np.frombuffer(bytes(image), np.uint8).copy()
        self.handle = check(driver().cuModuleLoadData(self._image.ctypes.data), "cuModuleLoadData")
        self._functions: dict[str, Function] = {}

    def function(self, name: str) -> Function:
        """The kernel ``name`` (its ``extern "C"`` symbol); ``CudaError`` when absent."""
        if name not in self._functions:
            handle = check(driver().cuModuleGetFunction(self.handle, name.encode()),
                           f"cuModuleGetFunction({name!r})")
            self._functions[name] = Function(handle, name)
        return self._functions[name]

    def global_address(self, name: str) -> tuple[int, int]:
        """Device address and size of the ``__device__`` variable ``name`` (its mangled symbol)."""
        ptr, size = check(driver().cuModuleGetGlobal(self.handle, name.encode()), f"cuModuleGetGlobal({name!r})")
        return int(ptr), int(size)

    def close(self) -> None:
        if self.handle is not None:
            check(driver().cuModuleUnload(self.handle), "cuModuleUnload")
            self.handle = None

    def __enter__(self) -> "Module":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- kernel arguments and launches --------------------------------------------------------------


class PackedArgs:
    """Kernel arguments as the driver reads them, kept alive as long as this object lives.

    ``cuLaunchKernel(..., kernelParams, ...)`` and ``CUDA_KERNEL_NODE_PARAMS.kernelParams`` both
    take a ``void**``: an array of N pointers, the i-th pointing at the bytes of parameter i, from
    which the driver copies as many bytes as the kernel's image says parameter i has. Here each
    value sits in its own 8-byte slot of ``values`` (a pointer fills it; an ``int``/``float`` the
    first 4 bytes), and ``pointers[i]`` is the address of slot i. cuda-bindings accepts a plain
    ``int`` address for ``kernelParams`` and passes it through as the ``void**``; the cuda-python
    overview ("Preparing kernel arguments", SAXPY example) packs arguments the same way.
    """

    def __init__(self, params: Sequence[Param], values: Sequence[Any]):
        if len(params) != len(values):
            raise ValueError(f"{len(values)} values for {len(params)} parameters")
        self.params = tuple(params)
        self.values = np.zeros(max(len(params), 1), np.uint64)  # one 8-byte slot per parameter
        for i, (p, v) in enumerate(zip(params, values)):
            self.values[i : i + 1].view(_SLOT_DTYPE[p.kind])[0] = _scalar(p, v)
        base = self.values.ctypes.data
        self.pointers = np.array([base + 8 * i for i in range(len(params))] or [0], np.uint64)

    @property
    def address(self) -> int:
        """The ``void**`` to hand to the driver (0 for a kernel without parameters)."""
        return int(self.pointers.ctypes.data) if self.params else 0


_SLOT_DTYPE = {ArgKind.PTR: np.uint64, ArgKind.I32: np.int32, ArgKind.F32: np.float32}


def _scalar(p: Param, v: Any) -> int | float:
    """Check ``v`` against ``p``'s kind: a pointer is an int address (None: null), i32 an int, f32 a real."""
    if p.kind is ArgKind.PTR:
        if v is None:
            return 0
        v = getattr(v, "ptr", v)  # a DeviceBuffer stands for its address
        if not isinstance(v, (int, np.integer)) or not 0 <= int(v) < 2**64:
            raise ValueError(f"pointer parameter {p.name!r} got {v!r}, not a device address")
        return int(v)
    if v is None:
        raise ValueError(f"scalar parameter {p.name!r} has no value")
    if p.kind is ArgKind.I32:
        if isinstance(v, (float, np.floating)) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"i32 parameter {p.name!r} got {v!r}, not an integer")
        if not _I32_MIN <= int(v) <= _I32_MAX:
            raise ValueError(f"i32 parameter {p.name!r} = {v} does not fit in 32 bits")
        return int(v)
    if not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"f32 parameter {p.name!r} got {v!r}, not a number")
    return float(v)


def pack_args(params: Sequence[Param], values: Sequence[Any]) -> PackedArgs:
    """Pack ``values`` (device addresses or None for pointers, numbers for scalars) per ``params``."""
    return PackedArgs(params, values)


@dataclass
class KernelLaunch:
    """One launch: what ``launch`` takes, and one node of a ``Graph``."""

    function: Function
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: PackedArgs
    pdl: bool = False  # may start before the launch ahead of it ends (it waits with griddepcontrol)


def launch(function: Function, grid: Sequence[int], block: Sequence[int], smem: int,
           args: PackedArgs, stream: Stream) -> None:
    """Queue one ``cuLaunchKernel`` on ``stream`` (raising the smem limit first when needed)."""
    function.require_smem(smem)
    gx, gy, gz = grid
    bx, by, bz = block
    check(driver().cuLaunchKernel(function.handle, gx, gy, gz, bx, by, bz, smem, stream.handle,
                                  args.address, 0), f"cuLaunchKernel({function.name})")


class Graph:
    """A CUDA graph of ``launches``, in order, instantiated once.

    Launch i runs after launch i-1 and sees its writes, exactly as on a stream. A launch marked
    ``pdl`` is joined to the one before it by a programmatic edge instead (Hopper's programmatic
    dependent launch): it may be scheduled while its predecessor finishes and waits for it itself
    with ``griddepcontrol.wait``, which hides the launch gap. Graphs without such launches are
    built node by node (``cuGraphAddKernelNode``); graphs with them by capturing ``cuLaunchKernelEx``
    with the programmatic-serialization attribute on a stream, which the driver turns into
    programmatic edges. ``launches`` (and so their packed arguments) live as long as the graph.
    """

    def __init__(self, launches: Sequence[KernelLaunch], stream: Stream | None = None):
        d = driver()
        self.launches = list(launches)
        self.handle = None
        self.exec = None
        for k in self.launches:
            k.function.require_smem(k.smem)
        if any(k.pdl for k in self.launches[1:]):
            self._capture(stream or Stream())
        else:
            self._add_nodes()
        self.exec = check(d.cuGraphInstantiate(self.handle, 0), "cuGraphInstantiate")

    def _add_nodes(self) -> None:
        d = driver()
        self.handle = check(d.cuGraphCreate(0), "cuGraphCreate")
        previous: list[Any] = []
        for k in self.launches:
            node_params = d.CUDA_KERNEL_NODE_PARAMS()
            node_params.func = k.function.handle  # kern and ctx stay NULL: use func, current context
            node_params.gridDimX, node_params.gridDimY, node_params.gridDimZ = (int(x) for x in k.grid)
            node_params.blockDimX, node_params.blockDimY, node_params.blockDimZ = (int(x) for x in k.block)
            node_params.sharedMemBytes = int(k.smem)
            node_params.kernelParams = k.args.address
            node_params.extra = 0
            node = check(d.cuGraphAddKernelNode(self.handle, previous, len(previous), node_params),
                         f"cuGraphAddKernelNode({k.function.name})")
            previous = [node]

    def _capture(self, stream: Stream) -> None:
        d = driver()
        check(d.cuStreamBeginCapture(stream.handle, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              "cuStreamBeginCapture")
        try:
            for i, k in enumerate(self.launches):
                config = d.CUlaunchConfig()
                config.gridDimX, config.gridDimY, config.gridDimZ = (int(x) for x in k.grid)
                config.blockDimX, config.blockDimY, config.blockDimZ = (int(x) for x in k.block)
                config.sharedMemBytes = int(k.smem)
                config.hStream = stream.handle
                if k.pdl and i > 0:
                    value = d.CUlaunchAttributeValue()
                    value.programmaticStreamSerializationAllowed = 1
                    attr = d.CUlaunchAttribute()
                    attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                    attr.value = value
                    config.attrs, config.numAttrs = [attr], 1
                else:
                    config.numAttrs = 0
                check(d.cuLaunchKernelEx(config, k.function.handle, k.args.address, 0),
                      f"cuLaunchKernelEx({k.function.name})")
        finally:
            self.handle = check(d.cuStreamEndCapture(stream.handle), "cuStreamEndCapture")

    def launch(self, stream: Stream) -> None:
        """Queue one replay on ``stream``."""
        check(driver().cuGraphLaunch(self.exec, stream.handle), "cuGraphLaunch")

    def close(self) -> None:
        d = driver()
        if self.exec is not None:
            check(d.cuGraphExecDestroy(self.exec), "cuGraphExecDestroy")
            self.exec = None
        if self.handle is not None:
            check(d.cuGraphDestroy(self.handle), "cuGraphDestroy")
            self.handle = None
