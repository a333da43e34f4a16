"""The operator interface of a model graph: one operator produces one tensor, and knows its shape,
its numpy evaluation and its te stages.

    class Relu(Operator):
        op_type = "Relu"
        def infer(self, shapes): return shapes[0]
        def evaluate(self, x): return np.maximum(x, 0)
        def stages(self, operands, shape, name):
            return stage(shape, lambda idx: relu(operands[0][idx]), name)

`infer` checks the input shapes (ModelError naming the problem) and returns the output shape;
`evaluate` is the numpy reference of the end-to-end check, in float32; `stages` writes the te
stages computing the output from te reads of the operands, so any set of nodes becomes one
`te.Computation` to tune. The last stage an operator writes carries the node's name; the others
are named `<node>__<part>` (value names never hold a double underscore). That last stage may
store the value in another row-major shape of the same elements, one its loops index better:
readers in the same computation read it through the row-major map, other tasks the flat
buffer. A layout operator (`layout = True`) only moves elements: its stage is one read of its
input at `index_map(out index)`; when that index is affine, a computation has its readers read
the input there instead (a `View`), with no stage.

See docs/ARCHITECTURE.md §18 Models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from ..expr import Const, Expr, Var
from ..te import Reduce, ReduceAxis, Tensor, compute, reduce_axis

Shape = tuple[int, ...]


class ModelError(ValueError):
    """A model is malformed or uses what eqsched does not support (one line, naming it)."""


@dataclass(frozen=True)
class Operand:
    """An operator's input inside a te computation: a tensor of the model's shape (a 0-d value is
    a one-element tensor), or a one-element weight folded into its value."""

    shape: Shape
    tensor: Tensor | None = None
    value: float | None = None

    def __getitem__(self, index: Sequence[Expr]) -> Expr:
        """The element at `index` (one expression per dimension of `shape`)."""
        if self.value is not None:
            return Const(float(self.value))
        assert self.tensor is not None
        index = tuple(index)
        return self.tensor[index if index else (0,)]

    def at(self, out_index: Sequence[Expr], out_shape: Shape) -> Expr:
        """The element numpy broadcasting pairs with `out_index` of a result of `out_shape`
        (broadcast dimensions read index 0; the others read the result's own axis, so the
        read joins the result's loop)."""
        return self[broadcast_index(out_index, out_shape, self.shape)]


@dataclass(frozen=True)
class View(Operand):
    """A layout operator's result with no stage of its own: a read of it is a read of `source`
    at the operator's `index_map`."""

    source: Operand | None = None
    op: Operator | None = None

    def __getitem__(self, index: Sequence[Expr]) -> Expr:
        assert self.source is not None and self.op is not None
        return self.source[self.op.index_map(self.source.shape, tuple(index))]


class Operator:
    """One operator family; an instance's fields are its attributes (frozen dataclasses)."""

    op_type: ClassVar[str]
    arity: ClassVar[tuple[int, int]] = (1, 1)  # the least and the most inputs
    layout: ClassVar[bool] = False

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        raise NotImplementedError

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        raise NotImplementedError

    def index_map(self, in_shape: Shape, out_index: Sequence[Expr]) -> tuple[Expr, ...]:
        """A layout operator's input index for an output index."""
        raise NotImplementedError(f"{self.op_type} is not a layout operator")

    def affine_view(self, in_shape: Shape, out_shape: Shape) -> bool:
        """Whether this is a layout operator whose input index is an affine function of the
        output index (no division left): then its readers can read its input directly."""
        return False

    def describe(self) -> str:
        """The operator and its attributes, as error messages and model listings print it."""
        attrs = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                          if f.name != "kind")
        return f"{self.op_type}[{attrs}]" if attrs else self.op_type


def stage(shape: Shape, body: Callable[[tuple[Var, ...]], Expr | Reduce], name: str) -> Tensor:
    """`te.compute` over axes `i0, i1, ...` of `shape`; a 0-d result is a one-element stage."""
    if not shape:
        return compute((1,), lambda i0: body(()), name)
    return compute(shape, lambda *idx: body(idx), name,
                   axis_names=[f"i{d}" for d in range(len(shape))])


def reduce_axes(extents: Sequence[int]) -> tuple[ReduceAxis, ...]:
    """Reduce axes `r0, r1, ...` (named apart from a stage's spatial `i0, i1, ...`)."""
    return tuple(reduce_axis(n, f"r{d}") for d, n in enumerate(extents))


def broadcast_index(out_index: Sequence[Expr], out_shape: Shape, shape: Shape
                    ) -> tuple[Expr, ...]:
    """The index into `shape` that numpy broadcasting pairs with `out_index` of `out_shape`."""
    lead = len(out_shape) - len(shape)
    return tuple(out_index[lead + d] if n == out_shape[lead + d] else Const(0, "int")
                 for d, n in enumerate(shape))


def broadcast_shapes(op_type: str, *shapes: Shape) -> Shape:
    try:
        return tuple(int(n) for n in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ModelError(f"{op_type}: shapes {', '.join(map(str, shapes))} do not broadcast"
                         ) from None


def normalize_axis(op_type: str, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ModelError(f"{op_type}: axis {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def f32(array: np.ndarray | float) -> np.ndarray:
    """`array` as a C-contiguous float32 array of the same shape (0-d stays 0-d, which
    np.ascontiguousarray would make 1-d)."""
    out = np.asarray(array, dtype=np.float32)
    return out if out.flags.c_contiguous else out.copy()


__all__ = ["ModelError", "Operand", "Operator", "Shape", "View", "broadcast_index",
           "broadcast_shapes", "f32",
           "normalize_axis", "reduce_axes", "stage"]
