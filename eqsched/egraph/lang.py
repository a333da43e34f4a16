"""The e-graph language: egglog sorts mirroring `eqsched.egraph.term`, and Term -> egglog.

    Body  = nil | cons(Stmt, Body) | append(Body, Body)      (append: only for fusion rules)
          | factor_lanes(block, Body)           (only for the rfactor rule: §20)
    Stmt  = loop(group, path, Kind, Body) | block(name) | cached(stage, Body)
          | rloop(group, path, Kind, Body)      (an rfactor loop: at the root, or a lane loop)
    Root  = rnil | rcons(Stmt, Root) | inlined(stage, Root) | packed(block, buffer, dim, Root)
    Kind  = serial | vector | unroll | parallel

The root list has its own sort so that context-dependent rules (parallel only at the root) can
match a loop in root position without putting the annotated loop into the same e-class as the
loop wherever else it occurs. `append` is a function defined by rewrites; extraction never picks
an append node, since every append class also holds the cons list it evaluates to.
`factor_lanes(n, body)` is one too: it rewrites to body with the lane loop around block n
factored, and spells no program where it finds none.

See docs/ARCHITECTURE.md §4 The e-graph.
"""

from __future__ import annotations

from egglog import Expr, StringLike, function, i64Like, relation

from ..ir import LoopKind
from .term import BlockRef, Cached, PieceLoop, RfactorLoop, Stmt, Term


class Kind(Expr):
    @classmethod
    def serial(cls) -> Kind: ...

    @classmethod
    def vector(cls) -> Kind: ...

    @classmethod
    def unroll(cls) -> Kind: ...

    @classmethod
    def parallel(cls) -> Kind: ...


class SStmt(Expr):
    """A statement (egglog sort)."""


class Body(Expr):
    @classmethod
    def nil(cls) -> Body: ...

    @classmethod
    def cons(cls, head: SStmt, tail: Body) -> Body: ...


class Root(Expr):
    @classmethod
    def rnil(cls) -> Root: ...

    @classmethod
    def rcons(cls, head: SStmt, tail: Root) -> Root: ...

    @classmethod
    def inlined(cls, stage: StringLike, rest: Root) -> Root: ...

    @classmethod
    def packed(cls, block: StringLike, buffer: StringLike, dim: i64Like, rest: Root) -> Root: ...


@function
def loop(group: StringLike, path: StringLike, kind: Kind, body: Body) -> SStmt: ...


@function
def rloop(group: StringLike, path: StringLike, kind: Kind, body: Body) -> SStmt: ...


@function
def block(name: StringLike) -> SStmt: ...


@function
def cached(stage: StringLike, body: Body) -> SStmt: ...


@function
def append(a: Body, b: Body) -> Body: ...


@function
def factor_lanes(block: StringLike, body: Body) -> Body: ...


# The whole program: `saturate` registers this fact on the root it starts from, so that the
# serialized e-graph names the program's e-class and rules can match at the top of the program.
program_root = relation("program_root", Root)


KIND_EXPR = {
    LoopKind.SERIAL: Kind.serial,
    LoopKind.VECTOR: Kind.vector,
    LoopKind.UNROLL: Kind.unroll,
    LoopKind.PARALLEL: Kind.parallel,
}
# Operator names as they appear in egglog's serialized JSON, mapped to our vocabulary.
SERIALIZED_OPS = {
    "Kind.serial": "serial", "Kind.vector": "vector", "Kind.unroll": "unroll",
    "Kind.parallel": "parallel", "Body.nil": "nil", "Body.cons": "cons", "Root.rnil": "rnil",
    "Root.rcons": "rcons", "Root.inlined": "inlined", "Root.packed": "packed", "loop": "loop",
    "rloop": "rloop", "block": "block", "cached": "cached", "append": "append",
    "factor_lanes": "factor_lanes",
}


def body_expr(stmts: tuple[Stmt, ...]) -> Body:
    out = Body.nil()
    for s in reversed(stmts):
        out = Body.cons(stmt_expr(s), out)
    return out


def stmt_expr(s: Stmt) -> SStmt:
    if isinstance(s, RfactorLoop):
        return rloop(s.group, s.path, KIND_EXPR[s.kind](), body_expr(s.body))
    if isinstance(s, PieceLoop):
        return loop(s.group, s.path, KIND_EXPR[s.kind](), body_expr(s.body))
    if isinstance(s, BlockRef):
        return block(s.name)
    if isinstance(s, Cached):
        return cached(s.stage, body_expr(s.body))
    raise TypeError(f"not a statement: {s!r}")


def root_expr(term: Term) -> Root:
    """The egglog expression of a term, spelled as the rules write it: inlined stages first, then
    the statements, then the packs at the tail of the list (where a pack cannot make a cycle)."""
    out = Root.rnil()
    for p in reversed(term.packs):
        out = Root.packed(p.block, p.buffer, p.dim, out)
    for s in reversed(term.body):
        out = Root.rcons(stmt_expr(s), out)
    for stage in reversed(term.inlined):
        out = Root.inlined(stage, out)
    return out
