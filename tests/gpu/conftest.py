"""GPU tests: everything under ``tests/gpu/`` is marked ``gpu`` and skipped without a usable GPU.

A GPU is usable when ``cuda.bindings`` imports, ``cuInit`` succeeds and the driver sees at least
one device. Fixtures:

- ``cuda_context`` (session): the ``cuda_driver.Context`` on GPU 0 that ``kernel_harness`` uses.
- ``sm`` (session): the GPU's compute capability as one number (90 for an H200).
- ``run_kernel``: ``kernel_harness.run_kernel`` (launch one kernel on numpy arrays, read back).
- ``nvcc_cubin``: ``kernel_harness.nvcc_cubin`` (CUDA source string -> cubin bytes); skips the
  test when nvcc is missing.

Run them on a GPU machine from the repository root: ``python3 -m pytest tests/gpu -q``, with grokc
installed (``pip install -e .``) or, on a node without an install, after ``. scripts/device_env.sh``
(which makes ``import grokc`` resolve to the checkout).
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:  # so tests can `from kernel_harness import ...` in any import mode
    sys.path.insert(0, str(_HERE))

try:
    import grokc.runner  # noqa: F401
except ModuleNotFoundError as exc:  # a bare checkout on a GPU node
    raise pytest.UsageError(f"tests/gpu: {exc}; install grokc (pip install -e .) or first run "
                            "`. scripts/device_env.sh` from the repository root") from None

import kernel_harness  # noqa: E402


@lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        return f"cuda-python is not installed ({exc})"
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # libcuda.so cannot be loaded
        return f"no CUDA driver ({type(exc).__name__})"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"cuInit failed ({err.name})"
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        return "no CUDA device"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_unavailable_reason()
    for item in items:
        path = Path(str(getattr(item, "path", None) or item.fspath)).resolve()  # .path: pytest >= 7
        if _HERE not in path.parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {reason}"))


@pytest.fixture(scope="session")
def cuda_context():
    reason = gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs a GPU: {reason}")
    return kernel_harness.context()


@pytest.fixture(scope="session")
def sm(cuda_context) -> int:
    """The GPU's compute capability as one number (90 for sm_90)."""
    major, minor = cuda_context.compute_capability
    return 10 * major + minor


@pytest.fixture
def run_kernel(cuda_context):
    return kernel_harness.run_kernel


@pytest.fixture
def nvcc_cubin():
    if kernel_harness.find_nvcc() is None:
        pytest.skip("nvcc not found")
    return kernel_harness.nvcc_cubin
