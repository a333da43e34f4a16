"""Index arithmetic inside a generated function: loop variables, addresses, select conditions.

A loop variable is one of: a Python int (an unrolled loop: the body is emitted once per value, so
indices fold to constants and a local tile can live in registers), an i64 SSA value (a serial
loop), or the lanes `<0, 1, .., L-1>` of the one vectorized loop around the code. Index
expressions are normalized to affine form over the loop variables (`to_affine`, which also resolves
`//` and `%` of split loops); the coefficient of the vectorized loop in a buffer's linearized
address decides between a vector access (1), a scalar one (0) and a gather. Indices that are not
affine are computed as integer code, per lane when they depend on the vectorized loop.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from math import prod

from llvmlite import ir

from ..affine import Affine, AffineError, Ranges, to_affine
from ..expr import BinOp, Cmp, Const, Expr, Var, substitute
from ..ir import Block, Loop, Program
from .errors import BackendError
from .mathlib import same_shape

I64 = ir.IntType(64)


@dataclass(frozen=True)
class Lanes:
    """This loop variable is the vectorized loop's lane index, from `first` (a piece of a
    tail starts past lane 0)."""

    first: int = 0


Scalar = int | ir.Value  # an index value: folded constant or i64 / <L x i64> SSA value


@dataclass
class Address:
    """Element offset of an access: `scalar + stride * lane`, or per-lane `vector` offsets, or
    contiguous `chunks`: the first element of each run of `len(lanes) // len(chunks)` lanes."""

    scalar: ir.Value
    stride: int = 0
    vector: ir.Value | None = None
    chunks: list[ir.Value] | None = None


class Indexer:
    """The loops around the code being emitted, and the current block's axes in terms of them."""

    def __init__(self, builder: ir.IRBuilder, prog: Program):
        self.b = builder
        self.prog = prog
        self.env: dict[str, Scalar | Lanes] = {}
        self.ranges: dict[str, tuple[int, int]] = {}
        self.depth: dict[str, int] = {}
        self.axes: dict[str, Expr] = {}
        self.vec: Loop | None = None

    def enter(self, loop: Loop, value: Scalar | Lanes,
              span: tuple[int, int] | None = None) -> None:
        """`loop` encloses what follows with this value, over `span` (inclusive; default its
        whole extent): a peeled or partitioned loop runs over part of it."""
        self.env[loop.name] = value
        self.ranges[loop.name] = span if span is not None else (0, loop.extent - 1)
        self.depth[loop.name] = len(self.depth)
        if isinstance(value, Lanes):
            self.vec = loop

    def leave(self, loop: Loop) -> None:
        for table in (self.env, self.ranges, self.depth):
            table.pop(loop.name, None)
        if self.vec is loop:
            self.vec = None

    def bind(self, blk: Block) -> None:
        """Make `blk`'s axes the variables of the index expressions that follow."""
        self.axes = {bd.axis: bd.expr() for bd in blk.bindings}
        missing = [a.name for a in blk.axes if a.name not in self.axes]
        if missing:
            raise BackendError(f"block {blk.name} has no binding for axes {missing}")

    def loop_expr(self, e: Expr) -> Expr:
        """An expression over the block's axes, rewritten over the enclosing loops."""
        return substitute(e, self.axes)

    def address(self, buffer: str, indices: tuple[Expr, ...], chunked: bool = False) -> Address:
        """Where an access goes. With `chunked` (a load), lanes that are not contiguous as a
        whole but are in aligned runs (a 64-wide vector over 16-wide packed panels,
        `W_packed[k // 16, .., k % 16]`) get the start of each run instead of a gather."""
        shape = self.prog.buffer(buffer).shape
        if len(indices) != len(shape):
            raise BackendError(
                f"{buffer} has {len(shape)} dimensions but is indexed with {len(indices)}")
        strides = [prod(shape[d + 1:]) for d in range(len(shape))]
        loop_indices = [self.loop_expr(ix) for ix in indices]
        try:
            flat = self._flat(loop_indices, strides)
        except AffineError:
            runs = self._runs(loop_indices, strides) if chunked else None
            if runs is not None:
                return runs
            return self._general_address(loop_indices, strides)
        addr = self._affine_address(flat)
        if chunked and addr.stride not in (0, 1):
            return self._runs(loop_indices, strides) or addr
        return addr

    def coefficient(self, buffer: str, indices: tuple[Expr, ...], loop: str) -> int | None:
        """How many elements apart an access is from one step of `loop` to the next (its
        coefficient in the buffer's linearized address); None when the index is not affine."""
        shape = self.prog.buffer(buffer).shape
        strides = [prod(shape[d + 1:]) for d in range(len(shape))]
        try:
            flat = self._flat([self.loop_expr(ix) for ix in indices], strides)
        except AffineError:
            return None
        return flat.coeff(loop)

    def _flat(self, indices: list[Expr], strides: list[int]) -> Affine:
        flat = Affine.of({})
        for ix, stride in zip(indices, strides):
            flat = flat + to_affine(ix, self.ranges).scale(stride)
        return flat

    def _runs(self, indices: list[Expr], strides: list[int]) -> Address | None:
        """The widest split of the vector's lanes into aligned runs (at least 4 lanes) each of
        which is contiguous, as the start of each run; None if there is none."""
        vec = self.vec
        if vec is None:
            return None
        first, last = self.ranges[vec.name]
        if last - first + 1 != vec.extent:
            return None
        width = vec.extent // 2
        while width >= 4 and vec.extent % width == 0:
            starts = []
            for run in range(vec.extent // width):
                self.ranges[vec.name] = (first + run * width, first + run * width + width - 1)
                try:
                    const, lane_stride, terms = self._split_affine(self._flat(indices, strides))
                except AffineError:
                    break
                finally:
                    self.ranges[vec.name] = (first, last)
                if lane_stride != 1:
                    break
                starts.append(self._sum_terms(terms, const + run * width))
            else:
                return Address(starts[0], chunks=starts)
            width //= 2
        return None

    def _affine_address(self, flat: Affine) -> Address:
        const, lane_stride, terms = self._split_affine(flat)
        return Address(self._sum_terms(terms, const), lane_stride)

    def _split_affine(self, flat: Affine) -> tuple[int, int, list[tuple[ir.Value, int]]]:
        const, lane_stride = flat.const, 0
        terms: list[tuple[int, ir.Value, int]] = []
        for var, coeff in flat.terms:
            value = self.var(var)
            if isinstance(value, Lanes):
                lane_stride += coeff
                const += coeff * value.first
            elif isinstance(value, int):
                const += coeff * value
            else:
                terms.append((self.depth[var], value, coeff))
        # Outer loops first: their partial sums are invariant in the inner loops (LICM hoists them).
        terms.sort(key=lambda t: t[0])
        return const, lane_stride, [(v, c) for _, v, c in terms]

    def _sum_terms(self, terms: list[tuple[ir.Value, int]], const: int) -> ir.Value:
        b = self.b
        total: ir.Value | None = None
        for value, coeff in terms:
            term = value if coeff == 1 else b.mul(value, ir.Constant(I64, coeff), flags=["nsw"])
            total = term if total is None else b.add(total, term, flags=["nsw"])
        if total is None:
            return ir.Constant(I64, const)
        return b.add(total, ir.Constant(I64, const), flags=["nsw"]) if const else total

    def _general_address(self, indices: list[Expr], strides: list[int]) -> Address:
        total: Scalar = 0
        for ix, stride in zip(indices, strides):
            total = self._int_op("+", total, self._int_op("*", self.int_value(ix), stride))
        if isinstance(total, ir.Value) and isinstance(total.type, ir.VectorType):
            return Address(ir.Constant(I64, 0), vector=total)
        return Address(self._as_i64(total))

    def var(self, name: str) -> Scalar | Lanes:
        try:
            return self.env[name]
        except KeyError:
            raise BackendError(f"an index uses loop {name}, which does not enclose it") from None

    # ---- integer expressions (indices in conditions, non-affine indices) ---------------------

    def int_value(self, e: Expr) -> Scalar:
        """Value of an integer expression over loops: Python int, i64, or <L x i64> per lane."""
        try:
            const, lane_stride, terms = self._split_affine(to_affine(e, self.ranges))
        except AffineError:
            return self._int_tree(e)
        value: Scalar = const if not terms else self._sum_terms(terms, const)
        if lane_stride:
            lanes = self.lanes()
            if lane_stride != 1:
                lanes = self.b.mul(lanes, self.splat(lane_stride))
            value = self._int_op("+", value, lanes)
        return value

    def _int_tree(self, e: Expr) -> Scalar:
        if isinstance(e, Const):
            return int(e.value)
        if isinstance(e, Var):
            value = self.var(e.name)
            return self.lanes(value.first) if isinstance(value, Lanes) else value
        if isinstance(e, BinOp):
            return self._int_op(e.op, self._int_tree(e.a), self._int_tree(e.b))
        raise BackendError(f"not an integer index expression: {e}")

    def _int_op(self, op: str, x: Scalar, y: Scalar) -> Scalar:
        if isinstance(x, int) and isinstance(y, int):
            return _FOLD[op](x, y)
        b = self.b
        x, y = same_shape(b, self._as_i64(x), self._as_i64(y))
        if op == "+":
            return b.add(x, y)
        if op == "-":
            return b.sub(x, y)
        if op == "*":
            return b.mul(x, y)
        if op in ("max", "min"):
            return b.select(b.icmp_signed(">" if op == "max" else "<", x, y), x, y)
        # Floor division and modulo (Python semantics): adjust C's truncation when the signs differ.
        q, r = b.sdiv(x, y), b.srem(x, y)
        zero = ir.Constant(x.type, None)
        fix = b.and_(b.icmp_signed("!=", r, zero),
                     b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))
        if op == "//":
            return b.sub(q, b.zext(fix, x.type))
        if op == "%":
            return b.add(r, b.select(fix, y, zero))
        raise BackendError(f"unknown integer operator {op!r}")

    def cond(self, c: Expr) -> ir.Value | bool:
        """A select condition: i1, <L x i1> when it differs per lane, or a bool known now (the
        loops' ranges decide it: the partition of a padding's border steps makes that the rule
        inside)."""
        if not isinstance(c, Cmp):
            raise BackendError(f"a select condition must be a comparison, got {c}")
        known = decided(c, self.loop_expr, self.ranges)
        if known is not None:
            return known
        if c.op == "and":
            x, y = self.cond(c.a), self.cond(c.b)
            if isinstance(x, bool) or isinstance(y, bool):
                if x is False or y is False:
                    return False
                return y if x is True else x
            return self.b.and_(*same_shape(self.b, x, y))
        x, y = self.int_value(self.loop_expr(c.a)), self.int_value(self.loop_expr(c.b))
        if isinstance(x, int) and isinstance(y, int):
            return _COMPARE[c.op](x, y)
        return self.b.icmp_signed(c.op, *same_shape(self.b, self._as_i64(x), self._as_i64(y)))

    # ---- lane vectors ------------------------------------------------------------------------

    def lanes(self, first: int = 0) -> ir.Constant:
        """<f, f + 1, .., f + L - 1> as i64: the vectorized loop's lane numbers from `first` (the
        variable's values, from its `Lanes.first`; from 0, the lanes' offsets from an address
        whose scalar part already holds the first lane's)."""
        assert self.vec is not None
        return ir.Constant(ir.VectorType(I64, self.vec.extent),
                           list(range(first, first + self.vec.extent)))

    def splat(self, value: int) -> ir.Constant:
        assert self.vec is not None
        return ir.Constant(ir.VectorType(I64, self.vec.extent), [value] * self.vec.extent)

    def _as_i64(self, value: Scalar) -> ir.Value:
        return ir.Constant(I64, value) if isinstance(value, int) else value


_FOLD = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
         "%": operator.mod, "max": max, "min": min}


def decided(c: Cmp, over_loops: Callable[[Expr], Expr], ranges: Ranges) -> bool | None:
    """A condition's value at every point of the loops' `ranges`, None when points differ or it
    is not affine; `over_loops` rewrites a side of a comparison over the loop variables."""
    if c.op == "and":
        x = decided(c.a, over_loops, ranges)  # type: ignore[arg-type]
        y = decided(c.b, over_loops, ranges)  # type: ignore[arg-type]
        if x is False or y is False:
            return False
        return True if x and y else None
    try:
        lo, hi = difference(c, over_loops, ranges).bounds(ranges)
    except AffineError:
        return None
    return compared(c.op, lo, hi)


def difference(c: Cmp, over_loops: Callable[[Expr], Expr], ranges: Ranges) -> Affine:
    """A comparison's left side less its right, over the loop variables (AffineError when it is
    not affine)."""
    return to_affine(over_loops(c.a), ranges) + to_affine(over_loops(c.b), ranges).scale(-1)


def compared(op: str, lo: int, hi: int) -> bool | None:
    """`a op b` where a - b lies in [lo, hi]: its value when the whole interval agrees."""
    holds, fails = {"<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0), ">": (lo > 0, hi <= 0),
                    ">=": (lo >= 0, hi < 0), "==": (lo == hi == 0, lo > 0 or hi < 0),
                    "!=": (lo > 0 or hi < 0, lo == hi == 0)}[op]
    return True if holds else False if fails else None


_COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">=": operator.ge, ">": operator.gt}
