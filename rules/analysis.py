"""Analysis rules: positive relations over bodies and statements that growth rules use as guards.

egglog queries have no negation, so "no block in this body reduces over g" is built bottom-up as a
positive fact: nil has it for every group, a block has it unless g is one of its reduce groups, a
loop (not a parallel one: `not_parallel`) or cached statement passes up its body's facts, and cons
has it when head and tail do. Facts about the blocks a body holds (`holds`, `spatial`, `only`) are
the same for every member of an e-class (no rewrite adds or drops a block), so guards built on them
are exact. Facts about nesting (`uncached`, `reg_tile`) can differ between members of a class; see
each rule.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from math import isqrt

from egglog import String, eq, ne, relation, rule, var

from eqsched.egraph.facts import Facts, partials_limit
from eqsched.egraph.lang import Body, Kind, Root, SStmt, block, cached, loop
from eqsched.egraph.term import VECTOR_LANES, remainder_tiles
from eqsched.expr import Var, loads

from .base import Rule, register

# Pattern variables shared by the rule modules.
s, h = var("s", SStmt), var("h", SStmt)
b, t, x, y = var("b", Body), var("t", Body), var("x", Body), var("y", Body)
r, rest = var("r", Root), var("rest", Root)
g, p, n, st = var("g", String), var("p", String), var("n", String), var("st", String)
k = var("k", Kind)
a = var("a", String)  # the argument of a relation passed up through loops

s_holds = relation("s_holds", SStmt, String)  # the statement contains block n
holds = relation("holds", Body, String)
s_spatial = relation("s_spatial", SStmt, String)  # no accumulating block inside reduces over g
spatial = relation("spatial", Body, String)
s_only = relation("s_only", SStmt, String)  # every block inside belongs to stage st
only = relation("only", Body, String)
s_uncached = relation("s_uncached", SStmt)  # some member of the class has no cached inside
uncached = relation("uncached", Body)
blocks_only = relation("blocks_only", Body)  # a list of blocks, no loops
reg_tile = relation("reg_tile", Body)  # blocks and vector/unroll loops only
unit_stride = relation("unit_stride", Body, String)  # blocks storing unit-stride along g
lane_store = relation("lane_store", Body, String)  # blocks of a blocked stage storing along g
s_tiles = relation("s_tiles", SStmt, String)  # has a loop over a spatial group of stage st
tiles = relation("tiles", Body, String)
s_covers = relation("s_covers", SStmt, String)  # all pieces of reduce group g are inside
covers = relation("covers", Body, String)
s_lacks = relation("s_lacks", SStmt, String)  # no block of plain stage st inside
lacks = relation("lacks", Body, String)
alone = relation("alone", Root, String)  # one statement of the root list is st's nest alone
s_unfactored = relation("s_unfactored", SStmt)  # no rfactor lane loop inside
unfactored = relation("unfactored", Body)
s_unread = relation("s_unread", SStmt, String)  # no block of another stage reading st inside
unread = relation("unread", Body, String)
lane_body = relation("lane_body", Body, String, String)  # blocks a lane loop over g may hold


# The tiling plan: how many pieces each dimension group is split into. Tile makes them; the
# analyses and the rules that name a piece (vectorize, cache_write, covers) read the same plan.
SPATIAL_LEVELS = 4  # Ansor's SSRSRS: spatial groups in 4 pieces, reduce groups in 2
REDUCE_LEVELS = 2


def levels(facts: Facts, group: str) -> int:
    """Pieces of a group, decided by its owner: the first reduction that iterates the group
    (where tiling matters most), else the first block that does. conv2d's padding copy Xpad.c
    is the convolution's reduce axis rc: 2 pieces; C.j in C = A@B; D = exp(C); F = D@E is
    spatial for C: 4 pieces, though F reduces over it."""
    users = [name for name in facts.blocks if group in facts.groups_of(name)]
    owner = next((name for name in users if facts.blocks[name].reduce is not None), users[0])
    return REDUCE_LEVELS if group in facts.reduce_groups[owner] else SPATIAL_LEVELS


def tiled(extent: int) -> bool:
    """Extents with a split whose pieces are not all but one of extent 1 are tiled: composite
    ones, and those with a remainder tile (`term.remainder_tiles`: 127 as 8 x 16 with a short
    last step). Only 1 and 2 stay whole: their splits are the same nests as moving the loop
    (duplicates that only grow the e-graph)."""
    return bool(remainder_tiles(extent)) or any(extent % d == 0
                                                for d in range(2, isqrt(extent) + 1))


def vectorizable(extent: int) -> bool:
    """A loop of this extent can be a vector loop, whole or as its innermost piece."""
    return any(extent % lanes == 0 for lanes in VECTOR_LANES)


def whole_registers(extent: int) -> bool:
    """An extent that is whole registers of the widest target's (512-bit) lanes."""
    return extent % VECTOR_LANES[1] == 0


# Rows that leave more than one lane in this many empty are worth vectorizing across.
EMPTY_LANE_SHARE = 16


def wastes_lanes(extent: int) -> bool:
    """Rows of this extent, covered by whole registers of the widest target's lanes, leave
    more than one lane in `EMPTY_LANE_SHARE` empty (56 of 64 do; 1000 of 1008 do not): enough
    to vectorize along another axis that fills its registers."""
    padded = -(-extent // VECTOR_LANES[1]) * VECTOR_LANES[1]
    return EMPTY_LANE_SHARE * (padded - extent) > padded


def blocked_groups(facts: Facts) -> dict[str, str]:
    """Stage -> the group its vector loops run along instead of its output's innermost one.

    When a reduction's innermost stored axis cannot hold a vector (conv2d's 7-wide rows in
    Y[n, k, p, q]), its vector loops run along another stored axis (k), as oneDNN's and TVM's
    NCHW[x]c convolutions do: the local tile keeps its loops' order, so there the vector axis is
    innermost and contiguous, and only the tile's write-back to the output (once per tile) is a
    scatter. So too when the innermost axis holds vectors but its rows waste lanes
    (`wastes_lanes`) and another stored axis is whole registers (conv2d's 56-wide rows beside
    64 channels): along the rows, the last vector of each (56 = 3 x 16 + 8) fills half a
    register, and on a core with full-width 512-bit units it costs as much as a whole one.
    The innermost such axis of the update's store is chosen: one per stage, so that
    cache_write keeps one anchor per stage. Stages whose rows are whole registers or waste few
    lanes (matmul 1024 x 1000), or that have no other axis to take, keep their space as it
    is."""
    out = {}
    for name, blk in facts.blocks.items():
        inner = facts.store_inner_group[name]
        holds_vectors = inner is not None and vectorizable(facts.extents[inner])
        if blk.reduce is None or holds_vectors and not wastes_lanes(facts.extents[inner]):
            continue
        fits = whole_registers if holds_vectors else vectorizable
        stored = [facts.group(name, ix.name) for ix in blk.indices if isinstance(ix, Var)]
        across = [g for g in stored if g != inner and g not in facts.reduce_groups[name]
                  and fits(facts.extents[g])]
        if across:
            out[blk.stage] = across[-1]
    return out


def lane_group(facts: Facts, block: str) -> str | None:
    """The group along which a vector loop may run around `block`: its blocked stage's group,
    else its unit-stride store group."""
    return blocked_groups(facts).get(facts.stage_of[block], facts.store_inner_group[block])


def inlinable(facts: Facts) -> list[str]:
    """Plain (non-reduction) stages that other stages read and that store one axis per
    dimension (so a read can substitute its indices for the axes), in program order."""
    read = {ld.buffer for blk in facts.blocks.values() for ld in loads(blk.value)
            if ld.buffer != blk.buffer}
    out = []
    for blk in facts.blocks.values():
        stores = [ix.name for ix in blk.indices if isinstance(ix, Var)]
        if (blk.reduce is None and blk.name == blk.stage and blk.buffer in read
                and len(stores) == len(blk.indices)
                and sorted(stores) == sorted(a.name for a in blk.axes)):
            out.append(blk.stage)
    return out


def reduce_groups(facts: Facts) -> set[str]:
    """Groups some accumulating block reduces over; every other group is spatial everywhere."""
    return set().union(*facts.reduce_groups.values())


def factorable(facts: Facts) -> list[tuple[str, str, str]]:
    """(update block, its stage, reduce group): each group a sum or max reduces over where two
    partials or more fit `schedule.MAX_PARTIAL_ELEMENTS` (`facts.partials_limit`): a row
    statistic, a GEMV's vector; not a matmul's output, whose spatial loops give the threads
    work enough."""
    out = []
    for name, blk in sorted(facts.blocks.items()):
        if blk.reduce in ("sum", "max"):
            out += [(name, blk.stage, group) for group in sorted(facts.reduce_groups[name])
                    if partials_limit(facts, group) >= 2]
    return out


def guarded_stages(facts: Facts) -> list[str]:
    """Stages whose `only` facts a guard reads: reductions (cache_write) and inlinable ones."""
    reductions = {blk.stage for blk in facts.blocks.values() if blk.reduce is not None}
    return sorted(reductions | set(inlinable(facts)))


def eq_(lhs, rhs):
    return eq(lhs).to(rhs)


def not_parallel(kind):
    """Guard of the rules that pass a fact up through a loop: not through a parallel one.

    A parallel loop stands at the root, where its root list's class also holds the serial
    form whose facts the guards read (`alone`, `inline`), or alone in a parallel loop
    (`parallel`'s collapse), a class whose facts only rfactor's root rewrite reads, and only
    three of them (`passes_to_rfactor`). The others, derived there, add rows to every relation
    for each parallel variant and slow saturation without adding a program
    (tests/test_rules.py, docs/ARCHITECTURE.md §17.2)."""
    return ne(kind).to(Kind.parallel())


def passes_to_rfactor(facts: Facts) -> bool:
    """Whether `holds`, `unread` and `unfactored` pass up through parallel loops: where there is
    a reduction to factor, rfactor's root rewrite reads them on a collapsed parallel nest's
    body (factored after the collapse; factored first, the collapse's guard cannot see
    through the factored lanes)."""
    return bool(factorable(facts))


def _pass_up(s_rel, rel, *args, parallel: bool = False) -> list:
    """A loop (a parallel one too if `parallel`) or cached statement has the fact of its body."""
    guards = () if parallel else (not_parallel(k),)
    return [
        rule(eq_(s, loop(g, p, k, b)), rel(b, *args), *guards).then(s_rel(s, *args)),
        rule(eq_(s, cached(st, b)), rel(b, *args)).then(s_rel(s, *args)),
    ]


def _all_of(s_rel, rel, *args) -> list:
    """A body has the fact when all its statements do (nil vacuously)."""
    return [
        rule(eq_(b, Body.nil())).then(rel(b, *args)),
        rule(eq_(b, Body.cons(h, t)), s_rel(h, *args), rel(t, *args)).then(rel(b, *args)),
    ]


@register
class Contains(Rule):
    """holds(body, n): block n is somewhere in body.

        cons(block(n), t) -> holds(n);  loop(.., b) with holds(b, n) -> s_holds(n)
    """

    name = "contains"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        return [
            rule(eq_(s, block(n))).then(s_holds(s, n)),
            rule(eq_(b, Body.cons(h, t)), s_holds(h, n)).then(holds(b, n)),
            rule(eq_(b, Body.cons(h, t)), holds(t, n)).then(holds(b, n)),
        ] + _pass_up(s_holds, holds, a, parallel=passes_to_rfactor(facts))


@register
class Spatial(Rule):
    """spatial(body, g): no accumulating block in body reduces over group g. Derived only for
    groups that some block reduces over (any body is spatial in the others).

        block(C.init) -> s_spatial(C.k);  nil -> spatial(C.k)
    """

    name = "spatial"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        out = []
        for group in sorted(reduce_groups(facts)):
            out += _all_of(s_spatial, spatial, String(group))
            out += [rule(eq_(s, block(name))).then(s_spatial(s, String(group)))
                    for name in facts.blocks if group not in facts.reduce_groups[name]]
        return out + _pass_up(s_spatial, spatial, a)


@register
class OnlyStage(Rule):
    """only(body, S): every block in body belongs to stage S (for the stages of `guarded_stages`).

        block(C.init), block(C.update) -> s_only(C);  nil -> only(S) for every stage S
    """

    name = "only_stage"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        out = []
        stages = guarded_stages(facts)
        for stage in stages:
            out += _all_of(s_only, only, String(stage))
        out += [rule(eq_(s, block(name))).then(s_only(s, String(stage)))
                for name, stage in facts.stage_of.items() if stage in stages]
        return out + _pass_up(s_only, only, a)


@register
class Nesting(Rule):
    """Shapes of bodies: blocks_only (no loops), reg_tile (blocks, vector and unroll loops only),
    uncached (no cached statement inside).

        cons(block(n), nil) -> blocks_only, reg_tile, uncached
        cons(loop(g, p, vector, x), t) with reg_tile(t) -> reg_tile

    uncached and reg_tile are existential over an e-class (a loop's class holds its serial and
    unrolled forms, with and without a local tile): the guards they back keep the space small;
    the space still holds, e.g., an unrolled loop around a serial one, which is legal.
    """

    name = "nesting"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        return [
            rule(eq_(b, Body.nil())).then(blocks_only(b), reg_tile(b), uncached(b)),
            rule(eq_(b, Body.cons(block(n), t)), blocks_only(t)).then(blocks_only(b)),
            rule(eq_(b, Body.cons(block(n), t)), reg_tile(t)).then(reg_tile(b)),
            rule(eq_(b, Body.cons(loop(g, p, Kind.vector(), x), t)), reg_tile(t))
            .then(reg_tile(b)),
            rule(eq_(b, Body.cons(loop(g, p, Kind.unroll(), x), t)), reg_tile(x), reg_tile(t))
            .then(reg_tile(b)),
            rule(eq_(s, block(n))).then(s_uncached(s)),
            rule(eq_(s, loop(g, p, k, x)), uncached(x), not_parallel(k)).then(s_uncached(s)),
            rule(eq_(b, Body.cons(h, t)), s_uncached(h), uncached(t)).then(uncached(b)),
        ]


@register
class UnitStride(Rule):
    """unit_stride(body, g): body is a list of blocks that all store unit-stride along g and do
    not reduce over g (the condition for a vector loop over g around them).

        cons(block(C.update), nil) -> unit_stride(C.j)   (C[i, j] stores with j innermost)
    """

    name = "unit_stride"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        out = []
        groups = {gr for gr in facts.store_inner_group.values() if gr is not None}
        for group in sorted(groups):
            out.append(rule(eq_(b, Body.nil())).then(unit_stride(b, String(group))))
        for name, group in facts.store_inner_group.items():
            if group is not None and group not in facts.reduce_groups[name]:
                out.append(rule(eq_(b, Body.cons(block(name), t)), unit_stride(t, String(group)))
                           .then(unit_stride(b, String(group))))
        return out


@register
class LaneStore(Rule):
    """lane_store(body, g): body is a list of blocks of stages blocked along g (see
    `blocked_groups`) that store along g (each lane its own element) and do not reduce over it.

        cons(block(Y.update), nil) -> lane_store(Y.k)   (Y[n, k, p, q] with k blocked)
    """

    name = "lane_store"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        blocked = blocked_groups(facts)
        out = [rule(eq_(b, Body.nil())).then(lane_store(b, String(group)))
               for group in sorted(set(blocked.values()))]
        for name, blk in facts.blocks.items():
            group = blocked.get(blk.stage)
            stored = {facts.group(name, ix.name) for ix in blk.indices if isinstance(ix, Var)}
            if group in stored and group not in facts.reduce_groups[name]:
                out.append(rule(eq_(b, Body.cons(block(name), t)), lane_store(t, String(group)))
                           .then(lane_store(b, String(group))))
        return out


@register
class LocalTile(Rule):
    """tiles(body, S): body has a loop over a spatial group of stage S (a local tile of S's
    output under the enclosing loop would not be empty).

        loop(C.j, p, k, b) -> s_tiles(C)   (C.j is a spatial group of C.update)
    """

    name = "local_tile"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        out = []
        for name, blk in facts.blocks.items():
            if blk.reduce is None:
                continue
            stage = String(facts.stage_of[name])
            for group in sorted(set(facts.groups_of(name)) - facts.reduce_groups[name]):
                out.append(rule(eq_(s, loop(String(group), p, k, b)), not_parallel(k))
                           .then(s_tiles(s, stage)))
        return out + [
            rule(eq_(b, Body.cons(h, t)), s_tiles(h, st)).then(tiles(b, st)),
            rule(eq_(b, Body.cons(h, t)), tiles(t, st)).then(tiles(b, st)),
        ] + _pass_up(s_tiles, tiles, a)


@register
class Lacks(Rule):
    """lacks(body, D): no block of the inlinable stage D is in body.

        block(C.update) -> s_lacks(D);  nil -> lacks(D)
    """

    name = "lacks"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        out = []
        for stage in inlinable(facts):
            out += _all_of(s_lacks, lacks, String(stage))
            out += [rule(eq_(s, block(name))).then(s_lacks(s, String(stage)))
                    for name in facts.blocks if name != stage]
        return out + _pass_up(s_lacks, lacks, a)


@register
class Alone(Rule):
    """alone(root list, D): a statement of the list holds D's blocks and nothing else.

        rcons(loop(D.i, .., [D]), r) -> alone(D);  rcons(s, r) with alone(r, D) -> alone(D)
    """

    name = "alone"
    growth = False
    requires = ("only_stage",)

    def rewrites(self, facts: Facts) -> list:
        return [
            rule(eq_(r, Root.rcons(h, rest)), s_only(h, st)).then(alone(r, st)),
            rule(eq_(r, Root.rcons(h, rest)), alone(rest, st)).then(alone(r, st)),
        ]


@register
class Unfactored(Rule):
    """unfactored(body): no rfactor lane loop (`rloop` below the root) is in body.

        block(n) -> s_unfactored;  loop(.., b) with unfactored(b) -> s_unfactored

    Exact for every member of a class: the rfactor rule builds a factored nest as a new
    statement beside the plain one (`factor_lanes`), never in the plain nest's classes, so no
    class holds both a factored and an unfactored body.
    """

    name = "unfactored"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        return [rule(eq_(s, block(n))).then(s_unfactored(s))] \
            + _pass_up(s_unfactored, unfactored, parallel=passes_to_rfactor(facts)) \
            + _all_of(s_unfactored, unfactored)


@register
class Unread(Rule):
    """unread(body, S): no block in body reads the buffer of the reduction S, apart from S's own.

        block(E) -> s_unread(S) unless E reads S;  nil -> unread(S)
    """

    name = "unread"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        out = []
        for stage in sorted({blk.stage for blk in facts.blocks.values() if blk.reduce}):
            out += _all_of(s_unread, unread, String(stage))
            out += [rule(eq_(s, block(name))).then(s_unread(s, String(stage)))
                    for name, blk in facts.blocks.items()
                    if blk.stage == stage or stage not in {ld.buffer for ld in loads(blk.value)}]
        return out + _pass_up(s_unread, unread, a, parallel=passes_to_rfactor(facts))


@register
class LaneBody(Rule):
    """lane_body(body, n, g): body is a list of blocks, the reduction n (which reduces over g)
    and blocks that store unit-stride along g: what a vector loop over g may hold once n's
    partials are its lanes (rfactor along lanes).

        cons(block(E), cons(block(S.update), nil)) -> lane_body(S.update, S.c)
    """

    name = "lane_body"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        out = []
        for name, blk in sorted(facts.blocks.items()):
            if blk.reduce not in ("sum", "max"):
                continue
            for group in sorted(facts.reduce_groups[name]):
                key = (String(name), String(group))
                out.append(rule(eq_(b, Body.nil())).then(lane_body(b, *key)))
                members = [name] + [other for other, inner in facts.store_inner_group.items()
                                    if inner == group and group not in facts.reduce_groups[other]]
                out += [rule(eq_(b, Body.cons(block(m), t)), lane_body(t, *key))
                        .then(lane_body(b, *key)) for m in members]
        return out


@register
class Covers(Rule):
    """covers(body, r): every loop over the reduce group r is inside body: it holds the whole
    loop or the outermost piece (the other pieces keep their order, so they are inside that one).
    The same for every member of a class (tiling swaps the whole loop for its outermost piece).

        loop(C.k, "0/2", k, b) -> s_covers(C.k);  cons(h, t) with covers(t, C.k) -> covers(C.k)
    """

    name = "covers"
    growth = False

    def rewrites(self, facts: Facts) -> list:
        out = []
        for group in sorted(reduce_groups(facts)):
            for path in ("", f"0/{levels(facts, group)}"):
                out.append(rule(eq_(s, loop(String(group), String(path), k, b)), not_parallel(k))
                           .then(s_covers(s, String(group))))
        return out + [
            rule(eq_(b, Body.cons(h, t)), s_covers(h, a)).then(covers(b, a)),
            rule(eq_(b, Body.cons(h, t)), covers(t, a)).then(covers(b, a)),
        ] + _pass_up(s_covers, covers, a)
