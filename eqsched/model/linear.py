"""Contractions: MatMul (numpy's, batched with broadcasting), Gemm (alpha, beta, transA, transB)
and Conv (2-D, NCHW, pads and strides; dilation 1 and one group).

See docs/ARCHITECTURE.md §18 Models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..expr import Const, all_of, select
from ..te import Tensor, compute, sum_
from .op import (
    ModelError,
    Operand,
    Operator,
    Shape,
    broadcast_index,
    broadcast_shapes,
    f32,
    reduce_axes,
    stage,
)

_ZERO = Const(0, "int")


@dataclass(frozen=True)
class MatMul(Operator):
    """numpy's matmul: (..., M, K) @ (..., K, N) with the batch dimensions broadcast; a 1-D
    operand is a row (left) or a column (right) whose dimension the result drops."""

    op_type: ClassVar[str] = "MatMul"
    arity: ClassVar[tuple[int, int]] = (2, 2)

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        a, b = shapes
        if not a or not b:
            raise ModelError(f"MatMul: operands must have rank >= 1, got {a} and {b}")
        a2, b2 = (1,) + a if len(a) == 1 else a, b + (1,) if len(b) == 1 else b
        if a2[-1] != b2[-2]:
            raise ModelError(f"MatMul: inner dimensions differ: {a} @ {b}")
        full = broadcast_shapes("MatMul", a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
        return self._kept(full, a, b)

    @staticmethod
    def _kept(full: Shape, a: Shape, b: Shape) -> Shape:
        """The result's shape without the row/column dimensions a 1-D operand adds."""
        drop = {len(full) - 2} if len(a) == 1 else set()
        drop |= {len(full) - 1} if len(b) == 1 else set()
        return tuple(n for d, n in enumerate(full) if d not in drop)

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        return f32(np.matmul(*arrays))

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        a, b = operands
        (k,) = reduce_axes([a.shape[-1]])
        rank = len(shape) + (len(a.shape) == 1) + (len(b.shape) == 1)
        batch_shape = shape[:rank - 2]  # a 1-D operand only drops matrix dimensions

        def body(idx):
            full = list(idx)  # the index of the result with both matrix dimensions
            if len(a.shape) == 1:
                full.insert(len(full) - (len(b.shape) != 1), _ZERO)
            if len(b.shape) == 1:
                full.append(_ZERO)
            batch, i, j = full[:rank - 2], full[-2], full[-1]
            a_idx = (k,) if len(a.shape) == 1 else (
                *broadcast_index(batch, batch_shape, a.shape[:-2]), i, k)
            b_idx = (k,) if len(b.shape) == 1 else (
                *broadcast_index(batch, batch_shape, b.shape[:-2]), k, j)
            return sum_(a[a_idx] * b[b_idx], axis=k)

        return stage(shape, body, name)


@dataclass(frozen=True)
class Gemm(Operator):
    """Y = alpha * A' @ B' + beta * C, A' = A or A.T (trans_a), B' likewise; C optional and
    broadcast to Y."""

    alpha: float = 1.0
    beta: float = 1.0
    trans_a: bool = False
    trans_b: bool = False
    op_type: ClassVar[str] = "Gemm"
    arity: ClassVar[tuple[int, int]] = (2, 3)

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        a, b = shapes[0], shapes[1]
        if len(a) != 2 or len(b) != 2:
            raise ModelError(f"Gemm: A and B must be matrices, got {a} and {b}")
        (m, k), (k2, n) = a[::-1] if self.trans_a else a, b[::-1] if self.trans_b else b
        if k != k2:
            raise ModelError(f"Gemm: inner dimensions differ: {a} and {b} "
                             f"(trans_a={self.trans_a}, trans_b={self.trans_b})")
        if len(shapes) == 3 and broadcast_shapes("Gemm", shapes[2], (m, n)) != (m, n):
            raise ModelError(f"Gemm: C of shape {shapes[2]} does not broadcast to {(m, n)}")
        return (m, n)

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        a, b = arrays[0], arrays[1]
        y = self.alpha * ((a.T if self.trans_a else a) @ (b.T if self.trans_b else b))
        return f32(y + self.beta * arrays[2] if len(arrays) == 3 else y)

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        a, b = operands[0], operands[1]
        (k,) = reduce_axes([a.shape[0] if self.trans_a else a.shape[1]])
        scaled = self.alpha != 1 or len(operands) == 3
        mm = stage(shape, lambda idx: sum_(a[(k, idx[0]) if self.trans_a else (idx[0], k)]
                                           * b[(idx[1], k) if self.trans_b else (k, idx[1])],
                                           axis=k), f"{name}__mm" if scaled else name)
        if not scaled:
            return mm
        product = Operand(shape, mm)

        def body(idx):
            y = product[idx] * self.alpha if self.alpha != 1 else product[idx]
            if len(operands) == 3:
                c = operands[2].at(idx, shape)
                y = y + (c * self.beta if self.beta != 1 else c)
            return y

        return stage(shape, body, name)


@dataclass(frozen=True)
class Conv(Operator):
    """2-D convolution, NCHW: X (N, C, H, W) * W (K, C, R, S) + B (K,) optional, zero padding
    `pads` (top, left, bottom, right), `strides` (rows, columns)."""

    pads: tuple[int, ...] = (0, 0, 0, 0)  # checked: 4 of them
    strides: tuple[int, ...] = (1, 1)
    op_type: ClassVar[str] = "Conv"
    arity: ClassVar[tuple[int, int]] = (2, 3)

    def __post_init__(self) -> None:
        if len(self.pads) != 4 or min(self.pads) < 0:
            raise ModelError(f"Conv: pads must be 4 non-negative integers, got {self.pads}")
        if len(self.strides) != 2 or min(self.strides) < 1:
            raise ModelError(f"Conv: strides must be 2 positive integers, got {self.strides}")

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        x, w = shapes[0], shapes[1]
        if len(x) != 4 or len(w) != 4:
            raise ModelError(f"Conv: only 2-D convolutions (NCHW input, KCRS weights), "
                             f"got {x} and {w}")
        if x[1] != w[1]:
            raise ModelError(f"Conv: input has {x[1]} channels, weights expect {w[1]}")
        if len(shapes) == 3 and shapes[2] != (w[0],):
            raise ModelError(f"Conv: bias of shape {shapes[2]}, expected {(w[0],)}")
        top, left, bottom, right = self.pads
        p = (x[2] + top + bottom - w[2]) // self.strides[0] + 1
        q = (x[3] + left + right - w[3]) // self.strides[1] + 1
        if p < 1 or q < 1:
            raise ModelError(f"Conv: a {w[2]}x{w[3]} window does not fit the padded input {x}")
        return (x[0], w[0], p, q)

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        x, w = arrays[0], arrays[1]
        top, left, bottom, right = self.pads
        xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
        windows = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))
        windows = windows[:, :, ::self.strides[0], ::self.strides[1]]
        y = np.einsum("ncpqrs,kcrs->nkpq", windows, w, optimize=True)
        return f32(y + arrays[2].reshape(1, -1, 1, 1) if len(arrays) == 3 else y)

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        x, w = operands[0], operands[1]
        n, c, h, wd = x.shape
        top, left, bottom, right = self.pads
        src = x
        if any(self.pads):
            padded = (n, c, h + top + bottom, wd + left + right)
            src = Operand(padded, compute(
                padded, lambda i0, i1, i2, i3: select(
                    all_of(i2 >= top, i2 < h + top, i3 >= left, i3 < wd + left),
                    x[(i0, i1, i2 - top, i3 - left)], 0.0),
                f"{name}__pad"))
        rc, ry, rx = reduce_axes(w.shape[1:])
        sh, sw = self.strides
        biased = len(operands) == 3

        def conv(idx):
            i0, i1, i2, i3 = idx
            row = i2 * sh + ry if sh > 1 else i2 + ry
            col = i3 * sw + rx if sw > 1 else i3 + rx
            return sum_(src[(i0, rc, row, col)] * w[(i1, rc, ry, rx)], axis=(rc, ry, rx))

        y = stage(shape, conv, f"{name}__conv" if biased else name)
        if not biased:
            return y
        bias, conv_out = operands[2], Operand(shape, y)
        return stage(shape, lambda idx: conv_out[idx] + bias[idx[1:2]], name)


__all__ = ["Conv", "Gemm", "MatMul"]
