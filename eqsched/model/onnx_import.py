"""ONNX files as models: `import_onnx("model.onnx")`. Needs the `onnx` extra.

Initializers and Constant nodes are weights; every shape is static (a symbolic or unknown input
dimension is refused, naming the input). Each supported operator is one small converter from an
ONNX node to a builder call; an operator, attribute or attribute value eqsched does not support is
a one-line ModelError naming the node and the operator:

    model.onnx: node 'Conv_3' (Conv): group=2 is not supported

Value names become identifiers (other characters turn into `_`; `Model.source_names` keeps the
file's names of renamed inputs and outputs); messages keep ONNX's names.

See docs/ARCHITECTURE.md §18 Models.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from .builder import ModelBuilder
from .graph import Model, Value
from .op import ModelError

# ONNX's float, float16, double and bfloat16: inputs eqsched computes on in float32.
_FLOAT_TYPES = frozenset({1, 10, 11, 16})


def _onnx() -> Any:
    try:
        import onnx
        import onnx.numpy_helper
    except ImportError:
        raise ModelError("reading ONNX files needs the onnx package "
                         "(pip install 'eqsched[onnx]')") from None
    return onnx


@dataclass
class _Node:
    """One ONNX node being converted: its inputs as values, its attributes, its context."""

    ctx: _Importer
    proto: Any
    attrs: dict[str, Any]

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    def fail(self, problem: str) -> ModelError:
        return ModelError(f"{self.ctx.source}: node {self.ctx.node_label(self.proto)!r} "
                          f"({self.op_type}): {problem}")

    def attr(self, name: str, default: Any = None, allowed: Sequence[Any] | None = None) -> Any:
        value = self.attrs.pop(name, default)
        if allowed is not None and value not in allowed:
            raise self.fail(f"{name}={_show(value)} is not supported")
        return value

    def inputs(self, least: int, most: int, data: int | None = None) -> list[Value]:
        """The node's inputs as values, or its first `data` ones when the others are constants
        read with `constant` (an empty name is an omitted optional input, allowed last)."""
        names = list(self.proto.input)
        while names and not names[-1]:
            names.pop()
        if not least <= len(names) <= most or "" in names:
            raise self.fail(f"takes {least}" + (f" to {most}" if most > least else "")
                            + f" inputs, got {len(names)}")
        return [self.ctx.value(self, n) for n in names[:data]]

    def constant(self, index: int) -> np.ndarray | None:
        """Input `index` as a constant array (None: omitted); an input computed at run time is
        refused."""
        names = list(self.proto.input)
        if index >= len(names) or not names[index]:
            return None
        if names[index] not in self.ctx.constants:
            raise self.fail(f"input {index} ({names[index]!r}) must be a constant")
        return self.ctx.constants[names[index]]

    def name(self) -> str:
        return self.ctx.value_name(self.proto.output[0])


def _show(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Importer:
    def __init__(self, onnx: Any, proto: Any, source: str, name: str):
        self.onnx, self.source = onnx, source
        self.b = ModelBuilder(name)
        self.constants: dict[str, np.ndarray] = {}
        self.values: dict[str, Value] = {}
        self._identifiers: dict[str, str] = {}
        self.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
                          1)

    def node_label(self, node: Any) -> str:
        return node.name or node.output[0]

    def value_name(self, onnx_name: str) -> str:
        """A unique identifier for an ONNX value name."""
        if onnx_name not in self._identifiers:
            base = re.sub(r"_+", "_", re.sub(r"\W", "_", onnx_name)).strip("_") or "value"
            base = base if base[0].isalpha() else f"v_{base}"
            name, k = base, 1
            taken = set(self._identifiers.values())
            while name in taken or name in self.b:  # the builder names folded weights too
                k += 1
                name = f"{base}_{k}"
            self._identifiers[onnx_name] = name
        return self._identifiers[onnx_name]

    def value(self, node: _Node, onnx_name: str) -> Value:
        """The value an input name refers to; a constant becomes a weight on first use."""
        if onnx_name not in self.values:
            if onnx_name not in self.constants:
                raise node.fail(f"input {onnx_name!r} is not produced before this node")
            self.values[onnx_name] = self.b.weight(self.value_name(onnx_name),
                                                   self.constants[onnx_name])
        return self.values[onnx_name]

    def tensor(self, t: Any) -> np.ndarray:
        return self.onnx.numpy_helper.to_array(t)


def _attributes(onnx: Any, node: Any) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        out[a.name] = tuple(value) if isinstance(value, list) else value
    return out


# ---- converters: one per operator family, each (node) -> the output value ----------------------


def _matmul(n: _Node) -> Value:
    return n.ctx.b.matmul(*n.inputs(2, 2), name=n.name())


def _gemm(n: _Node) -> Value:
    return n.ctx.b.gemm(*n.inputs(2, 3), alpha=n.attr("alpha", 1.0), beta=n.attr("beta", 1.0),
                        trans_a=n.attr("transA", 0, (0, 1)), trans_b=n.attr("transB", 0, (0, 1)),
                        name=n.name())


def _conv(n: _Node) -> Value:
    inputs = n.inputs(2, 3)
    x, w = inputs[0].shape, inputs[1].shape
    if len(x) != 4 or len(w) != 4:
        raise n.fail(f"only 2-D convolutions are supported (input {x}, weights {w})")
    n.attr("group", 1, (1,))
    dilations = n.attr("dilations", (1, 1))
    if any(d != 1 for d in dilations):
        raise n.fail(f"dilations={list(dilations)} is not supported")
    kernel = n.attr("kernel_shape", w[2:])
    if tuple(kernel) != w[2:]:
        raise n.fail(f"kernel_shape={list(kernel)} differs from the weights' {list(w[2:])}")
    strides = n.attr("strides", (1, 1))
    auto_pad = _show(n.attr("auto_pad", b"NOTSET",
                            (b"NOTSET", b"VALID", b"SAME_UPPER", b"SAME_LOWER")))
    pads = n.attr("pads", (0, 0, 0, 0))
    if auto_pad == "VALID":
        pads = (0, 0, 0, 0)
    elif auto_pad.startswith("SAME"):
        pads = _same_pads(x[2:], w[2:], strides, upper=auto_pad == "SAME_UPPER")
    return n.ctx.b.conv(*inputs, pads=pads, strides=strides, name=n.name())


def _same_pads(size: Sequence[int], kernel: Sequence[int], strides: Sequence[int], upper: bool
               ) -> tuple[int, ...]:
    """ONNX's SAME padding: output = ceil(input / stride), the odd pixel at the end (upper) or
    at the start."""
    begin, end = [], []
    for n, k, s in zip(size, kernel, strides):
        total = max((-(-n // s) - 1) * s + k - n, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if upper else big)
        end.append(big if upper else small)
    return (*begin, *end)


def _binary(n: _Node) -> Value:
    add_sub_mul_div = getattr(n.ctx.b, n.op_type.lower())
    return add_sub_mul_div(*n.inputs(2, 2), name=n.name())


def _unary(n: _Node) -> Value:
    return n.ctx.b.unary(n.op_type, *n.inputs(1, 1), name=n.name())


def _gelu(n: _Node) -> Value:
    approximate = _show(n.attr("approximate", b"none", (b"none", b"tanh")))
    return n.ctx.b.gelu(*n.inputs(1, 1), approximate=approximate, name=n.name())


def _softmax(n: _Node) -> Value:
    (x,) = n.inputs(1, 1)
    rank = len(x.shape)
    axis = n.attr("axis", -1 if n.ctx.opset >= 13 else 1)
    if n.ctx.opset < 13 and axis % max(rank, 1) != rank - 1:
        raise n.fail(f"axis={axis} is not supported before opset 13 (it flattens the "
                     f"dimensions from the axis on); only the last axis is")
    return n.ctx.b.softmax(x, axis=axis, name=n.name())


def _reduce(n: _Node) -> Value:
    (x,) = n.inputs(1, 2, data=1)
    axes = n.attr("axes", None)
    given = n.constant(1)
    if given is not None:
        axes = tuple(int(a) for a in given.reshape(-1))
    if n.attr("noop_with_empty_axes", 0, (0, 1)) and not axes:
        raise n.fail("noop_with_empty_axes=1 without axes is not supported")
    keepdims = n.attr("keepdims", 1, (0, 1))
    return n.ctx.b.reduce(n.op_type, x, axes or (), keepdims=bool(keepdims), name=n.name())


def _layer_norm(n: _Node) -> Value:
    n.attr("stash_type", 1, (1,))
    return n.ctx.b.layer_norm(*n.inputs(2, 3), axis=n.attr("axis", -1),
                              epsilon=n.attr("epsilon", 1e-5), name=n.name())


def _batch_norm(n: _Node) -> Value:
    n.attr("training_mode", 0, (0,))
    n.attr("spatial", 1, (1,))
    n.attr("momentum", 0.9)  # only training updates the statistics
    x, *params = n.inputs(5, 5)
    for index in range(1, 5):
        n.constant(index)  # scale, bias, mean and variance are folded now: they must be constants
    return n.ctx.b.batch_norm(x, *params, epsilon=n.attr("epsilon", 1e-5), name=n.name())


def _transpose(n: _Node) -> Value:
    return n.ctx.b.transpose(*n.inputs(1, 1), perm=n.attr("perm", ()), name=n.name())


def _reshape(n: _Node) -> Value:
    (x,) = n.inputs(2, 2, data=1)
    shape = [int(d) for d in n.constant(1).reshape(-1)]  # type: ignore[union-attr]
    if n.attr("allowzero", 0, (0, 1)) and 0 in shape:
        raise n.fail("allowzero=1 with a 0 in the shape is not supported")
    shape = [x.shape[d] if s == 0 else s for d, s in enumerate(shape)]
    return n.ctx.b.reshape(x, shape, name=n.name())


def _flatten(n: _Node) -> Value:
    return n.ctx.b.flatten(*n.inputs(1, 1), axis=n.attr("axis", 1), name=n.name())


def _constant(n: _Node) -> None:
    """Constant nodes hold values, not computations: their output is a constant to read."""
    kinds = ("value", "value_float", "value_floats", "value_int", "value_ints")
    given = [k for k in kinds if k in n.attrs]
    if len(given) != 1 or set(n.attrs) - set(kinds):
        raise n.fail(f"attributes {sorted(n.attrs)} are not supported (one of {list(kinds)})")
    value = n.attrs.pop(given[0])
    array = n.ctx.tensor(value) if given[0] == "value" else np.array(value)
    n.ctx.constants[n.proto.output[0]] = array


_CONVERTERS: dict[str, Callable[[_Node], Value | None]] = {
    "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv,
    **{t: _binary for t in ("Add", "Sub", "Mul", "Div")},
    **{t: _unary for t in ("Relu", "Tanh", "Exp", "Erf", "Sqrt", "Sigmoid")},
    "Gelu": _gelu, "Softmax": _softmax,
    **{t: _reduce for t in ("ReduceSum", "ReduceMean", "ReduceMax")},
    "LayerNormalization": _layer_norm, "BatchNormalization": _batch_norm,
    "Transpose": _transpose, "Reshape": _reshape, "Flatten": _flatten, "Constant": _constant,
}


def import_onnx(source: str | Path | Any, name: str | None = None) -> Model:
    """The model of an ONNX file (a path) or an `onnx.ModelProto`, named `name` (by default
    after the file, or the graph). Messages start with the file's name (or the graph's)."""
    onnx = _onnx()
    if isinstance(source, (str, Path)):
        label = Path(source).name
        try:
            proto = onnx.load(str(source))
        except Exception as e:  # a missing file, or protobuf's errors for one that is not ONNX
            first = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelError(f"{label}: cannot read an ONNX model: {first}") from None
        name = name or Path(source).stem
    else:
        proto, label = source, f"ONNX graph {source.graph.name!r}"
        name = name or source.graph.name or "model"
    graph = proto.graph
    ctx = _Importer(onnx, proto, label, name)
    for t in graph.initializer:
        ctx.constants[t.name] = ctx.tensor(t)
    for inp in graph.input:
        if inp.name not in ctx.constants:
            ctx.values[inp.name] = ctx.b.input(ctx.value_name(inp.name), _static_shape(ctx, inp))
    consumed = {i for node in graph.node for i in node.input} | {o.name for o in graph.output}
    for proto_node in graph.node:
        node = _Node(ctx, proto_node, _attributes(onnx, proto_node))
        if proto_node.domain not in ("", "ai.onnx") or proto_node.op_type not in _CONVERTERS:
            domain = f" of domain {proto_node.domain!r}" if proto_node.domain else ""
            raise node.fail(f"operator {proto_node.op_type}{domain} is not supported")
        extra = [o for o in proto_node.output[1:] if o and o in consumed]
        if extra:
            raise node.fail(f"output {extra[0]!r} is not supported (only the first output)")
        try:
            value = _CONVERTERS[proto_node.op_type](node)
        except ModelError as e:
            if str(e).startswith(f"{label}: "):
                raise
            # The builder's and the operators' messages, placed at the node.
            problem = str(e).removeprefix(f"{ctx.b.name}: ")
            raise node.fail(problem.removeprefix(f"{proto_node.op_type}: ")) from None
        if node.attrs:
            raise node.fail(f"attribute {sorted(node.attrs)[0]!r} is not supported")
        if value is not None:
            ctx.values[proto_node.output[0]] = value
    outputs = []
    for out in graph.output:
        if out.name not in ctx.values or out.name in ctx.constants:
            raise ModelError(f"{label}: output {out.name!r} is not computed by a node")
        outputs.append(ctx.values[out.name])
    renamed = {ctx.value_name(v.name): v.name for v in (*graph.input, *graph.output)
               if v.name not in ctx.constants and ctx.value_name(v.name) != v.name}
    return replace(ctx.b.build(*outputs), source_names=MappingProxyType(renamed))


def _static_shape(ctx: _Importer, inp: Any) -> tuple[int, ...]:
    tensor_type = inp.type.tensor_type
    if tensor_type.elem_type not in _FLOAT_TYPES:
        raise ModelError(f"{ctx.source}: input {inp.name!r} has element type "
                         f"{ctx.onnx.TensorProto.DataType.Name(tensor_type.elem_type)}; "
                         f"only floating-point inputs are supported")
    if not tensor_type.HasField("shape"):
        raise ModelError(f"{ctx.source}: input {inp.name!r} has no shape; "
                         f"eqsched needs static shapes")
    shape = []
    for d, dim in enumerate(tensor_type.shape.dim):
        if not dim.HasField("dim_value") or dim.dim_value < 1:
            what = (f"a symbolic dimension {dim.dim_param!r}" if dim.dim_param
                    else "an unknown dimension")
            raise ModelError(f"{ctx.source}: input {inp.name!r} has {what} (dimension {d}); "
                             f"eqsched needs static shapes")
        shape.append(dim.dim_value)
    return tuple(shape)


__all__ = ["import_onnx"]
