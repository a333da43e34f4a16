"""Reductions: ReduceSum, ReduceMean, ReduceMax (axes, keepdims), Softmax along one axis, and
LayerNormalization over the trailing axes.

See docs/ARCHITECTURE.md §18 Models.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..expr import Expr, exp, sqrt
from ..te import Tensor, max_, sum_
from .op import ModelError, Operand, Operator, Shape, f32, normalize_axis, reduce_axes, stage

_REDUCERS = {"ReduceSum": (np.sum, sum_), "ReduceMean": (np.mean, sum_),
             "ReduceMax": (np.max, max_)}


def _spread(shape: Shape, axes: Sequence[int], kept: Sequence[Expr],
            reduced: Sequence[Expr]) -> tuple[Expr, ...]:
    """An index of `shape` from the indices of its kept dimensions and of its `axes`."""
    kept_it, reduced_it = iter(kept), iter(reduced)
    return tuple(next(reduced_it) if d in axes else next(kept_it) for d in range(len(shape)))


@dataclass(frozen=True)
class Reduce(Operator):
    """ReduceSum, ReduceMean or ReduceMax over `axes` (all when empty), keeping them as
    dimensions of 1 when `keepdims`."""

    kind: str
    axes: tuple[int, ...] = ()
    keepdims: bool = True

    def __post_init__(self) -> None:
        if self.kind not in _REDUCERS:
            raise ModelError(f"unknown reduction {self.kind!r} (known: {', '.join(_REDUCERS)})")

    @property
    def op_type(self) -> str:  # type: ignore[override]
        return self.kind

    def _axes(self, rank: int) -> tuple[int, ...]:
        axes = sorted({normalize_axis(self.kind, a, rank) for a in self.axes} or range(rank))
        if len(axes) != len(self.axes) and self.axes:
            raise ModelError(f"{self.kind}: axes {list(self.axes)} repeat an axis")
        return tuple(axes)

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        (x,) = shapes
        axes = self._axes(len(x))
        if self.keepdims:
            return tuple(1 if d in axes else n for d, n in enumerate(x))
        return tuple(n for d, n in enumerate(x) if d not in axes)

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        (x,) = arrays
        return f32(_REDUCERS[self.kind][0](x, axis=self._axes(x.ndim), keepdims=self.keepdims))

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        (x,) = operands
        axes = self._axes(len(x.shape))
        red = reduce_axes([x.shape[d] for d in axes])
        mean = self.kind == "ReduceMean"

        def body(idx):
            kept = [i for d, i in enumerate(idx) if d not in axes] if self.keepdims else idx
            return _REDUCERS[self.kind][1](x[_spread(x.shape, axes, kept, red)], axis=red)

        total = stage(shape, body, f"{name}__sum" if mean else name)
        if not mean:
            return total
        count = float(math.prod(x.shape[d] for d in axes))
        return stage(shape, lambda idx: Operand(shape, total)[idx] / count, name)


@dataclass(frozen=True)
class Softmax(Operator):
    """exp(x - max) / sum(exp(x - max)) along `axis`."""

    axis: int = -1
    op_type: ClassVar[str] = "Softmax"

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        normalize_axis("Softmax", self.axis, len(shapes[0]))
        return shapes[0]

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        (x,) = arrays
        e = np.exp(x - x.max(axis=self.axis, keepdims=True))
        return f32(e / e.sum(axis=self.axis, keepdims=True))

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        (x,) = operands
        axis = normalize_axis("Softmax", self.axis, len(shape))
        row = shape[:axis] + shape[axis + 1:]

        def whole(idx):  # the row index of a point
            return idx[:axis] + idx[axis + 1:]

        def over_row(idx, red):
            return _spread(shape, (axis,), idx, red)

        (r,) = reduce_axes([shape[axis]])
        top = Operand(row, stage(row, lambda idx: max_(x[over_row(idx, (r,))], axis=r),
                                 f"{name}__max"))
        e = Operand(shape, stage(shape, lambda idx: exp(x[idx] - top[whole(idx)]),
                                 f"{name}__exp"))
        (r2,) = reduce_axes([shape[axis]])
        total = Operand(row, stage(row, lambda idx: sum_(e[over_row(idx, (r2,))], axis=r2),
                                   f"{name}__sum"))
        return stage(shape, lambda idx: e[idx] / total[whole(idx)], name)


@dataclass(frozen=True)
class LayerNorm(Operator):
    """(x - mean) / sqrt(var + epsilon) * scale + bias over the axes from `axis` on (ONNX's
    LayerNormalization); scale and bias broadcast to those axes, bias optional."""

    axis: int = -1
    epsilon: float = 1e-5
    op_type: ClassVar[str] = "LayerNormalization"
    arity: ClassVar[tuple[int, int]] = (2, 3)

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        x = shapes[0]
        axis = normalize_axis("LayerNormalization", self.axis, len(x))
        for what, s in zip(("scale", "bias"), shapes[1:]):
            lead = len(x) - axis - len(s)
            if lead < 0 or any(n not in (1, m) for n, m in zip(s, x[axis + lead:])):
                raise ModelError(f"LayerNormalization: {what} of shape {s} does not broadcast "
                                 f"to the normalized shape {x[axis:]}")
        return x

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        x = arrays[0]
        axes = tuple(range(normalize_axis("LayerNormalization", self.axis, x.ndim), x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
        y = (x - mean) / np.sqrt(var + np.float32(self.epsilon)) * arrays[1]
        return f32(y + arrays[2] if len(arrays) == 3 else y)

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        x, scale = operands[0], operands[1]
        axis = normalize_axis("LayerNormalization", self.axis, len(shape))
        rows, inner = shape[:axis], shape[axis:]
        inv_n = 1.0 / math.prod(inner)
        red = reduce_axes(inner)
        mean = Operand(rows, stage(rows, lambda idx: sum_(x[(*idx, *red)] * inv_n, axis=red),
                                   f"{name}__mean"))
        red2 = reduce_axes(inner)

        def variance(idx):
            d = x[(*idx, *red2)] - mean[idx]
            return sum_(d * d * inv_n, axis=red2)

        var = Operand(rows, stage(rows, variance, f"{name}__var"))

        def normalized(idx):
            row = idx[:axis]
            y = (x[idx] - mean[row]) / sqrt(var[row] + self.epsilon) * scale.at(idx, shape)
            return y + operands[2].at(idx, shape) if len(operands) == 3 else y

        return stage(shape, normalized, name)


__all__ = ["LayerNorm", "Reduce", "Softmax"]
