"""Layout operators: Transpose and Reshape (Flatten is a Reshape), and Inside, through which a
task reads a value stored padded. Each only moves elements: its
stage reads its input at `index_map(out index)`, a re-indexing a consumer can take over (a
Reshape re-indexes a contiguous buffer: the flat offset is kept).

See docs/ARCHITECTURE.md §18 Models.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..affine import AffineError, to_affine
from ..expr import Const, Expr, Var
from ..te import Tensor
from .op import ModelError, Operand, Operator, Shape, f32, stage


class _Layout(Operator):
    layout: ClassVar[bool] = True

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        (x,) = operands
        return stage(shape, lambda idx: x[self.index_map(x.shape, idx)], name)

    def affine_view(self, in_shape: Shape, out_shape: Shape) -> bool:
        index = tuple(Var(f"i{d}") for d in range(len(out_shape)))
        ranges = {v.name: (0, n - 1) for v, n in zip(index, out_shape)}
        try:
            for e in self.index_map(in_shape, index):
                to_affine(e, ranges)
        except AffineError:
            return False
        return True


@dataclass(frozen=True)
class Transpose(_Layout):
    """Dimension d of the result is dimension perm[d] of the input (reversed when empty)."""

    perm: tuple[int, ...] = ()
    op_type: ClassVar[str] = "Transpose"

    def _perm(self, rank: int) -> tuple[int, ...]:
        perm = self.perm or tuple(reversed(range(rank)))
        if sorted(perm) != list(range(rank)):
            raise ModelError(f"Transpose: perm {list(perm)} is not a permutation of "
                             f"{rank} dimensions")
        return perm

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        return tuple(shapes[0][p] for p in self._perm(len(shapes[0])))

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        return f32(np.transpose(arrays[0], self._perm(arrays[0].ndim)))

    def index_map(self, in_shape: Shape, out_index: Sequence[Expr]) -> tuple[Expr, ...]:
        perm = self._perm(len(in_shape))
        return tuple(out_index[perm.index(d)] for d in range(len(in_shape)))


@dataclass(frozen=True)
class Reshape(_Layout):
    """The same elements in row-major order under a new static shape."""

    shape: tuple[int, ...]
    op_type: ClassVar[str] = "Reshape"

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        if any(n < 1 for n in self.shape) or math.prod(self.shape) != math.prod(shapes[0]):
            raise ModelError(f"Reshape: cannot reshape {shapes[0]} to {self.shape}")
        return self.shape

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        return f32(arrays[0].reshape(self.shape))

    def index_map(self, in_shape: Shape, out_index: Sequence[Expr]) -> tuple[Expr, ...]:
        # Leading and trailing dimensions the two shapes share keep their index; the middle
        # goes through its row-major offset.
        out_shape, in_shape = self.shape, tuple(in_shape)
        lead = 0
        while lead < min(len(in_shape), len(out_shape)) and in_shape[lead] == out_shape[lead]:
            lead += 1
        trail = 0
        while (trail < min(len(in_shape), len(out_shape)) - lead
               and in_shape[-1 - trail] == out_shape[-1 - trail]):
            trail += 1
        out_mid = slice(lead, len(out_shape) - trail)
        in_mid = in_shape[lead:len(in_shape) - trail]
        middle = _unflatten(_flatten(out_index[out_mid], out_shape[out_mid]), in_mid)
        kept_tail = tuple(out_index[len(out_index) - trail:]) if trail else ()
        return tuple(out_index[:lead]) + middle + kept_tail


@dataclass(frozen=True)
class Inside(_Layout):
    """The input without its border: `border` gives, per dimension, the elements (before,
    after) to leave out. No file has it; tasks read a value stored padded through it
    (`model.tasks.bordered_values`)."""

    border: tuple[tuple[int, int], ...]
    op_type: ClassVar[str] = "Inside"

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        if len(self.border) != len(shapes[0]) or any(
                n - a - b < 1 for n, (a, b) in zip(shapes[0], self.border)):
            raise ModelError(f"Inside: border {self.border} does not fit in {shapes[0]}")
        return tuple(n - a - b for n, (a, b) in zip(shapes[0], self.border))

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        (x,) = arrays
        return f32(x[tuple(slice(a, n - b) for n, (a, b) in zip(x.shape, self.border))])

    def index_map(self, in_shape: Shape, out_index: Sequence[Expr]) -> tuple[Expr, ...]:
        return tuple(i + a if a else i for i, (a, _) in zip(out_index, self.border))


_ZERO = Const(0, "int")


def _flatten(index: Sequence[Expr], shape: Shape) -> Expr | None:
    """The row-major offset of `index` in `shape` (None: always 0)."""
    flat: Expr | None = None
    for i, n, stride in zip(index, shape, _strides(shape)):
        if n > 1:
            term = i * stride if stride > 1 else i
            flat = term if flat is None else flat + term
    return flat


def _unflatten(flat: Expr | None, shape: Shape) -> tuple[Expr, ...]:
    """The index in `shape` of row-major offset `flat`."""
    out = []
    for d, (n, stride) in enumerate(zip(shape, _strides(shape))):
        if n == 1 or flat is None:
            out.append(_ZERO)
            continue
        e = flat // stride if stride > 1 else flat
        # In the outermost dimension that is not 1 the quotient is already less than n.
        out.append(e % n if math.prod(shape[:d]) > 1 else e)
    return tuple(out)


def _strides(shape: Shape) -> tuple[int, ...]:
    return tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))


__all__ = ["Inside", "Reshape", "Transpose"]
