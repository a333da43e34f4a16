"""A model as an ONNX graph (opset 20), built with `onnx.helper`: to run the same model in
onnxruntime (the end-to-end check and the benchmarks' baseline) and to round-trip through the
importer. Needs the `onnx` extra.

    save_onnx(get_model("bert_layer"), "bert_layer.onnx")

Every node keeps its name and output name; weights are initializers. ScaleShift (a folded
BatchNormalization) is written as a BatchNormalization with mean 0, variance 1 and epsilon 0,
which computes the same numbers and imports back as the same node.

See docs/ARCHITECTURE.md §18 Models.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .graph import Model, Node
from .op import ModelError

OPSET = 20


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise ModelError("ONNX export needs the onnx package (pip install 'eqsched[onnx]')"
                         ) from None
    return onnx


class _Graph:
    """The nodes and initializers being written."""

    def __init__(self, onnx: Any, model: Model):
        self.onnx, self.model = onnx, model
        self.nodes: list[Any] = []
        read = {i for n in _exported(model) for i in _read(n)}
        self.initializers = [onnx.numpy_helper.from_array(np.asarray(w), k)
                             for k, w in model.weights.items() if k in read]
        self.names = set(model.weights) | set(model.inputs) | {n.name for n in model.nodes}

    def constant(self, base: str, array: np.ndarray) -> str:
        """A fresh initializer named after `base`."""
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}{k}"
        self.names.add(name)
        self.initializers.append(self.onnx.numpy_helper.from_array(array, name))
        return name

    def emit(self, node: Node, op_type: str, inputs: list[str] | None = None, **attrs) -> None:
        self.nodes.append(self.onnx.helper.make_node(
            op_type, list(node.inputs) if inputs is None else inputs, [node.name],
            name=node.name, **attrs))


def _same(g: _Graph, node: Node) -> None:
    g.emit(node, node.op.op_type)


def _gelu(g: _Graph, node: Node) -> None:
    g.emit(node, "Gelu", approximate="none" if node.op.op_type == "Gelu" else "tanh")


def _gemm(g: _Graph, node: Node) -> None:
    op = node.op
    g.emit(node, "Gemm", alpha=op.alpha, beta=op.beta, transA=int(op.trans_a),
           transB=int(op.trans_b))


def _read(node: Node) -> tuple[str, ...]:
    """The values a node's ONNX form reads. A Winograd convolution (`model.winograd`) is
    exported as the Conv it computes: its output node as that Conv of the convolution's own
    input, filter and bias, so its transforms and product are read by nothing exported."""
    return node.inputs[1:] if node.op.op_type == "WinogradOutput" else node.inputs


def _exported(model: Model) -> list[Node]:
    """The nodes the model's outputs need, by what their ONNX forms read, in the model's order."""
    needed = set(model.outputs)
    for n in reversed(model.nodes):
        if n.name in needed:
            needed.update(_read(n))
    return [n for n in model.nodes if n.name in needed]


def _conv(g: _Graph, node: Node) -> None:
    kernel = g.model.shape(_read(node)[1])[2:]
    g.emit(node, "Conv", list(_read(node)), kernel_shape=list(kernel), pads=list(node.op.pads),
           strides=list(getattr(node.op, "strides", (1, 1))))


def _scale_shift(g: _Graph, node: Node) -> None:
    channels = g.model.shape(node.inputs[1])
    mean = g.constant(f"{node.name}_mean", np.zeros(channels, np.float32))
    var = g.constant(f"{node.name}_var", np.ones(channels, np.float32))
    g.emit(node, "BatchNormalization", [*node.inputs, mean, var], epsilon=0.0)


def _reduce(g: _Graph, node: Node) -> None:
    axes = list(node.op.axes)
    inputs = list(node.inputs)
    if axes:
        inputs.append(g.constant(f"{node.name}_axes", np.array(axes, np.int64)))
    g.emit(node, node.op.op_type, inputs, keepdims=int(node.op.keepdims))


def _softmax(g: _Graph, node: Node) -> None:
    g.emit(node, "Softmax", axis=node.op.axis)


def _layer_norm(g: _Graph, node: Node) -> None:
    g.emit(node, "LayerNormalization", axis=node.op.axis, epsilon=node.op.epsilon)


def _transpose(g: _Graph, node: Node) -> None:
    rank = len(node.shape)
    g.emit(node, "Transpose", perm=list(node.op.perm or reversed(range(rank))))


def _reshape(g: _Graph, node: Node) -> None:
    shape = g.constant(f"{node.name}_shape", np.array(node.shape, np.int64))
    g.emit(node, "Reshape", [node.inputs[0], shape])


_EXPORTERS: dict[str, Callable[[_Graph, Node], None]] = {
    **{t: _same for t in ("MatMul", "Add", "Sub", "Mul", "Div", "Relu", "Tanh", "Exp", "Erf",
                          "Sqrt", "Sigmoid")},
    "Gelu": _gelu, "GeluTanh": _gelu, "Gemm": _gemm, "Conv": _conv, "WinogradOutput": _conv,
    "ScaleShift": _scale_shift,
    "ReduceSum": _reduce, "ReduceMean": _reduce, "ReduceMax": _reduce, "Softmax": _softmax,
    "LayerNormalization": _layer_norm, "Transpose": _transpose, "Reshape": _reshape,
}


def to_onnx(model: Model) -> Any:
    """The model as an `onnx.ModelProto` (checked by `onnx.checker`)."""
    onnx = _onnx()
    g = _Graph(onnx, model)
    for node in _exported(model):
        if node.op.op_type not in _EXPORTERS:
            raise ModelError(f"{model.name}: node {node.name!r} ({node.op.op_type}) has no ONNX "
                             f"form")
        _EXPORTERS[node.op.op_type](g, node)

    def info(name: str) -> Any:
        return onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                  list(model.shape(name)))

    graph = onnx.helper.make_graph(g.nodes, model.name, [info(k) for k in model.inputs],
                                   [info(k) for k in model.outputs], g.initializers)
    proto = onnx.helper.make_model(graph, producer_name="eqsched",
                                   opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(proto, full_check=True)
    return proto


def save_onnx(model: Model, path: str | Path) -> Path:
    path = Path(path)
    _onnx().save(to_onnx(model), str(path))
    return path


__all__ = ["OPSET", "save_onnx", "to_onnx"]
