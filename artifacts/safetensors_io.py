"""Read and write the safetensors format with numpy alone (the runner has no other dependency).

Layout: an 8-byte little-endian header length, a JSON header mapping each tensor name to its
dtype, shape and byte range, then the raw little-endian data. The writer sorts names, aligns
each tensor to 64 bytes and emits the header with sorted keys, so equal inputs give equal bytes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Mapping

import numpy as np

from grokc.core.errors import ArtifactError

_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "U8": np.uint8, "I8": np.int8, "I64": np.int64}
_CODES = {np.dtype(v).name: k for k, v in _DTYPES.items()}
_ALIGN = 64


def save(path: Path, tensors: Mapping[str, np.ndarray]) -> None:
    header: dict[str, dict] = {}
    offset = 0
    order = sorted(tensors)
    for name in order:
        a = tensors[name]
        offset = -(-offset // _ALIGN) * _ALIGN
        header[name] = {"dtype": _CODES[a.dtype.name], "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % _ALIGN)  # data starts aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        start = f.tell()
        for name in order:
            f.seek(start + header[name]["data_offsets"][0])
            f.write(np.ascontiguousarray(tensors[name]).astype(tensors[name].dtype.newbyteorder("<"), copy=False).tobytes())
        f.truncate(start + offset)


def load(path: Path) -> dict[str, np.ndarray]:
    """Tensors of a safetensors file as read-only arrays backed by a memory map."""
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
        (n,) = struct.unpack("<Q", data[:8].tobytes())
        header = json.loads(data[8:8 + n].tobytes())
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path.name} is not a readable safetensors file ({e}); rebuild the artifact") from None
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if info["dtype"] not in _DTYPES or base + end > data.size:
            raise ArtifactError(f"{path.name}: tensor '{name}' is corrupt or truncated; rebuild the artifact")
        out[name] = data[base + begin:base + end].view(_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out
