"""The weights file: written by the ``safetensors`` library, read back with a checked memory map.

``save`` hands the tensors to ``safetensors.numpy.save_file``, so the file is what its name says
(the library orders tensors by dtype size, then name, with no holes; the same tensors give the
same bytes). ``load`` maps the file and checks its header before any tensor is used: a JSON
object of known dtypes and non-negative integer shapes whose ``data_offsets`` are in range,
ordered, without overlaps or holes, each exactly ``shape x dtype`` bytes; anything else is an
``ArtifactError``. Tensors come back as read-only views of the map. The GPU executor gives every
weight its own aligned address when it uploads them, so the file needs no alignment of its own.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import safetensors.numpy

from grokc.core.errors import ArtifactError

_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "U8": np.uint8, "I8": np.int8, "I64": np.int64}
MAX_HEADER = 100 << 20  # the library's own limit on the JSON header


def save(path: Path, tensors: Mapping[str, np.ndarray]) -> None:
    safetensors.numpy.save_file({n: np.ascontiguousarray(a) for n, a in tensors.items()}, str(path))


def load(path: Path) -> dict[str, np.ndarray]:
    """Tensors of a safetensors file as read-only arrays backed by a memory map."""
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)
    except OSError as e:
        raise ArtifactError(f"{path.name} cannot be read ({e.strerror}); rebuild the artifact") from None
    header, base = _header(data, path.name)
    out = {}
    for name, (dtype, shape, begin, end) in header.items():
        out[name] = data[base + begin:base + end].view(dtype).reshape(shape)
    return out


def _header(data: np.ndarray, name: str) -> tuple[dict[str, tuple[Any, tuple[int, ...], int, int]], int]:
    """The checked header: tensor name -> (dtype, shape, begin, end) of the data section, and where it starts."""
    def bad(why: str) -> ArtifactError:
        return ArtifactError(f"{name} is not a valid safetensors file ({why}); rebuild the artifact")

    if data.size < 8:
        raise bad("shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8].tobytes())
    if n > MAX_HEADER or 8 + n > data.size:
        raise bad(f"a header of {n} bytes in a file of {data.size}")
    try:
        raw = json.loads(data[8:8 + n].tobytes())
    except (ValueError, UnicodeDecodeError):
        raise bad("its header is not JSON") from None
    if not isinstance(raw, dict):
        raise bad("its header is not a JSON object")
    entries = []
    for tensor, info in raw.items():
        if tensor == "__metadata__":
            continue
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"tensor '{tensor}' has no dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise bad(f"tensor '{tensor}' has dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise bad(f"tensor '{tensor}' has shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise bad(f"tensor '{tensor}' has data_offsets {offsets!r}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype]).itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise bad(f"tensor '{tensor}' of shape {shape} {dtype} needs {nbytes} bytes but spans "
                      f"{offsets[1] - offsets[0]}")
        entries.append((offsets[0], offsets[1], tensor, _DTYPES[dtype], tuple(shape)))
    entries.sort()
    end = 0
    for begin, stop, tensor, _, _ in entries:
        if begin != end:
            raise bad(f"tensor '{tensor}' starts at byte {begin}, not where the one before it ends ({end})")
        end = stop
    base = 8 + n
    if base + end != data.size:
        raise bad(f"its tensors end at byte {base + end} of a {data.size}-byte file")
    return {t: (dtype, shape, begin, stop) for begin, stop, t, dtype, shape in entries}, base
