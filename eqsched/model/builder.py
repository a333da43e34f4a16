"""Writing a model: `ModelBuilder`, one method per operator, each returning its output's `Value`.

    b = ModelBuilder("mlp")
    x = b.input("x", (1, 784))
    h = b.relu(b.add(b.matmul(x, b.weight("w0", w0)), b.weight("b0", b0)))
    model = b.build(b.add(b.matmul(h, b.weight("w1", w1)), b.weight("b1", b1), name="y"))

See docs/ARCHITECTURE.md §18 Models.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

import numpy as np

from .elementwise import Binary, ScaleShift, Unary
from .graph import Model, Node, Value
from .layout import Reshape, Transpose
from .linear import Conv, Gemm, MatMul
from .op import ModelError, Operator, Shape
from .reduce import LayerNorm, Reduce, Softmax


class ModelBuilder:
    """Builds a `Model` node by node; each operator method returns the `Value` of its output.
    `name=` names a node (default: the operator's name and a counter)."""

    def __init__(self, name: str):
        self.name = name
        self._inputs: dict[str, Shape] = {}
        self._weights: dict[str, np.ndarray] = {}
        self._nodes: list[Node] = []
        self._shapes: dict[str, Shape] = {}

    # ---- values -------------------------------------------------------------------------------

    def __contains__(self, name: str) -> bool:
        """Whether a value of the model being built has this name."""
        return name in self._shapes

    def input(self, name: str, shape: Sequence[int]) -> Value:
        shape = tuple(shape)
        if any(not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1
               for n in shape):
            raise ModelError(f"{self.name}: input {name!r} needs a static shape of positive "
                             f"integers, got {shape}")
        self._declare(name, tuple(int(n) for n in shape))
        self._inputs[name] = self._shapes[name]
        return Value(name, self._shapes[name])

    def weight(self, name: str, array: np.ndarray | float) -> Value:
        """A constant tensor (a trained parameter, an ONNX initializer or Constant)."""
        data = np.array(array, dtype=np.float32)
        if data.size == 0:
            raise ModelError(f"{self.name}: weight {name!r} is empty")
        data.setflags(write=False)
        self._declare(name, data.shape)
        self._weights[name] = data
        return Value(name, data.shape)

    def apply(self, op: Operator, inputs: Sequence[Value], name: str | None = None) -> Value:
        """The node `name = op(*inputs)`."""
        least, most = op.arity
        if not least <= len(inputs) <= most:
            count = least if least == most else f"{least} to {most}"
            raise ModelError(f"{self.name}: {op.op_type} takes {count} inputs, got {len(inputs)}")
        for v in inputs:
            if self._shapes.get(v.name) != v.shape:
                raise ModelError(f"{self.name}: {op.op_type} reads {v.name!r}, "
                                 f"which is not a value of this model")
        if name is None:
            name = self._fresh(f"{op.op_type.lower()}_{len(self._nodes)}")
        shape = op.infer([v.shape for v in inputs])
        self._declare(name, shape)
        self._nodes.append(Node(name, op, tuple(v.name for v in inputs), shape))
        return Value(name, shape)

    # ---- operators ----------------------------------------------------------------------------

    def matmul(self, a: Value, b: Value, name: str | None = None) -> Value:
        return self.apply(MatMul(), [a, b], name)

    def gemm(self, a: Value, b: Value, c: Value | None = None, alpha: float = 1.0,
             beta: float = 1.0, trans_a: bool = False, trans_b: bool = False,
             name: str | None = None) -> Value:
        return self.apply(Gemm(float(alpha), float(beta), bool(trans_a), bool(trans_b)),
                          [a, b] if c is None else [a, b, c], name)

    def conv(self, x: Value, w: Value, bias: Value | None = None,
             pads: Sequence[int] = (0, 0, 0, 0), strides: Sequence[int] = (1, 1),
             name: str | None = None) -> Value:
        """2-D convolution (NCHW); `pads` are (top, left, bottom, right)."""
        op = Conv(tuple(int(p) for p in pads), tuple(int(s) for s in strides))
        return self.apply(op, [x, w] if bias is None else [x, w, bias], name)

    def add(self, a: Value, b: Value, name: str | None = None) -> Value:
        return self.apply(Binary("Add"), [a, b], name)

    def sub(self, a: Value, b: Value, name: str | None = None) -> Value:
        return self.apply(Binary("Sub"), [a, b], name)

    def mul(self, a: Value, b: Value, name: str | None = None) -> Value:
        return self.apply(Binary("Mul"), [a, b], name)

    def div(self, a: Value, b: Value, name: str | None = None) -> Value:
        return self.apply(Binary("Div"), [a, b], name)

    def unary(self, kind: str, x: Value, name: str | None = None) -> Value:
        """Relu, Tanh, Exp, Erf, Sqrt, Sigmoid, Gelu or GeluTanh of `x`."""
        return self.apply(Unary(kind), [x], name)

    def relu(self, x: Value, name: str | None = None) -> Value:
        return self.unary("Relu", x, name)

    def gelu(self, x: Value, approximate: str = "none", name: str | None = None) -> Value:
        """GELU: x * Phi(x) with erf (`approximate="none"`) or its tanh approximation."""
        if approximate not in ("none", "tanh"):
            raise ModelError(f"{self.name}: gelu approximate must be 'none' or 'tanh', "
                             f"got {approximate!r}")
        return self.unary("Gelu" if approximate == "none" else "GeluTanh", x, name)

    def softmax(self, x: Value, axis: int = -1, name: str | None = None) -> Value:
        return self.apply(Softmax(int(axis)), [x], name)

    def reduce(self, kind: str, x: Value, axes: Sequence[int] = (), keepdims: bool = True,
               name: str | None = None) -> Value:
        """ReduceSum, ReduceMean or ReduceMax over `axes` (all when empty)."""
        return self.apply(Reduce(kind, tuple(int(a) for a in axes), bool(keepdims)), [x], name)

    def layer_norm(self, x: Value, scale: Value, bias: Value | None = None, axis: int = -1,
                   epsilon: float = 1e-5, name: str | None = None) -> Value:
        return self.apply(LayerNorm(int(axis), float(epsilon)),
                          [x, scale] if bias is None else [x, scale, bias], name)

    def transpose(self, x: Value, perm: Sequence[int] = (), name: str | None = None) -> Value:
        return self.apply(Transpose(tuple(int(p) for p in perm)), [x], name)

    def reshape(self, x: Value, shape: Sequence[int], name: str | None = None) -> Value:
        """numpy's reshape: one dimension may be -1 (inferred)."""
        return self.apply(Reshape(_resolve_shape(self.name, x.shape, shape)), [x], name)

    def flatten(self, x: Value, axis: int = 1, name: str | None = None) -> Value:
        """A matrix of the dimensions before `axis` by those from it on (ONNX's Flatten)."""
        rank = len(x.shape)
        if not -rank <= axis <= rank:
            raise ModelError(f"{self.name}: flatten axis {axis} is out of range for rank {rank}")
        axis = axis + rank if axis < 0 else axis
        return self.reshape(x, (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))),
                            name)

    def batch_norm(self, x: Value, scale: Value, bias: Value, mean: Value, var: Value,
                   epsilon: float = 1e-5, name: str | None = None) -> Value:
        """BatchNormalization in inference form, folded now into one per-channel scale and
        shift (new weights `<name>_scale`, `<name>_shift`); its four parameters must be weights."""
        params = [scale, bias, mean, var]
        missing = [p.name for p in params if p.name not in self._weights]
        if missing:
            raise ModelError(f"{self.name}: batch_norm needs weights as parameters, "
                             f"{missing} are not")
        gamma, beta, mu, sigma2 = (self._weights[p.name] for p in params)
        if name is None:
            name = self._fresh(f"batchnorm_{len(self._nodes)}")
        factor = gamma / np.sqrt(sigma2 + np.float32(epsilon))
        folded_scale = self.weight(self._fresh(f"{name}_scale"), factor)
        folded_shift = self.weight(self._fresh(f"{name}_shift"), beta - mu * factor)
        return self.apply(ScaleShift(), [x, folded_scale, folded_shift], name)

    def build(self, *outputs: Value) -> Model:
        if not outputs:
            raise ModelError(f"{self.name}: a model needs at least one output")
        for v in outputs:
            if v.name not in self._shapes:
                raise ModelError(f"{self.name}: output {v.name!r} is not a value of this model")
        needed = _needed(self._nodes, {v.name for v in outputs}) | set(self._inputs)
        return Model(self.name, MappingProxyType(dict(self._inputs)),
                     MappingProxyType({k: w for k, w in self._weights.items() if k in needed}),
                     tuple(n for n in self._nodes if n.name in needed),
                     tuple(v.name for v in outputs),
                     MappingProxyType({k: s for k, s in self._shapes.items() if k in needed}))

    def _fresh(self, base: str) -> str:
        """`base`, or `base_2`, `base_3`... when the name is taken."""
        name, k = base, 1
        while name in self._shapes:
            k += 1
            name = f"{base}_{k}"
        return name

    def _declare(self, name: str, shape: Shape) -> None:
        if not isinstance(name, str) or not name.isidentifier() or "__" in name:
            raise ModelError(f"{self.name}: value name {name!r} must be an identifier without "
                             f"'__'")
        if name in self._shapes:
            raise ModelError(f"{self.name}: two values are named {name!r}")
        self._shapes[name] = shape


def _resolve_shape(model: str, old: Shape, shape: Sequence[int]) -> Shape:
    new = [int(n) for n in shape]
    if new.count(-1) > 1 or any(n < -1 or n == 0 for n in new):
        raise ModelError(f"{model}: reshape to {tuple(new)}: dimensions must be positive, "
                         f"one may be -1")
    if -1 in new:
        known = int(np.prod([n for n in new if n != -1]))
        if int(np.prod(old)) % known:
            raise ModelError(f"{model}: cannot reshape {old} to {tuple(new)}")
        new[new.index(-1)] = int(np.prod(old)) // known
    return tuple(new)


def _needed(nodes: Sequence[Node], outputs: set[str]) -> set[str]:
    """The values the outputs depend on (nodes no output reads are left out of the model)."""
    needed = set(outputs)
    for n in reversed(nodes):
        if n.name in needed:
            needed.update(n.inputs)
    return needed


__all__ = ["ModelBuilder"]
