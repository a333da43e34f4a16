"""Scalar expressions: the bodies of stages and the index expressions of loads and stores.

Expressions are immutable and hashable (structural equality), so programs built from them can be
hashed, compared and used as e-graph payloads. Python operators build expressions; `==` keeps its
structural meaning, comparisons for `select` use `lt/le/ge/gt/eq` and the `<`-style operators.

Two value types exist: `int` (index arithmetic over axis variables) and `float32` (data).

See docs/ARCHITECTURE.md §6 Programs and schedules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

ExprLike = Union["Expr", int, float]

FLOAT_BINOPS = ("+", "-", "*", "/", "max", "min")
INT_BINOPS = ("+", "-", "*", "//", "%", "max", "min")
UNARY_FNS = ("exp", "sqrt", "log", "neg", "abs", "tanh", "erf")
CMP_OPS = ("<", "<=", "==", "!=", ">=", ">")


class Expr:
    """Base of all expression nodes; gives them arithmetic operators."""

    __slots__ = ()

    @property
    def dtype(self) -> str:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __add__(self, other: ExprLike) -> Expr:
        return binop("+", self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return binop("+", other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return binop("-", self, other)

    def __rsub__(self, other: ExprLike) -> Expr:
        return binop("-", other, self)

    def __mul__(self, other: ExprLike) -> Expr:
        return binop("*", self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return binop("*", other, self)

    def __truediv__(self, other: ExprLike) -> Expr:
        return binop("/", self, other)

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return binop("/", other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return binop("//", self, other)

    def __mod__(self, other: ExprLike) -> Expr:
        return binop("%", self, other)

    def __neg__(self) -> Expr:
        return Call("neg", (self,)) if self.dtype == "float32" else binop("*", -1, self)

    def __lt__(self, other: ExprLike) -> Expr:
        return Cmp("<", self, as_expr(other))

    def __le__(self, other: ExprLike) -> Expr:
        return Cmp("<=", self, as_expr(other))

    def __gt__(self, other: ExprLike) -> Expr:
        return Cmp(">", self, as_expr(other))

    def __ge__(self, other: ExprLike) -> Expr:
        return Cmp(">=", self, as_expr(other))

    __hash__ = object.__hash__  # replaced by the dataclass hash in every subclass


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: float | int
    type: str = "float32"

    @property
    def dtype(self) -> str:
        return self.type


@dataclass(frozen=True, eq=True)
class Var(Expr):
    """An integer variable: an axis of a stage (in stage bodies) or a loop (after lowering)."""

    name: str

    @property
    def dtype(self) -> str:
        return "int"


@dataclass(frozen=True, eq=True)
class Load(Expr):
    buffer: str
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return "float32"


@dataclass(frozen=True, eq=True)
class BinOp(Expr):
    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return self.a.dtype


@dataclass(frozen=True, eq=True)
class Call(Expr):
    """A float32 math function of one argument (see UNARY_FNS)."""

    fn: str
    args: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return "float32"


@dataclass(frozen=True, eq=True)
class Cmp(Expr):
    """An integer comparison, or `and` of two comparisons; only valid as a `Select` condition."""

    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return "bool"


@dataclass(frozen=True, eq=True)
class Select(Expr):
    """`a if cond else b`; the untaken branch is never evaluated, so it may load out of bounds."""

    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return self.a.dtype


def as_expr(x: ExprLike, like: str | None = None) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        raise TypeError("booleans are not expressions")
    if isinstance(x, int) and like != "float32":
        return Const(x, "int")
    if isinstance(x, (int, float)):
        return Const(float(x), "float32")
    raise TypeError(f"cannot use {type(x).__name__} {x!r} in an expression")


def binop(op: str, a: ExprLike, b: ExprLike) -> Expr:
    """Build `a op b`, promoting Python numbers to the other operand's type."""
    if isinstance(a, Expr):
        b = as_expr(b, a.dtype)
    elif isinstance(b, Expr):
        a = as_expr(a, b.dtype)
    else:
        a, b = as_expr(a), as_expr(b)
    assert isinstance(a, Expr) and isinstance(b, Expr)
    if a.dtype != b.dtype:
        raise TypeError(f"cannot combine {a.dtype} and {b.dtype} with {op!r}: {a} {op} {b}")
    allowed = INT_BINOPS if a.dtype == "int" else FLOAT_BINOPS
    if op not in allowed:
        raise TypeError(f"operator {op!r} is not defined on {a.dtype} values")
    return BinOp(op, a, b)


# ---- math functions for stage bodies -------------------------------------------------------


def _unary(fn: str) -> Callable[[ExprLike], Expr]:
    def f(x: ExprLike) -> Expr:
        e = as_expr(x, "float32")
        if e.dtype != "float32":
            raise TypeError(f"{fn} takes a float32 value, got an index expression {e}")
        return Call(fn, (e,))

    f.__name__ = fn
    f.__doc__ = f"Elementwise {fn} of a float32 expression."
    return f


exp = _unary("exp")
sqrt = _unary("sqrt")
log = _unary("log")
tanh = _unary("tanh")
erf = _unary("erf")


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    return binop("max", a, b)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    return binop("min", a, b)


def relu(x: ExprLike) -> Expr:
    return binop("max", x, 0.0)


def select(cond: Expr, a: ExprLike, b: ExprLike) -> Expr:
    if not isinstance(cond, Cmp):
        raise TypeError(f"select needs a comparison as condition, got {cond}")
    ea = as_expr(a, b.dtype if isinstance(b, Expr) else "float32")
    eb = as_expr(b, ea.dtype)
    if ea.dtype != eb.dtype:
        raise TypeError(f"select branches differ in type: {ea.dtype} vs {eb.dtype}")
    return Select(cond, ea, eb)


def all_of(*conds: Expr) -> Expr:
    """Conjunction of comparisons (for padding conditions)."""
    out = conds[0]
    for c in conds[1:]:
        out = Cmp("and", out, c)
    return out


# ---- traversal ----------------------------------------------------------------------------


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, (BinOp, Cmp)):
        return (e.a, e.b)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    return ()


def rebuild(e: Expr, kids: tuple[Expr, ...]) -> Expr:
    if isinstance(e, Load):
        return Load(e.buffer, kids)
    if isinstance(e, BinOp):
        return BinOp(e.op, *kids)
    if isinstance(e, Cmp):
        return Cmp(e.op, *kids)
    if isinstance(e, Call):
        return Call(e.fn, kids)
    if isinstance(e, Select):
        return Select(*kids)
    return e


def transform(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rewrite: `fn` returns a replacement for a node (its children already
    rewritten) or None to keep it."""
    kids = children(e)
    if kids:
        new_kids = tuple(transform(k, fn) for k in kids)
        if new_kids != kids:
            e = rebuild(e, new_kids)
    out = fn(e)
    return e if out is None else out


def substitute(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """Replace variables by expressions."""
    return transform(e, lambda n: mapping.get(n.name) if isinstance(n, Var) else None)


def walk(e: Expr):
    yield e
    for k in children(e):
        yield from walk(k)


def loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


def free_vars(e: Expr) -> set[str]:
    return {n.name for n in walk(e) if isinstance(n, Var)}


def count_flops(e: Expr) -> int:
    """Floating-point operations in one evaluation of `e` (each math function counts as one; a
    select counts the costlier of its branches, the one it may take)."""
    if isinstance(e, Select):
        return max(count_flops(e.a), count_flops(e.b))
    own = ((isinstance(e, BinOp) and e.dtype == "float32")
           or (isinstance(e, Call) and e.fn != "neg"))
    return int(own) + sum(count_flops(c) for c in children(e))


# ---- printing -----------------------------------------------------------------------------

_PREC = {"max": 9, "min": 9, "*": 7, "/": 7, "//": 7, "%": 7, "+": 6, "-": 6}


def to_str(e: Expr, prec: int = 0) -> str:
    if isinstance(e, Const):
        if e.dtype == "int":
            return str(e.value)
        v = float(e.value)
        return repr(v) if v == v else "nan"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Load):
        return f"{e.buffer}[{', '.join(to_str(i) for i in e.indices)}]"
    if isinstance(e, BinOp):
        if e.op in ("max", "min"):
            return f"{e.op}({to_str(e.a)}, {to_str(e.b)})"
        p = _PREC[e.op]
        s = f"{to_str(e.a, p)} {e.op} {to_str(e.b, p + 1)}"
        return f"({s})" if p < prec else s
    if isinstance(e, Call):
        if e.fn == "neg":
            return f"-{to_str(e.args[0], 8)}"
        return f"{e.fn}({', '.join(to_str(a) for a in e.args)})"
    if isinstance(e, Cmp):
        if e.op == "and":
            return f"{to_str(e.a, 3)} and {to_str(e.b, 3)}"
        return f"{to_str(e.a, 5)} {e.op} {to_str(e.b, 5)}"
    if isinstance(e, Select):
        return f"select({to_str(e.cond)}, {to_str(e.a)}, {to_str(e.b)})"
    raise TypeError(f"not an expression: {e!r}")


for _cls in (Const, Var, Load, BinOp, Call, Cmp, Select):
    _cls.__str__ = to_str  # type: ignore[method-assign]
