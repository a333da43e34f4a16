"""Affine index analysis: index expressions as `sum(coeff * var) + const` over bounded variables.

Structural loop naming means split loops rebuild an axis as a mixed-radix sum
(`i = i.0*64 + i.1*8 + i.2`), and packed layouts index with `j // 32` and `j % 32`. Both are
affine once the variables' ranges are known: `(j.0*32 + j.1) // 32 == j.0` when `0 <= j.1 < 32`.
The backend uses this to find unit-stride (vectorizable) accesses; legality uses it to compare
what a writer writes with what a reader reads.

See docs/ARCHITECTURE.md §6 Programs and schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

from .expr import BinOp, Const, Expr, Var, to_str

Ranges = dict[str, tuple[int, int]]  # inclusive [lo, hi] per variable


class AffineError(ValueError):
    """The expression is not affine in its variables (given their ranges)."""


@dataclass(frozen=True)
class Affine:
    terms: tuple[tuple[str, int], ...]  # (var, coeff), sorted by var, no zero coefficients
    const: int = 0

    @staticmethod
    def of(terms: dict[str, int], const: int = 0) -> Affine:
        return Affine(tuple(sorted((v, c) for v, c in terms.items() if c != 0)), const)

    @property
    def coeffs(self) -> dict[str, int]:
        return dict(self.terms)

    def coeff(self, var: str) -> int:
        return self.coeffs.get(var, 0)

    def __add__(self, other: Affine) -> Affine:
        t = self.coeffs
        for v, c in other.terms:
            t[v] = t.get(v, 0) + c
        return Affine.of(t, self.const + other.const)

    def scale(self, k: int) -> Affine:
        return Affine.of({v: c * k for v, c in self.terms}, self.const * k)

    def bounds(self, ranges: Ranges) -> tuple[int, int]:
        lo = hi = self.const
        for v, c in self.terms:
            if v not in ranges:
                raise AffineError(f"variable {v} has no known range")
            a, b = ranges[v]
            lo += min(c * a, c * b)
            hi += max(c * a, c * b)
        return lo, hi

    def floordiv(self, d: int, ranges: Ranges) -> Affine:
        if d <= 0:
            raise AffineError(f"division by non-positive {d}")
        whole = {v: c // d for v, c in self.terms if c % d == 0}
        rest = Affine.of({v: c for v, c in self.terms if c % d != 0}, self.const)
        lo, hi = rest.bounds(ranges)
        if lo // d != hi // d:
            raise AffineError(f"({self}) // {d} is not affine over the variables' ranges")
        return Affine.of(whole, lo // d)

    def mod(self, d: int, ranges: Ranges) -> Affine:
        return self + self.floordiv(d, ranges).scale(-d)

    def to_expr(self) -> Expr:
        out: Expr | None = None
        for v, c in self.terms:
            t: Expr = Var(v) if c == 1 else BinOp("*", Var(v), Const(c, "int"))
            out = t if out is None else BinOp("+", out, t)
        if out is None:
            return Const(self.const, "int")
        return out if self.const == 0 else BinOp("+", out, Const(self.const, "int"))

    def __str__(self) -> str:
        parts = [v if c == 1 else f"{c}*{v}" for v, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


def to_affine(e: Expr, ranges: Ranges) -> Affine:
    """Normalize an integer expression; raises AffineError when it is not affine."""
    if isinstance(e, Const):
        if e.dtype != "int":
            raise AffineError(f"float constant {e} in an index")
        return Affine.of({}, int(e.value))
    if isinstance(e, Var):
        return Affine.of({e.name: 1})
    if isinstance(e, BinOp) and e.dtype == "int":
        a = to_affine(e.a, ranges)
        if e.op in ("+", "-"):
            b = to_affine(e.b, ranges)
            return a + (b if e.op == "+" else b.scale(-1))
        b = to_affine(e.b, ranges)
        if e.op == "*":
            if not b.terms:
                return a.scale(b.const)
            if not a.terms:
                return b.scale(a.const)
            raise AffineError(f"product of two variables: {to_str(e)}")
        if e.op in ("//", "%"):
            if b.terms:
                raise AffineError(f"division by a variable: {to_str(e)}")
            return a.floordiv(b.const, ranges) if e.op == "//" else a.mod(b.const, ranges)
    raise AffineError(f"not an affine index expression: {to_str(e)}")


def bounds_of(e: Expr, ranges: Ranges) -> tuple[int, int]:
    return to_affine(e, ranges).bounds(ranges)


def interval_of(e: Expr, ranges: Ranges) -> tuple[int, int]:
    """Inclusive bounds of an integer expression by interval arithmetic: looser than `bounds_of`
    for affine ones, but defined for `//` and `%` by constants that do not resolve (a packed
    index `j // 4` over j in [0, 11] is in [0, 2])."""
    if isinstance(e, Const) and e.dtype == "int":
        return int(e.value), int(e.value)
    if isinstance(e, Var):
        if e.name not in ranges:
            raise AffineError(f"variable {e.name} has no known range")
        return ranges[e.name]
    if isinstance(e, BinOp) and e.dtype == "int":
        (a, b), (c, d) = interval_of(e.a, ranges), interval_of(e.b, ranges)
        if e.op == "+":
            return a + c, b + d
        if e.op == "-":
            return a - d, b - c
        if e.op == "*":
            corners = (a * c, a * d, b * c, b * d)
            return min(corners), max(corners)
        if e.op in ("//", "%") and c == d and c > 0:
            if e.op == "//":
                return a // c, b // c
            return (a % c, b % c) if a // c == b // c else (0, c - 1)
    raise AffineError(f"no interval for {to_str(e)}")
