"""Reading a CPU launch's parameters (``runner/cpu.py``, ``runner/cpu_moe.py``): a pointer as the numpy
view of the memory a kernel would read, a variant attribute checked against the ABI, and the
RMS-normalised input rows of a launch with a ``norm`` prologue."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from grokc.abi.ops import KERNEL_VARIANTS
from grokc.core.errors import ArtifactError

F16, F32, I32, U8 = np.float16, np.float32, np.int32, np.uint8


def arr(args: dict[str, Any], name: str, dtype: type, *shape: int) -> np.ndarray:
    """Pointer ``name`` as a ``[*shape]`` view of its leading elements (one ``-1``: as many rows as fit)."""
    a = args[name]
    if a.dtype != dtype:
        raise ArtifactError(f"parameter {name!r} holds {a.dtype} but the kernel ABI reads it as "
                            f"{np.dtype(dtype)}; rebuild the artifact with this grokc")
    assert a.flags.c_contiguous, f"{name} must be C-contiguous so that writes reach the arena"
    flat = a.reshape(-1)
    if -1 in shape:  # as many rows as the memory holds
        row = math.prod(s for s in shape if s != -1)
        shape = tuple((flat.size // row if row else 0) if s == -1 else s for s in shape)
    need = math.prod(shape)
    if flat.size < need:
        raise ArtifactError(f"parameter {name!r} has {flat.size} elements but the launch reads "
                            f"{need} as {list(shape)}; rebuild the artifact with this grokc")
    return flat[:need].reshape(shape)


def opt(args: dict[str, Any], name: str, dtype: type, *shape: int) -> np.ndarray | None:
    return None if args[name] is None else arr(args, name, dtype, *shape)


def variant(attrs: Mapping[str, str], op: str, key: str) -> str:
    """A variant attribute; a missing one takes the first (default) value in KERNEL_VARIANTS."""
    allowed = KERNEL_VARIANTS[op][key]
    value = attrs.get(key, allowed[0])
    if value not in allowed:
        raise ArtifactError(f"{op} launch has {key}={value!r} but this grokc knows only "
                            f"{list(allowed)}; rebuild the artifact with this grokc")
    return value


def as_f16(args: dict[str, Any], name: str, dtype: str, *shape: int) -> np.ndarray:
    """Pointer ``name`` as the f16 tensor it stands for: f16 as is, f32 rounded to f16."""
    return arr(args, name, F16, *shape) if dtype == "f16" else arr(args, name, F32, *shape).astype(F16)


def prologue(args: dict[str, Any], m: int, k: int, x_dtype: str = "f16") -> np.ndarray:
    """f32 ``[M, K]``: ``x``, RMS-normalised by ``norm`` and ``eps`` when ``norm`` is not null."""
    x = as_f16(args, "x", x_dtype, m, k).astype(F32)          # [M, K]
    norm = opt(args, "norm", F16, k)                          # [K]
    if norm is not None:
        inv_rms = F32(1) / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + F32(args["eps"]))  # [M, 1]
        x = x * inv_rms * norm.astype(F32)
    return x
