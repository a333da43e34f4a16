"""The structure of a scheduled program, with tile sizes kept apart as symbols.

A `Term` is what the e-graph stores: which loops nest in which order, over which pieces of which
dimension groups, with which kinds, around which blocks. It carries no extents. Extents are
`Sizes`: one integer per piece symbol `(group, path)`. A (Term, Sizes) pair is one concrete
program; `eqsched.egraph.encode` converts between that pair and an `ir.Program`.

Pieces. A *dimension group* joins the axes of different stages that must iterate together to be
fused (C.i, D.i and F.i in C=A@B; D=exp(C); F=D@E), named by its first member ("C.i"). A piece
path names a part of the group's extent by the splits that made it: "" is the whole extent;
"0/4".."3/4" are the pieces of a 4-way split (outer to inner); "1/4.0/2" is piece 0 of a 2-way
split of "1/4". Sibling pieces multiply to their parent's extent, except that the top split of a
whole extent may leave a remainder (`remainder_tiles`): its outermost piece is then the ceiling.

    Stmt  = PieceLoop(group, path, kind, body) | BlockRef(name) | Cached(stage, body)
            | RfactorLoop(group, path, kind, body)      (a PieceLoop: §20)
    Root  = the program's top-level statements, plus program-level facts: inlined stages and
            packed operands (PackRef), which have no place in the loop tree.

See docs/ARCHITECTURE.md §3 Vocabulary and §4 The e-graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..ir import LoopKind

# A piece loop's kind is a LoopKind value, kept as a plain str: terms are hashed and ordered by
# their text, which must not depend on how a kind was spelled in Python.
KINDS = tuple(k.value for k in (LoopKind.SERIAL, LoopKind.VECTOR, LoopKind.UNROLL,
                                LoopKind.PARALLEL))


@dataclass(frozen=True)
class PieceLoop:
    group: str
    path: str
    kind: str
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class RfactorLoop(PieceLoop):
    """A loop over a piece of a reduce group whose stage's reduction is factored along it
    (`schedule.Schedule.rfactor`): each iteration accumulates into partials of its own, reduced
    after the loop's root nest. At the root it is the group's outermost piece (partials
    initialized in its body); below the root, the innermost piece (a vector loop whose lanes
    are the partials, initialized before the root nest). Its extent is the number of partials,
    limited so that they fit `schedule.MAX_PARTIAL_ELEMENTS` (`partials_constraint`)."""


@dataclass(frozen=True)
class BlockRef:
    name: str


@dataclass(frozen=True)
class Cached:
    """`cache_write` at the enclosing loop: `stage`'s blocks in `body` accumulate in a local
    tile."""

    stage: str
    body: tuple[Stmt, ...]


Stmt = PieceLoop | BlockRef | Cached


@dataclass(frozen=True)
class PackRef:
    """`pack(block, buffer, dim, factor)` with the factor the size symbol ("pack:" + buffer, "")."""

    block: str
    buffer: str
    dim: int


@dataclass(frozen=True)
class Term:
    body: tuple[Stmt, ...]
    inlined: tuple[str, ...] = ()  # stages inlined into their readers, in the order applied
    packs: tuple[PackRef, ...] = ()


Symbol = tuple[str, str]  # (group, path); a pack factor is ("pack:" + buffer, "")
Sizes = dict[Symbol, int]


def pack_symbol(buffer: str) -> Symbol:
    return ("pack:" + buffer, "")


def split_path(parent: str, index: int, ways: int) -> str:
    step = f"{index}/{ways}"
    return step if parent == "" else f"{parent}.{step}"


def parent_path(path: str) -> tuple[str, int, int]:
    """("1/4.0/2") -> ("1/4", 0, 2); the parent of a top-level piece is ""."""
    head, _, last = path.rpartition(".")
    index, ways = last.split("/")
    return head, int(index), int(ways)


def walk(stmts: tuple[Stmt, ...], outer: tuple[PieceLoop, ...] = ()):
    """Pre-order (stmt, enclosing loops) pairs."""
    for s in stmts:
        yield s, outer
        if isinstance(s, PieceLoop):
            yield from walk(s.body, outer + (s,))
        elif isinstance(s, Cached):
            yield from walk(s.body, outer)


def symbols(term: Term) -> set[Symbol]:
    out = {(s.group, s.path) for s, _ in walk(term.body) if isinstance(s, PieceLoop)}
    return out | {pack_symbol(p.buffer) for p in term.packs}


def show(term: Term) -> str:
    """A compact one-line form for messages and tests: `C.i[0/4]{C.j[]{C.update}}`."""

    def stmt(s: Stmt) -> str:
        if isinstance(s, BlockRef):
            return s.name
        if isinstance(s, Cached):
            return f"cached:{s.stage}{{{' ; '.join(stmt(x) for x in s.body)}}}"
        k = "" if s.kind == LoopKind.SERIAL else f"@{s.kind}"
        k += "@rfactor" if isinstance(s, RfactorLoop) else ""
        return f"{s.group}[{s.path}]{k}{{{' ; '.join(stmt(x) for x in s.body)}}}"

    extra = [f"inline:{x}" for x in term.inlined]
    extra += [f"pack:{p.block}:{p.buffer}:{p.dim}" for p in term.packs]
    return " ; ".join([stmt(s) for s in term.body] + extra)


# Size constraints that a loop kind puts on its piece's extent (legal for the backend at any
# extent, but the space only holds the useful ones: whole vectors, short unrolls).
MAX_UNROLL_EXTENT = 16


def partials_constraint(limit: int) -> str:
    """The constraint an rfactor loop puts on its piece, beside its kind's: at most `limit`
    iterations, each a copy of the stage's output (`facts.partials_limit`)."""
    return f"partials:{limit}"


def vector_lanes(register_lanes: int) -> tuple[int, ...]:
    """The extents a vector piece may have on a target whose vector register holds
    `register_lanes` float32 lanes: half a register (for a narrow extent) up to four registers
    (LLVM splits a wide vector into registers, so a longer vector loop is a register tile along
    it). A 512-bit register gives 8..64, a 256-bit one 4..32."""
    if register_lanes < 2 or register_lanes & (register_lanes - 1):
        raise ValueError(f"register lanes must be a power of two >= 2, got {register_lanes}")
    return (register_lanes // 2, register_lanes, 2 * register_lanes, 4 * register_lanes)


# The lanes of a space built without a target: those of a 512-bit register. Callers that know
# their target pass `vector_lanes(target.vector_lanes)`.
VECTOR_LANES = vector_lanes(16)


# Register tiles that are no power of two: rows of accumulators that fill a register file with
# room for the operands (6 or 7 rows of four 16-lane vectors in 32 registers, 3 of four 8-lane
# ones in 16, 5 of three; 6 rows of two 8-lane vectors, AVX2's 6x16 kernel). Three vectors
# across (12, 24, 48, ...) are the other way to fill a register file. A power-of-two extent
# has no such divisor: conv2d's 64 output channels over rows of 56 (four zmm) had 16
# accumulators (4 rows) or 32 (8 rows, spilled) to choose from, and 6 rows ran 1.3-1.5x faster
# than 4 (docs/ARCHITECTURE.md §17.2).
REGISTER_TILES = (3, 5, 6, 7)


def remainder_tiles(extent: int, lanes: Sequence[int] = VECTOR_LANES) -> tuple[int, ...]:
    """The inner tiles (product of all pieces but the outermost) by which a whole extent may be
    split with a remainder, the outermost piece taking the ceiling, ascending: the padded
    widths (`padded_widths`: vector and cache tiles), and the register tiles that are no power
    of two (`REGISTER_TILES` rows, and but for a power of two three vectors: three times a
    power of two from 12), that
    do not divide it and leave at least two steps (so small extents, whose loops stay whole,
    get none: 3 and 5 are not tiled). 127 gets 3, 5, 6, 7, 12, 24, 48 and 8..128 (8 x 16 covers
    it with one short step), 64 gets 3, 5, 6, 7, 7 gets 3 and 8 (one vector, 7 lanes used)."""
    # Three vectors across, not for a power of two: matmul 1024's first rounds then took
    # 12-row remainder tiles the model overrates (30 GFLOPS measured beside 103 without them).
    triples = {3 << a for a in range(2, extent.bit_length())} if extent & (extent - 1) else set()
    register = {t for t in (*REGISTER_TILES, *triples) if 2 * t < extent and extent % t}
    return tuple(sorted(register | set(padded_widths(extent, lanes))))


def padded_widths(extent: int, lanes: Sequence[int] = VECTOR_LANES) -> tuple[int, ...]:
    """The powers of two from the narrowest vector of `lanes` up to the extent's next power of
    two that do not divide it (vector widths, register and cache tiles). The space and the rules
    take the default lanes (a 512-bit register's) on every target, so that the rules know which
    groups to tile: on an AVX2 target a tile of 8 is two vectors. A power of two gets none, and
    so does 3 (smaller tiles only grow the e-graph)."""
    return tuple(t for t in (1 << a for a in range(min(lanes).bit_length() - 1,
                                                   extent.bit_length() + 1))
                 if t < 2 * extent and extent % t)


def pack_factors(extent: int) -> tuple[int, ...]:
    """The panel widths a packed dimension of this extent may take, ascending: its divisors > 1,
    and its `padded_widths`, which pad the last panel (`schedule.Schedule.pack`). A reader's
    panel index `j // f` is affine only when f is a product of j's inner pieces, and a
    remainder split's inner tile may be one of those powers of two: 1000 columns get 16..1024
    beside the divisors 2..1000, a power of two no padded width. (A register tile of 6 rows is
    no panel a vector reads whole.)"""
    return tuple(sorted({f for f in range(2, extent + 1) if extent % f == 0}
                        | set(padded_widths(extent))))


def extent_allowed(kind: str, extent: int, lanes: Sequence[int] = VECTOR_LANES) -> bool:
    if kind == LoopKind.VECTOR:
        return extent in lanes
    if kind == LoopKind.UNROLL:
        return extent <= MAX_UNROLL_EXTENT
    if kind.startswith("partials:"):
        return extent <= int(kind.removeprefix("partials:"))
    return True
