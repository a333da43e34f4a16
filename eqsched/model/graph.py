"""A model: a graph of operators over named inputs and constant weights, in topological order.

    model = ...                               # a ModelBuilder's build() or import_onnx(path)
    model.evaluate({"x": image})["y"]         # numpy, float32: the end-to-end reference
    model.computation(["matmul_0", "add_1"])  # those nodes as one te.Computation to tune

Every value (input, weight, node output) has a unique name, a Python identifier without a double
underscore (an operator's inner stages are `<node>__<part>`), and a static shape.

See docs/ARCHITECTURE.md §18 Models.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..te import Computation, Tensor, placeholder
from .layout import Reshape
from .op import ModelError, Operand, Operator, Shape, View, f32


@dataclass(frozen=True)
class Value:
    """A handle on a tensor of the model being built: an input, a weight or a node's output."""

    name: str
    shape: Shape


@dataclass(frozen=True)
class Node:
    """One operator application; its output value has the node's name."""

    name: str
    op: Operator
    inputs: tuple[str, ...]
    shape: Shape

    def __str__(self) -> str:
        return f"{self.name}{list(self.shape)} = {self.op.describe()}({', '.join(self.inputs)})"


@dataclass(frozen=True, eq=False)  # weights are arrays: a model is equal only to itself
class Model:
    """Inputs (name -> shape), weights (name -> float32 array), nodes in topological order, and
    the names of the output values. Build it with `ModelBuilder`. `source_names` maps an input or
    output renamed on import to its name in the file (to feed the file to another runtime)."""

    name: str
    inputs: Mapping[str, Shape]
    weights: Mapping[str, np.ndarray]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    _shapes: Mapping[str, Shape] = field(repr=False, compare=False, default_factory=dict)
    source_names: Mapping[str, str] = field(default_factory=dict)

    def shape(self, value: str) -> Shape:
        return self._shapes[value]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ModelError(f"{self.name}: no node named {name!r}")

    def consumers(self, value: str) -> list[Node]:
        return [n for n in self.nodes if value in n.inputs]

    def checked_inputs(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`inputs` as float32 arrays, each of its input's shape; ModelError names an input
        that is missing, of another shape, or not the model's."""
        checked = {}
        for name, shape in self.inputs.items():
            if name not in inputs:
                raise ModelError(f"{self.name}: input {name!r} is missing")
            array = f32(inputs[name])
            if array.shape != shape:
                raise ModelError(f"{self.name}: input {name!r} has shape {array.shape}, "
                                 f"expected {shape}")
            checked[name] = array
        unknown = sorted(set(inputs) - set(self.inputs))
        if unknown:
            raise ModelError(f"{self.name}: unknown inputs {unknown} (inputs: "
                             f"{list(self.inputs)})")
        return checked

    def evaluate(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs for `inputs` (name -> array of the input's shape), computed with numpy
        in float32, node by node."""
        env: dict[str, np.ndarray] = {**self.weights, **self.checked_inputs(inputs)}
        for n in self.nodes:
            env[n.name] = n.op.evaluate(*(env[i] for i in n.inputs))
        return {o: env[o] for o in self.outputs}

    def computation(self, nodes: Iterable[str] | None = None, name: str | None = None,
                    fold_scalars: bool = True, fold_layout: bool = True) -> Computation:
        """The te computation of `nodes` (all by default), in the model's order: what they read
        from outside is a placeholder of the same name (a one-element weight is folded in as its
        value when `fold_scalars`); its outputs are the nodes read outside the set or outputs of
        the model. With `fold_layout`, a layout node whose readers are all in the set and whose
        index map is affine writes no stage: they read its input through the map."""
        names = {n.name for n in self.nodes}
        chosen = names if nodes is None else set(nodes)
        if chosen - names:
            raise ModelError(f"{self.name}: no nodes named {sorted(chosen - names)}")
        members = [n for n in self.nodes if n.name in chosen]
        if not members:
            raise ModelError(f"{self.name}: a computation needs at least one node")
        operands: dict[str, Operand] = {}

        def operand(value: str) -> Operand:
            if value not in operands:
                shape = self._shapes[value]
                weight = self.weights.get(value)
                if fold_scalars and weight is not None and weight.size == 1:
                    operands[value] = Operand(shape, value=float(weight.reshape(-1)[0]))
                else:
                    operands[value] = Operand(shape, placeholder(shape or (1,), value))
            return operands[value]

        inside = {n.name for n in members}
        exported = {n.name for n in members if n.name in self.outputs
                    or any(c.name not in inside for c in self.consumers(n.name))}
        made: dict[str, Tensor] = {}
        for n in members:
            args = [operand(i) for i in n.inputs]
            if (fold_layout and n.name not in exported
                    and n.op.affine_view(args[0].shape, n.shape)):
                operands[n.name] = View(n.shape, source=args[0], op=n.op)
                continue
            made[n.name] = n.op.stages(args, n.shape, n.name)
            operands[n.name] = _stored(n.shape, made[n.name])
        # A built model has no dead nodes: the set's last node at least is exported.
        outputs = [made[n.name] for n in members if n.name in exported]
        return Computation(name or self.name, outputs)

    def bind(self, comp: Computation, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The arrays of `comp`'s inputs: the weights, and `values` (model inputs or values
        computed by other nodes), as float32 in the placeholders' shapes (a 0-d value is a
        one-element buffer)."""
        out = {}
        for t in comp.inputs:
            array = values[t.name] if t.name in values else self.weights.get(t.name)
            if array is None:
                raise ModelError(f"{self.name}: no array for {t.name!r}, an input of "
                                 f"{comp.name}")
            out[t.name] = np.ascontiguousarray(array, dtype=np.float32).reshape(t.shape)
        return out

    def __str__(self) -> str:
        ins = ", ".join(f"{k}{list(v)}" for k, v in self.inputs.items())
        lines = [f"{self.name}({ins}) -> {', '.join(self.outputs)}"]
        lines += [f"  {k}{list(v.shape)}: weight" for k, v in self.weights.items()]
        lines += [f"  {n}" for n in self.nodes]
        return "\n".join(lines)


def _stored(shape: Shape, tensor: Tensor) -> Operand:
    """A node's value as its readers in the same computation read it: its stage's tensor, or,
    when the operator stores the value in another row-major shape of the same elements (a
    `(16, C, T)` value written as `(16, C, N, rows, columns)`, where the writer's loops index
    better), that tensor read through the row-major map. A task reading the value from another
    task reads the one flat buffer in the value's own shape."""
    if tensor.shape == (shape or (1,)):
        return Operand(shape, tensor)
    return View(shape, source=Operand(tensor.shape, tensor), op=Reshape(shape))


__all__ = ["Model", "Node", "Value"]
