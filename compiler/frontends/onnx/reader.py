"""An ONNX file -> ``OpGraph``, read with the ``onnx`` package (no protobuf of our own).

- ``onnx.load`` without external data, so a damaged file is one ``UnsupportedModel`` line (protobuf's
  ``DecodeError``); local functions are inlined (``onnx.inliner``);
- opsets: the ONNX domain 14 .. 23 and ``com.microsoft`` 1 (onnxruntime's contrib ops); any other
  version is refused, naming it;
- initializers stored inline are converted by ``onnx.numpy_helper``; external ones (``x.onnx.data``,
  a model of any size) are mapped from their file as the tensor's ``external_data`` entries say
  (location, offset, length), after ``read_model`` checked every such place with
  ``external_data.locate`` (a file inside the model's folder that holds the tensor's bytes: a
  location leaving the folder, or a truncated file, is refused before anything is opened or matched);
- ``Constant`` nodes become constants; every other node becomes an ``OpNode`` with the domain dropped
  from its op, its attributes as Python values and, where an op takes them as constant inputs
  (``axes``, Slice's ``starts``/``ends``/``axes``/``steps``), those too; ``Cast``'s ``to`` as a numpy
  dtype name;
- shapes and dtypes of values from the graph's inputs, outputs and ``value_info`` (shape inference
  fills them in when the file has none), unknown dimensions as None, symbolic ones as their names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper
from onnx.external_data_helper import uses_external_data

from grokc.compiler.frontends.graph.opgraph import OpGraph, OpNode
from grokc.compiler.frontends.onnx.evaluate import Evaluator
from grokc.compiler.frontends.onnx.external_data import locate
from grokc.core.errors import UnsupportedModel

OPSETS = {"": (14, 23), "com.microsoft": (1, 1)}
_CONST_INPUTS = {  # op -> names of the inputs (by position) that are attributes in older opsets
    "ReduceMean": {1: "axes"}, "ReduceSum": {1: "axes"}, "Squeeze": {1: "axes"}, "Unsqueeze": {1: "axes"},
    "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"},
}


def read_model(path: Path) -> tuple[onnx.ModelProto, list[Path]]:
    """The model proto (external data not loaded) and the external-data files it refers to."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise UnsupportedModel(f"cannot read ONNX model '{path}' ({str(exc).splitlines()[0]}); the file is "
                               "truncated or not an ONNX model: export it again") from exc
    if not model.graph.node:
        raise UnsupportedModel(f"ONNX model '{path}' has no graph; export it again")
    for imp in model.opset_import:
        domain = "" if imp.domain == "ai.onnx" else imp.domain
        low, high = OPSETS.get(domain, (None, None))
        if low is None:
            continue   # a domain no node of a supported graph uses; its nodes are named if they appear
        if not low <= imp.version <= high:
            raise UnsupportedModel(f"ONNX model '{path}' uses opset {imp.version} of "
                                   f"{domain or 'ai.onnx'}; grokc reads {domain or 'ai.onnx'} opsets {low} to "
                                   f"{high}: export with opset_version={min(max(imp.version, low), high)}")
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    places = [locate(t, path) for t in _tensors(model) if uses_external_data(t)]
    return model, sorted({p.file for p in places})


def to_opgraph(model: onnx.ModelProto, path: Path) -> OpGraph:
    g = model.graph
    constants = _Initializers(g, path)
    nodes: list[OpNode] = []
    for i, n in enumerate(g.node):
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            constants.add(n.output[0], _constant_value(n, path))
            continue
        attrs = {a.name: _attr(a) for a in n.attribute}
        for pos, key in _CONST_INPUTS.get(n.op_type, {}).items():
            if pos < len(n.input) and n.input[pos] and constants.get(n.input[pos]) is not None:
                attrs[key] = [int(v) for v in np.asarray(constants[n.input[pos]]).reshape(-1)]
        if n.op_type == "Cast":
            attrs["to"] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(attrs["to"])).name
        domain = "" if n.domain == "ai.onnx" else n.domain
        nodes.append(OpNode(n.name or f"{n.op_type}_{i}", n.op_type, tuple(n.input), tuple(n.output), attrs,
                            f"{domain}.{n.op_type}" if domain else n.op_type))
    shapes, dtypes = _value_info(model, constants)
    inits = {t.name for t in g.initializer}
    inputs = tuple(v.name for v in g.input if v.name not in inits)
    graph = OpGraph(tuple(nodes), inputs, tuple(v.name for v in g.output), shapes, dtypes, constants,
                    evaluate=None, source=str(path))
    graph.evaluate = Evaluator(model, graph)
    return graph


class _Initializers(Mapping):
    """Initializers and Constant outputs by name, each converted (or mapped from its file) on first use."""

    def __init__(self, g: onnx.GraphProto, path: Path):
        self._protos = {t.name: t for t in g.initializer}
        self._arrays: dict[str, np.ndarray] = {}
        self._path = path

    def add(self, name: str, array: np.ndarray) -> None:
        self._arrays[name] = array

    def proto(self, name: str) -> onnx.TensorProto | None:
        return self._protos.get(name)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = _load(self._protos[name], self._path)
        return self._arrays[name]

    def __contains__(self, name: object) -> bool:
        return name in self._arrays or name in self._protos

    def __iter__(self) -> Iterator[str]:
        return iter({**self._protos, **self._arrays})

    def __len__(self) -> int:
        return len({**self._protos, **self._arrays})


def _load(t: onnx.TensorProto, path: Path) -> np.ndarray:
    if not uses_external_data(t):
        return numpy_helper.to_array(t)
    place = locate(t, path)
    if place.nbytes == 0:
        return np.zeros(tuple(t.dims), place.dtype)
    return np.memmap(place.file, dtype=place.dtype.newbyteorder("<"), mode="r", offset=place.offset,
                     shape=tuple(t.dims))


def _constant_value(n: onnx.NodeProto, path: Path) -> np.ndarray:
    a = n.attribute[0]
    if a.name == "value":
        return _load(a.t, path)
    if a.name in ("value_float", "value_int"):
        return np.array(onnx.helper.get_attribute_value(a), np.float32 if a.name == "value_float" else np.int64)
    if a.name in ("value_floats", "value_ints"):
        return np.array(onnx.helper.get_attribute_value(a), np.float32 if a.name == "value_floats" else np.int64)
    raise UnsupportedModel(f"ONNX model '{path.name}': Constant node '{n.name}' holds a {a.name}, which grokc "
                           "does not read")


def _attr(a: onnx.AttributeProto):
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
    return v


def _value_info(model: onnx.ModelProto, constants: _Initializers) -> tuple[dict, dict]:
    g = model.graph
    infos = list(g.input) + list(g.output) + list(g.value_info)
    if not g.value_info:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
            infos += list(inferred.graph.value_info)
        except Exception:   # shape inference is a help here, not a requirement  # noqa: BLE001
            pass
    shapes, dtypes = {}, {}
    for v in infos:
        t = v.type.tensor_type
        if t.elem_type:
            dtypes[v.name] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).name
        if t.HasField("shape"):
            shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param")
                                   else None for d in t.shape.dim)
    for t in g.initializer:
        shapes[t.name] = tuple(t.dims)
        dtypes[t.name] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).name
    return shapes, dtypes


def _tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from model.graph.initializer
    for n in model.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
