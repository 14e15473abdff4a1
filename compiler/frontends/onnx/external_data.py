"""Where an ONNX tensor's external data lies, checked before any file of it is opened.

A tensor stored outside the ``.onnx`` file names its bytes with ``external_data`` entries:
``location`` (a file), ``offset`` and ``length``. The file is a model's own content, so a hostile
model could name ``../../home/me/.ssh/id_rsa`` or ``/etc/shadow`` and have grokc read (and hash, and
put into an artifact) whatever lies there. ``locate`` accepts only:

- a ``location`` that is a plain relative path inside the model's folder: not empty, not absolute,
  no ``..`` or empty component, no backslash or drive letter, no NUL;
- a file reached through it that lies inside the model's folder once symbolic links are followed,
  or inside the folder the ``.onnx`` file itself resolves to (the Hugging Face cache keeps both the
  graph and its data as links into one ``blobs`` folder); links are resolved without opening
  anything, and no file is opened before its path is known to stay inside;
- ``offset`` and ``length`` written as decimal byte counts, ``length`` (when given) the tensor's
  size (its dimensions times its dtype's item size), and the bytes within the file.

Anything else is one ``UnsupportedModel`` line naming the tensor and the location.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from grokc.core.errors import UnsupportedModel

_BYTE_COUNT = re.compile(r"[0-9]{1,20}")


@dataclass(frozen=True)
class ExternalData:
    """The checked place of one tensor's bytes."""

    file: Path        # the data file, inside the model's folder
    offset: int       # first byte of the tensor in ``file``
    nbytes: int       # the tensor's size in bytes
    dtype: np.dtype   # its element type


def locate(t: onnx.TensorProto, model: Path) -> ExternalData:
    """The checked external data of ``t``, a tensor of the ONNX file ``model`` (see the module doc)."""
    entries = {e.key: e.value for e in t.external_data}
    location = entries.get("location", "")
    where = f"ONNX model '{model.name}' keeps tensor '{t.name}' in '{location}'"
    if not _plain_relative(location):
        raise UnsupportedModel(f"{where}, which is not a plain relative path inside the model's folder; keep the "
                               "external-data file beside the .onnx file and name it without '..' or a leading '/'")
    file = model.parent / location
    roots = (model.parent.resolve(), model.resolve().parent)
    real = file.resolve()
    if not any(real.is_relative_to(root) for root in roots):
        raise UnsupportedModel(f"{where}, which is a symbolic link to '{real}' outside the model's folder; copy the "
                               "external-data file beside the .onnx file")
    if not real.is_file():
        raise UnsupportedModel(f"{where}, which is missing; keep the external-data file beside the .onnx file")
    offset, length = entries.get("offset", "0"), entries.get("length")
    for key, value in (("offset", offset), ("length", length)):
        if value is not None and not _BYTE_COUNT.fullmatch(value):
            raise UnsupportedModel(f"{where} with {key} '{value[:40]}', which is not a byte count; export the "
                                   "model again")
    dtype = _dtype(t, model)
    if any(d < 0 for d in t.dims):
        raise UnsupportedModel(f"ONNX model '{model.name}' gives tensor '{t.name}' the shape {list(t.dims)}, with a "
                               "negative dimension; export the model again")
    nbytes = math.prod(t.dims) * dtype.itemsize
    size = real.stat().st_size
    if length is not None and int(length) != nbytes or int(offset) + nbytes > size:
        raise UnsupportedModel(f"external-data file '{location}' of '{model.name}' does not hold tensor '{t.name}' "
                               f"({length if length is not None else nbytes} bytes at offset {offset} of {size}, "
                               f"{nbytes} needed); the file is truncated or belongs to another export")
    return ExternalData(file, int(offset), nbytes, dtype)


def _plain_relative(location: str) -> bool:
    if not location or "\0" in location or "\\" in location or location.startswith("/"):
        return False
    if re.match(r"[A-Za-z]:", location):
        return False
    return all(part not in ("", "..") for part in location.split("/"))


def _dtype(t: onnx.TensorProto, model: Path) -> np.dtype:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
    except (KeyError, TypeError, ValueError):
        raise UnsupportedModel(f"ONNX model '{model.name}' gives tensor '{t.name}' the data type {t.data_type}, "
                               "which is not an ONNX tensor type; export the model again") from None
