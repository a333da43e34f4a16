"""Winograd convolution F(2x2, 3x3): a model's 3x3 stride-1 convolutions computed with fewer
multiplications, the algorithm choice TVM and Ansor offer beside the direct form.

    fast = winograd(get_model("resnet_block"))   # the same outputs, its convs WinogradConv nodes
    fast.evaluate(inputs)                        # numpy, still by the direct convolution

Each output tile of 2x2 points is computed from a 4x4 tile of the padded input d and the 3x3
filter g as Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A (Lavin and Gray, 2016). Summed over the input
channels, the elementwise product becomes 16 matrix products, one per point (e, n) of the 4x4
transformed tile: M[e, n] = U[e, n] @ V[e, n], K x C times C x tiles. That is 16 multiply-adds
per 4 outputs and input channel where the direct form does 36: a 56x56x64x64 convolution goes
from 231 to 103 MFLOP of products, plus the transforms. U = G g Gᵀ is made here, in float64,
once: a weight of the rewritten model. The transforms are sums and differences only (B and A
hold 0 and ±1), written out term by term so no stage multiplies by a constant matrix.

A `WinogradConv` node keeps the original filter as an input: its `evaluate` is the direct
convolution, so a compiled model's end-to-end check compares the Winograd kernels with the
direct form in numpy, not with a numpy Winograd. Its stages, a task like any other:

    {name}__split[n, c, y, parity, x']  the padded input, its columns split by parity (so each
                                        tile's stride-2 reads become unit-stride ones)
    {name}__in[e, n, c, b, ty, tx]      V = Bᵀ d B, four terms per point
    {name}__product[e, n, k, b, ty, tx] M = U @ V over the input channels
    {name}__out[b, k, i, j, ty, tx]     Aᵀ M A, the 2x2 outputs of each tile, nine terms each
    {name}[b, k, h, w]                  each output read from its tile (plus the bias)

F(2x2, 3x3)'s coefficients are 0, ±1 and ±½: its float32 error stays at the direct form's
level (larger tiles, F(4x4, 3x3), save more but lose accuracy; not offered).

See docs/ARCHITECTURE.md §18 Models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from ..expr import Const, Expr, all_of, select
from ..te import Tensor, compute, sum_
from .graph import Model, Node
from .linear import Conv
from .op import ModelError, Operand, Operator, Shape, reduce_axes, stage

# The nonzero entries of each row of Bᵀ (input transform) and Aᵀ (output transform), as
# (column, sign); G (filter transform) as a dense matrix, used only in numpy.
B_T: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, 1), (2, -1)), ((1, 1), (2, 1)), ((1, -1), (2, 1)), ((1, 1), (3, -1)))
A_T: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, 1), (1, 1), (2, 1)), ((1, 1), (2, -1), (3, -1)))
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
TILE = 2  # outputs per tile side
POINTS = 4  # transformed points per tile side


def filter_transform(weight: np.ndarray) -> np.ndarray:
    """U = G g Gᵀ for every filter g of `weight` (K, C, 3, 3): (4, 4, K, C), float32."""
    u = np.einsum("er,kcrs,ns->enkc", G, weight.astype(np.float64), G)
    return np.ascontiguousarray(u, dtype=np.float32)


def applies(model: Model, node: Node) -> bool:
    """Whether `node` is a convolution Winograd F(2x2, 3x3) computes: a 3x3 filter held as a
    weight, stride 1."""
    return (isinstance(node.op, Conv) and node.inputs[1] in model.weights
            and model.shape(node.inputs[1])[2:] == (3, 3) and node.op.strides == (1, 1))


def winograd(model: Model) -> Model:
    """`model` with each convolution `applies` accepts a `WinogradConv` node of the same name,
    reading its filter's transform, a new weight `<filter>_winograd`; the same inputs, outputs
    and values. ModelError when no convolution qualifies."""
    nodes, weights = [], dict(model.weights)
    shapes = dict(model._shapes)
    for n in model.nodes:
        if not applies(model, n):
            nodes.append(n)
            continue
        x, w, *bias = n.inputs
        transformed = f"{w}_winograd"
        while transformed in shapes:
            transformed += "_"
        if transformed not in weights:
            weights[transformed] = filter_transform(model.weights[w])
            shapes[transformed] = weights[transformed].shape
        nodes.append(Node(n.name, WinogradConv(n.op.pads), (x, w, transformed, *bias), n.shape))
    if len(weights) == len(model.weights):
        raise ModelError(f"{model.name}: no convolution Winograd F(2x2, 3x3) computes (it needs "
                         f"a 3x3 filter held as a weight, stride 1)")
    return replace(model, nodes=tuple(nodes), weights=weights, _shapes=shapes)


@dataclass(frozen=True)
class WinogradConv(Operator):
    """A 3x3, stride-1 convolution by Winograd F(2x2, 3x3): inputs X (N, C, H, W), the filter W
    (K, C, 3, 3) for `evaluate`, its transform U (4, 4, K, C) for the stages, and a bias (K,)
    optional."""

    pads: tuple[int, ...] = (0, 0, 0, 0)
    op_type: ClassVar[str] = "WinogradConv"
    arity: ClassVar[tuple[int, int]] = (3, 4)

    def _direct(self) -> Conv:
        return Conv(self.pads, (1, 1))

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        x, w, u = shapes[:3]
        out = self._direct().infer([x, w, *shapes[3:]])
        if w[2:] != (3, 3) or u != (POINTS, POINTS, w[0], w[1]):
            raise ModelError(f"WinogradConv: filter {w} and transform {u} do not match a 3x3 "
                             f"filter's F(2x2, 3x3)")
        return out

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        x, w, _, *bias = arrays
        return self._direct().evaluate(x, w, *bias)

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        x, _, u, *bias = operands
        batch, channels, height, width = x.shape
        filters, rows, cols = shape[1:]
        top, left = self.pads[0], self.pads[1]
        tiles_y, tiles_x = -(-rows // TILE), -(-cols // TILE)

        def split(nb, c, y, parity, xh):
            col = xh * 2 + parity - left
            row = y - top
            return select(all_of(row >= 0, row < height, col >= 0, col < width),
                          x[(nb, c, row, col)], 0.0)

        d = compute((batch, channels, TILE * tiles_y + 2, 2, tiles_x + 1), split,
                    f"{name}__split", axis_names=["i0", "i1", "i2", "i3", "i4"])

        def transformed(e, n, c, nb, ty, tx) -> Expr:
            def point(e_: int, n_: int) -> Expr:
                return _signed_sum(
                    (sr * ss, d[nb, c, ty * 2 + r, s % 2, tx + s // 2])
                    for r, sr in B_T[e_] for s, ss in B_T[n_])
            return _table(e, n, POINTS, point)

        v = compute((POINTS, POINTS, channels, batch, tiles_y, tiles_x), transformed,
                    f"{name}__in", axis_names=["i0", "i1", "i2", "i3", "i4", "i5"])
        (rc,) = reduce_axes([channels])
        m = compute((POINTS, POINTS, filters, batch, tiles_y, tiles_x),
                    lambda e, n, k, nb, ty, tx: sum_(u[(e, n, k, rc)] * v[e, n, rc, nb, ty, tx],
                                                     axis=rc),
                    f"{name}__product", axis_names=["i0", "i1", "i2", "i3", "i4", "i5"])

        def inverse(nb, k, i, j, ty, tx) -> Expr:
            def point(i_: int, j_: int) -> Expr:
                return _signed_sum(
                    (se, _signed_sum((sn, m[e, n, k, nb, ty, tx]) for n, sn in A_T[j_]))
                    for e, se in A_T[i_])
            return _table(i, j, TILE, point)

        tiled = compute((batch, filters, TILE, TILE, tiles_y, tiles_x), inverse,
                        f"{name}__out", axis_names=["i0", "i1", "i2", "i3", "i4", "i5"])

        def untiled(idx):
            nb, k, h, w = idx
            y = tiled[nb, k, h % TILE, w % TILE, h // TILE, w // TILE]
            return y + bias[0][(k,)] if bias else y

        return stage(shape, untiled, name)


def _table(a: Expr, b: Expr, extent: int, point: Callable[[int, int], Expr]) -> Expr:
    """`point(a_, b_)` for the values a_ and b_ (each below `extent`) the axes `a` and `b` take,
    as a select over each axis (the backend decides it per run of the loop, not per element)."""
    def over(axis: Expr, value: Callable[[int], Expr]) -> Expr:
        out = value(extent - 1)
        for k in range(extent - 2, -1, -1):
            out = select(axis <= Const(k, "int"), value(k), out)
        return out

    return over(a, lambda a_: over(b, lambda b_: point(a_, b_)))


def _signed_sum(terms: Iterable[tuple[int, Expr]]) -> Expr:
    """Σ sign·term with signs ±1, as additions and subtractions (a leading minus a negation)."""
    out: Expr | None = None
    for sign, term in terms:
        if out is None:
            out = term if sign > 0 else -term
        else:
            out = out + term if sign > 0 else out - term
    assert out is not None
    return out


__all__ = ["WinogradConv", "applies", "filter_transform", "winograd"]
