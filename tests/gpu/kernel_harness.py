"""Run ONE kernel from a cubin on numpy inputs and get the outputs back: the harness for kernel tests.

Use it from any test in ``tests/gpu/`` (``conftest.py`` there marks every test ``gpu`` and skips
them all when there is no GPU)::

    from kernel_harness import run_kernel, nvcc_cubin

    def test_take_last(cuda_context):          # the fixture makes the skip explicit; optional
        cubin = nvcc_cubin(SOURCE)              # or targets.build_kernels(...) for the real kernels
        x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float16)
        out = np.full((1, 64), np.nan, np.float16)   # poison outputs: unwritten elements show
        got = run_kernel(cubin, "take_last_f16", grid=(1, 1, 1), block=(64, 1, 1), smem=0,
                         params="take_last",    # a KERNEL_ABI op name, or a sequence of Param
                         args={"out": out, "x": x, "n_real": np.array([5], np.int32), "hidden": 64})
        np.testing.assert_array_equal(got["out"][0], x[4])

``run_kernel(cubin, kernel, grid, block, smem, params, args) -> dict[str, np.ndarray]``

- ``params``: the kernel's parameter list, in order: an op name of ``abi.ops.KERNEL_ABI``
  (``"linear"``, ...) or a sequence of ``abi.ops.Param``.
- ``args``: one entry per parameter name, nothing more, nothing less:
  a numpy array for a pointer parameter (copied to its own device allocation, C order, its own
  dtype: pass the dtype the kernel expects), ``None`` for a null pointer, an ``int`` for ``i32``,
  a ``float``/``int`` for ``f32``.
- Returns every array argument downloaded after the launch (same dtype and shape, fresh arrays;
  inputs too, so in-place kernels can be checked). The inputs you passed are not modified.
- ``grid``/``block`` are 3-tuples; ``smem`` is dynamic shared memory in bytes (above 48 KB the
  kernel's limit is raised for you). The launch is synchronized, and a kernel fault raises
  ``CudaError`` naming the failing call. An illegal address poisons the CUDA context for the rest
  of the process: later GPU tests then fail too, so read the first failure.

``nvcc_cubin(source, arch="sm_90", options=())`` compiles a CUDA source string to cubin bytes with
nvcc (cached per source and options in a temporary folder); kernels must be ``extern "C"``.

``run_chain(launches, shared) -> dict[str, np.ndarray]`` runs several ``Launch``es as one CUDA
graph (programmatic edges where ``Launch.pdl``): an argument ``Shared("h")`` is the device copy of
``shared["h"]`` (one buffer for every launch and parameter that names it: aliasing, chaining), an
array is uploaded for that launch alone. Returns the shared buffers read back.

``seeded(*key)`` is a numpy generator seeded by a test case's parameters (a failure replays).

``context()`` is the process-wide ``cuda_driver.Context`` the harness uses (the ``cuda_context``
fixture returns the same object).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grokc.abi.ops import KERNEL_ABI, ArgKind, Param
from grokc.runner import cuda_driver as cd

_CONTEXT: cd.Context | None = None
_STREAM: cd.Stream | None = None


def context() -> cd.Context:
    """The harness's context on GPU 0 (created on first use, kept for the process)."""
    global _CONTEXT, _STREAM
    if _CONTEXT is None:
        _CONTEXT = cd.Context(0)
        _STREAM = cd.Stream()
    _CONTEXT.make_current()
    return _CONTEXT


def find_nvcc() -> str | None:
    """nvcc's path: on PATH, else the usual install folders; None when absent."""
    for candidate in (shutil.which("nvcc"), "/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def nvcc_cubin(source: str, arch: str = "sm_90", options: Sequence[str] = ()) -> bytes:
    """Compile ``source`` (CUDA C++) to a cubin for ``arch`` with nvcc and return its bytes."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found (looked on PATH, /usr/local/bin, /usr/local/cuda/bin)")
    key = hashlib.sha256("\0".join([source, arch, *options]).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "grokc-test-cubins"
    folder.mkdir(exist_ok=True)
    cubin = folder / f"{key}.cubin"
    if not cubin.exists():
        src = folder / f"{key}.cu"
        src.write_text(source)
        tmp = folder / f"{key}.tmp.cubin"
        cmd = [nvcc, "--cubin", f"-arch={arch}", *options, "-o", str(tmp), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{proc.stderr}")
        tmp.replace(cubin)
    return cubin.read_bytes()


def seeded(*key) -> np.random.Generator:
    """A generator seeded by the test case, so a failure replays."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def run_kernel(cubin: bytes, kernel: str, grid: Sequence[int], block: Sequence[int], smem: int,
               params: str | Sequence[Param], args: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Launch ``kernel`` once on ``args`` and return every array argument read back (see module doc)."""
    plist = KERNEL_ABI[params] if isinstance(params, str) else tuple(params)
    names = [p.name for p in plist]
    if set(args) != set(names):
        missing = [n for n in names if n not in args]
        extra = [n for n in args if n not in names]
        raise ValueError(f"args do not match the parameters {names}: missing {missing}, unexpected {extra}")
    context()
    assert _STREAM is not None
    buffers: dict[str, tuple[cd.DeviceBuffer, np.ndarray]] = {}
    module = cd.Module(cubin)
    try:
        values = []
        for p in plist:
            v = args[p.name]
            if isinstance(v, np.ndarray):
                if p.kind is not ArgKind.PTR:
                    raise ValueError(f"parameter {p.name!r} is {p.kind.value}, but got an array")
                host = np.ascontiguousarray(v)
                buf = cd.DeviceBuffer(max(host.nbytes, 256))
                buf.upload(host)
                buffers[p.name] = (buf, v)
                values.append(buf.ptr)
            else:
                values.append(v)
        packed = cd.pack_args(plist, values)
        cd.launch(module.function(kernel), tuple(grid), tuple(block), smem, packed, _STREAM)
        _STREAM.synchronize()
        out = {}
        for name, (buf, given) in buffers.items():
            raw = buf.download(0, given.nbytes)
            out[name] = raw.view(given.dtype).reshape(given.shape)
        return out
    finally:
        for buf, _ in buffers.values():
            buf.close()
        module.close()


class Shared(str):
    """An argument of ``run_chain``: the device copy of ``shared[name]``."""


@dataclass(frozen=True)
class Launch:
    """One kernel launch of ``run_chain``; ``args`` as ``run_kernel``'s, plus ``Shared`` names."""

    cubin: bytes
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    params: str | Sequence[Param]
    args: Mapping[str, Any]
    pdl: bool = False  # a programmatic edge from the launch before (sm_90+)


def run_chain(launches: Sequence[Launch], shared: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``launches`` in order as one CUDA graph and return ``shared`` read back (see module doc)."""
    context()
    buffers: list[cd.DeviceBuffer] = []
    modules: list[cd.Module] = []

    def upload(a: np.ndarray) -> cd.DeviceBuffer:
        buf = cd.DeviceBuffer(max(a.nbytes, 256))
        buf.upload(np.ascontiguousarray(a))
        buffers.append(buf)
        return buf

    try:
        named = {name: upload(a) for name, a in shared.items()}
        nodes = []
        for launch in launches:
            plist = KERNEL_ABI[launch.params] if isinstance(launch.params, str) else tuple(launch.params)
            values = []
            for p in plist:
                v = launch.args[p.name]
                if isinstance(v, Shared):
                    v = named[v].ptr
                elif isinstance(v, np.ndarray):
                    v = upload(v).ptr
                values.append(v)
            modules.append(cd.Module(launch.cubin))
            nodes.append(cd.KernelLaunch(modules[-1].function(launch.kernel), tuple(launch.grid), tuple(launch.block),
                                         launch.smem, cd.pack_args(plist, values), pdl=launch.pdl))
        stream = cd.Stream()
        graph = cd.Graph(nodes, stream)
        try:
            graph.launch(stream)
            stream.synchronize()
        finally:
            graph.close()
            stream.close()
        return {name: named[name].download(0, a.nbytes).view(a.dtype).reshape(a.shape) for name, a in shared.items()}
    finally:
        for module in modules:
            module.close()
        for buf in buffers:
            buf.close()
