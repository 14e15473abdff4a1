"""Side values of an ONNX graph computed on probe inputs, with onnx's reference evaluator.

``Evaluator(model, graph)(values, feeds, shapes)`` cuts out the nodes ``values`` depend on, down to
the graph inputs in ``feeds``, the constants, and the values of ``shapes``: a ``Shape`` of one of
those becomes a constant of the shape given for it (the activations' shapes on the probe, which
the conversion knows from their kinds), so no activation is ever computed. The cut-out graph runs
in ``onnx.reference.ReferenceEvaluator``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from grokc.compiler.frontends.graph.opgraph import OpGraph
from grokc.core.errors import UnsupportedModel


class Evaluator:
    def __init__(self, model: onnx.ModelProto, graph: OpGraph):
        self._model, self._graph = model, graph
        self._nodes = {o: n for n in model.graph.node for o in n.output if o}

    def __call__(self, values: Sequence[str], feeds: Mapping[str, np.ndarray],
                 shapes: Mapping[str, tuple]) -> list[np.ndarray]:
        nodes, inits, inputs = self._cone(values, feeds, shapes)
        graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(
            feeds[i].dtype), feeds[i].shape) for i in inputs], [helper.make_empty_tensor_value_info(v) for v in values],
            initializer=inits)
        probe = helper.make_model(graph, opset_imports=list(self._model.opset_import), ir_version=self._model.ir_version)
        try:
            return list(ReferenceEvaluator(probe).run(list(values), {i: feeds[i] for i in inputs}))
        except Exception as exc:   # the reference evaluator raises whatever its op raises  # noqa: BLE001
            raise UnsupportedModel(f"{self._graph.source}: cannot compute {list(values)} from the graph's inputs "
                                   f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                                   "grokc checks masks and rotary tables by computing them") from exc

    def _cone(self, values: Sequence[str], feeds: Mapping[str, np.ndarray], shapes: Mapping[str, tuple]):
        g = self._graph
        order = {id(n): i for i, n in enumerate(self._model.graph.node)}
        picked: dict[int, onnx.NodeProto] = {}
        inits: dict[str, onnx.TensorProto] = {}
        inputs: set[str] = set()
        stack, seen = list(values), set()
        while stack:
            v = stack.pop()
            if not v or v in seen:
                continue
            seen.add(v)
            if v in feeds:
                inputs.add(v)
                continue
            node = self._nodes.get(v)
            if node is not None and node.op_type == "Shape" and node.input[0] in shapes:
                picked[id(node)] = _shape_constant(node, shapes[node.input[0]])
                continue
            if node is None or (node.op_type == "Constant" and v in g.constants):
                if v not in g.constants:
                    raise UnsupportedModel(f"{g.source}: '{v}' is needed to check the graph but is neither an input, "
                                           "a constant nor computed by a node")
                inits[v] = numpy_helper.from_array(np.ascontiguousarray(g.constants[v]), v)
                continue
            picked[id(node)] = node
            stack.extend(node.input)
        nodes = [picked[k] for k in sorted(picked, key=lambda k: order.get(k, -1))]
        return nodes, list(inits.values()), sorted(inputs)


def _shape_constant(node: onnx.NodeProto, shape: tuple) -> onnx.NodeProto:
    attrs = {a.name: a.i for a in node.attribute}
    dims = np.array(shape, np.int64)[attrs.get("start", 0):attrs.get("end", len(shape))]
    return helper.make_node("Constant", [], [node.output[0]], value=numpy_helper.from_array(dims))
