"""Winograd convolution F(2x2, 3x3): a model's 3x3 stride-1 convolutions computed with fewer
multiplications, the algorithm choice TVM and Ansor offer beside the direct form.

    fast = winograd(get_model("resnet_block"))   # the same values; three nodes a convolution
    fast.evaluate(inputs)                        # numpy, the outputs by the direct convolution

Each output tile of 2x2 points is computed from a 4x4 tile of the padded input d and the 3x3
filter g as Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A (Lavin and Gray, 2016). Summed over the input
channels, the elementwise product becomes 16 matrix products, one per point (e, n) of the 4x4
transformed tile: M[p] = U[p] @ V[p], K x C times C x tiles. That is 16 multiply-adds
per 4 outputs and input channel where the direct form does 36: a 56x56x64x64 convolution goes
from 231 to 103 MFLOP of products, plus the transforms. U = G g Gᵀ is made here, in float64,
once: a weight of the rewritten model. The transforms are sums and differences only (B and A
hold 0 and ±1), written out term by term so no stage multiplies by a constant matrix.

The rewrite computes each such convolution by three nodes, so three tasks (the two
convolutions of a ResNet block share the first two: the same computation on the same shapes):

    <conv>_tiles     WinogradInput:   V[p, c, t] = Bᵀ d B, four terms a point, from `__split`,
                     the padded input with its columns split by parity (so each tile's
                     stride-2 reads are unit-stride ones); t numbers the tiles row-major
    <conv>_products  MatMul:          M[p, k, t] = Σ_c U[p, k, c] V[p, c, t], batched over p
    <conv>           WinogradOutput:  Aᵀ M A, nine terms an output, into `__tiles`, then each
                     output read from its tile (plus the bias); its elementwise consumers
                     (batch norm, ReLU, a residual) fuse after it as after a direct convolution

WinogradOutput also takes the convolution's input and filter, which its stages do not read: its
`evaluate` is the direct convolution, so the model's numpy evaluation, the reference of a
compiled model's end-to-end check, never uses the Winograd algorithm.

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
from ..te import Tensor, compute
from .graph import Model, Node
from .linear import Conv, MatMul
from .op import ModelError, Operand, Operator, Shape, f32, stage

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
    """U = G g Gᵀ for every filter g of `weight` (K, C, 3, 3): (16, K, C), float32, the 4x4
    points of a transformed filter first (row by row)."""
    u = np.einsum("er,kcrs,ns->enkc", G, weight.astype(np.float64), G)
    return f32(u.reshape(POINTS * POINTS, *weight.shape[:2]))


def applies(model: Model, node: Node) -> bool:
    """Whether `node` is a convolution Winograd F(2x2, 3x3) computes: a 3x3 filter held as a
    weight, stride 1."""
    return (isinstance(node.op, Conv) and node.inputs[1] in model.weights
            and model.shape(node.inputs[1])[2:] == (3, 3) and node.op.strides == (1, 1))


def winograd(model: Model) -> Model:
    """`model` with each convolution `applies` accepts computed by three nodes: `<conv>_tiles`
    (WinogradInput), `<conv>_products` (a batched MatMul of its filter's transform, a new weight
    `<filter>_winograd`, by the tiles) and `<conv>` itself (WinogradOutput); the same inputs,
    outputs and values. ModelError when no convolution qualifies."""
    nodes: list[Node] = []
    weights, shapes = dict(model.weights), dict(model._shapes)

    def fresh(base: str) -> str:
        name = base
        while name in shapes:
            name += "_"
        return name

    for n in model.nodes:
        if not applies(model, n):
            nodes.append(n)
            continue
        x, w, *bias = n.inputs
        transformed = f"{w}_winograd"
        if transformed not in weights:
            transformed = fresh(transformed)
            weights[transformed] = filter_transform(model.weights[w])
            shapes[transformed] = weights[transformed].shape
        pads = tuple(n.op.pads)
        tiles = WinogradInput(pads)
        tiles_shape = tiles.infer([model.shape(x)])
        products_shape = MatMul().infer([shapes[transformed], tiles_shape])
        v, m = fresh(f"{n.name}_tiles"), fresh(f"{n.name}_products")
        shapes[v], shapes[m] = tiles_shape, products_shape
        nodes += [Node(v, tiles, (x,), tiles_shape),
                  Node(m, MatMul(), (transformed, v), products_shape),
                  Node(n.name, WinogradOutput(pads), (m, x, w, *bias), n.shape)]
    if len(weights) == len(model.weights):
        raise ModelError(f"{model.name}: no convolution Winograd F(2x2, 3x3) computes (it needs "
                         f"a 3x3 filter held as a weight, stride 1)")
    return replace(model, nodes=tuple(nodes), weights=weights, _shapes=shapes)


def _tiles(x: Shape, pads: Sequence[int]) -> tuple[int, int, int, int]:
    """The output's rows and columns of a 3x3 stride-1 convolution of `x` padded by `pads`, and
    its tiles down and across."""
    top, left, bottom, right = pads
    rows, cols = x[2] + top + bottom - 2, x[3] + left + right - 2
    if rows < 1 or cols < 1:
        raise ModelError(f"Winograd: a 3x3 window does not fit the padded input {x}")
    return rows, cols, -(-rows // TILE), -(-cols // TILE)


@dataclass(frozen=True)
class WinogradInput(Operator):
    """X (N, C, H, W) padded by `pads` -> V (16, C, T): each 4x4 input tile's transform Bᵀ d B,
    its 16 points first; the T = N x tiles down x tiles across tiles in one axis, row-major, so
    the product is one batched matrix product whose columns are a whole multiple of a vector
    more often than a row of tiles is."""

    pads: tuple[int, ...] = (0, 0, 0, 0)
    op_type: ClassVar[str] = "WinogradInput"

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        (x,) = shapes
        if len(x) != 4:
            raise ModelError(f"WinogradInput: the input must be NCHW, got {x}")
        _, _, tiles_y, tiles_x = _tiles(x, self.pads)
        return (POINTS * POINTS, x[1], x[0] * tiles_y * tiles_x)

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        (x,) = arrays
        top, left, _, _ = self.pads
        _, _, tiles_y, tiles_x = _tiles(x.shape, self.pads)
        padded = np.zeros((*x.shape[:2], TILE * tiles_y + 2, TILE * tiles_x + 2))
        h, w = min(x.shape[2], padded.shape[2] - top), min(x.shape[3], padded.shape[3] - left)
        padded[:, :, top:top + h, left:left + w] = x[:, :, :h, :w]
        windows = np.lib.stride_tricks.sliding_window_view(padded, (4, 4), axis=(2, 3))
        d = windows[:, :, ::TILE, ::TILE]  # (N, C, tiles_y, tiles_x, 4, 4)
        b_t = _matrix(B_T)
        v = np.einsum("er,bcyxrs,fs->efcbyx", b_t, d, b_t)
        return f32(v.reshape(POINTS * POINTS, x.shape[1], -1))

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        (x,) = operands
        batch, channels, height, width = x.shape
        top, left = self.pads[0], self.pads[1]
        _, _, tiles_y, tiles_x = _tiles(x.shape, self.pads)

        def split(nb, c, y, parity, xh):
            col = xh * 2 + parity - left
            row = y - top
            return select(all_of(row >= 0, row < height, col >= 0, col < width),
                          x[(nb, c, row, col)], 0.0)

        d = compute((batch, channels, TILE * tiles_y + 2, 2, tiles_x + 1), split,
                    f"{name}__split", axis_names=["i0", "i1", "i2", "i3", "i4"])

        def point(e: int, n: int, c: Expr, nb: Expr, ty: Expr, tx: Expr) -> Expr:
            return _signed_sum((sr * ss, d[nb, c, ty * 2 + r, s % 2, tx + s // 2])
                               for r, sr in B_T[e] for s, ss in B_T[n])

        # Stored as (16, C, N, tiles down, tiles across), the value's elements in its order: a
        # flat tile axis would need `//` and `%` to find each tile's rows.
        return compute((POINTS * POINTS, channels, batch, tiles_y, tiles_x),
                       lambda p, c, nb, ty, tx: _table(p, lambda e, n: point(e, n, c, nb, ty, tx)),
                       name, axis_names=["i0", "i1", "i2", "i3", "i4"])


@dataclass(frozen=True)
class WinogradOutput(Operator):
    """M (16, K, T) -> Y (N, K, rows, columns): each tile's 2x2
    outputs Aᵀ M A (plus a bias (K,)). It also takes the convolution's input X and filter W,
    which its stages do not read: its `evaluate` is the direct convolution, so a model's numpy
    evaluation, the reference of the end-to-end check, does not use the Winograd algorithm."""

    pads: tuple[int, ...] = (0, 0, 0, 0)
    op_type: ClassVar[str] = "WinogradOutput"
    arity: ClassVar[tuple[int, int]] = (3, 4)

    def infer(self, shapes: Sequence[Shape]) -> Shape:
        m, x, w, *bias = shapes
        out = Conv(self.pads).infer([x, w, *bias])
        tiles_y, tiles_x = _tiles(x, self.pads)[2:]
        if w[2:] != (3, 3) or m != (POINTS * POINTS, w[0], x[0] * tiles_y * tiles_x):
            raise ModelError(f"WinogradOutput: products {m} do not match a 3x3 convolution of "
                             f"{x} by {w}")
        return out

    def evaluate(self, *arrays: np.ndarray) -> np.ndarray:
        _, x, w, *bias = arrays
        return Conv(self.pads).evaluate(x, w, *bias)

    def stages(self, operands: Sequence[Operand], shape: Shape, name: str) -> Tensor:
        m, x, _, *bias = operands
        batch, filters = shape[:2]
        tiles_y, tiles_x = _tiles(x.shape, self.pads)[2:]

        def point(i: int, j: int, nb: Expr, k: Expr, ty: Expr, tx: Expr) -> Expr:
            return _signed_sum(
                (se, _signed_sum((sn, m[(e * POINTS + n, k, (nb * tiles_y + ty) * tiles_x + tx)])
                                 for n, sn in A_T[j]))
                for e, se in A_T[i])

        tiled = compute((TILE * TILE, batch, filters, tiles_y, tiles_x),
                        lambda q, nb, k, ty, tx: _table(
                            q, lambda i, j: point(i, j, nb, k, ty, tx), TILE),
                        f"{name}__tiles", axis_names=["i0", "i1", "i2", "i3", "i4"])

        def untiled(idx):
            nb, k, h, w = idx
            y = tiled[(h % TILE) * TILE + w % TILE, nb, k, h // TILE, w // TILE]
            return y + bias[0][(k,)] if bias else y

        return stage(shape, untiled, name)


def _matrix(rows: Sequence[Sequence[tuple[int, int]]]) -> np.ndarray:
    """A transform table as a dense 4-column matrix."""
    out = np.zeros((len(rows), POINTS))
    for i, row in enumerate(rows):
        for col, sign in row:
            out[i, col] = sign
    return out


def _table(axis: Expr, point: Callable[[int, int], Expr], side: int = POINTS) -> Expr:
    """`point(a, b)` where `axis` = a * side + b, as a chain of selects over `axis` (the backend
    decides it per run of the loop, not per element)."""
    out = point(side - 1, side - 1)
    for k in range(side * side - 2, -1, -1):
        out = select(axis <= Const(k, "int"), point(k // side, k % side), out)
    return out


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


__all__ = ["WinogradInput", "WinogradOutput", "applies", "filter_transform", "winograd"]
