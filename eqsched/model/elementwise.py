"""Elementwise operators: Add, Sub, Mul, Div with numpy broadcasting; Relu, Tanh, Exp, Erf, Sqrt,
Sigmoid and Gelu; ScaleShift, the per-channel form of an inference BatchNormalization.

See docs/ARCHITECTURE.md §18 Models.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..expr import Expr, erf, exp, relu, sqrt, tanh
from ..te import Tensor
from .op import ModelError, Operand, Operator, Shape, broadcast_shapes, f32, stage

_BINARY: dict[str, tuple[Callable, Callable[[Expr, Expr], Expr]]] = {
    "Add": (np.add, lambda a, b: a + b),
    "Sub": (np.subtract, lambda a, b: a - b),
    "Mul": (np.multiply, lambda a, b: a * b),
    "Div": (np.divide, lambda a, b: a / b),
}


@dataclass(frozen=True)
class Binary(Operator):
    """`a op b` with numpy broadcasting; `op_type` is Add, Sub, Mul or Div."""

    kind: str
    arity: ClassVar[tuple[int, int]] = (2, 2)

    def __post_init__(self) -> None:
        if self.kind not in _BINARY:
            raise ModelError(f"unknown binary operator {self.kind!r} (known: {', '.join(_BINARY)})")

    @property
    def op_type(self) -> str:  # type: ignore[override]
        return self.kind

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        return broadcast_shapes(self.kind, *shapes)

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return f32(_BINARY[self.kind][0](*arrays))

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        a, b = operands
        fn = _BINARY[self.kind][1]
        return stage(shape, lambda idx: fn(a.at(idx, shape), b.at(idx, shape)), name)


_erf64 = np.frompyfunc(math.erf, 1, 1)
_SQRT_HALF = math.sqrt(0.5)
_TANH_GELU = math.sqrt(2 / math.pi)


def _np_erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_erf64(x.astype(np.float64)), np.float64)


def _np_sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def _np_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + _np_erf(x * _SQRT_HALF))


def _np_gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(_TANH_GELU * (x + 0.044715 * x * x * x)))


def _gelu(x: Expr) -> Expr:
    return 0.5 * x * (1.0 + erf(x * _SQRT_HALF))


def _gelu_tanh(x: Expr) -> Expr:
    return 0.5 * x * (1.0 + tanh(_TANH_GELU * (x + 0.044715 * x * x * x)))


# op_type -> (numpy, te body); GeluTanh is ONNX's Gelu with approximate="tanh".
_UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], Callable[[Expr], Expr]]] = {
    "Relu": (lambda x: np.maximum(x, np.float32(0)), relu),
    "Tanh": (np.tanh, tanh),
    "Exp": (np.exp, exp),
    "Erf": (_np_erf, erf),
    "Sqrt": (np.sqrt, sqrt),
    "Sigmoid": (_np_sigmoid, lambda x: 1.0 / (1.0 + exp(-x))),
    "Gelu": (_np_gelu, _gelu),
    "GeluTanh": (_np_gelu_tanh, _gelu_tanh),
}


@dataclass(frozen=True)
class Unary(Operator):
    """`fn(x)` elementwise; `op_type` is one of Relu, Tanh, Exp, Erf, Sqrt, Sigmoid, Gelu (the
    exact, erf form) and GeluTanh (its tanh approximation)."""

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in _UNARY:
            raise ModelError(f"unknown elementwise operator {self.kind!r} "
                             f"(known: {', '.join(_UNARY)})")

    @property
    def op_type(self) -> str:  # type: ignore[override]
        return self.kind

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        return shapes[0]

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            return f32(_UNARY[self.kind][0](arrays[0]))

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        (x,) = operands
        fn = _UNARY[self.kind][1]
        return stage(shape, lambda idx: fn(x[idx]), name)


@dataclass(frozen=True)
class ScaleShift(Operator):
    """`x * scale[c] + shift[c]` along channel axis 1: BatchNormalization folded for inference
    (scale = gamma / sqrt(var + eps), shift = beta - mean * scale)."""

    op_type: ClassVar[str] = "ScaleShift"
    arity: ClassVar[tuple[int, int]] = (3, 3)

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        x, scale, shift = shapes
        if len(x) < 2 or scale != (x[1],) or shift != (x[1],):
            raise ModelError(f"ScaleShift: needs x of rank >= 2 and scale, shift of shape "
                             f"(channels,), got {x}, {scale}, {shift}")
        return x

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        x, scale, shift = arrays
        per_channel = (1, -1) + (1,) * (x.ndim - 2)
        return f32(x * scale.reshape(per_channel) + shift.reshape(per_channel))

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        x, scale, shift = operands
        return stage(shape, lambda idx: x[idx] * scale[idx[1:2]] + shift[idx[1:2]], name)


__all__ = ["Binary", "ScaleShift", "Unary"]
