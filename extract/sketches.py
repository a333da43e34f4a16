"""Blocked sketches: a stage vectorized across its output's rows, built whole for the search.

A stage blocked along another axis (`rules.analysis.blocked_groups`: conv2d's Y[n, k, p, q]
along k) runs fast only as one shape (oneDNN's and TVM's NCHW[x]c convolutions): a local tile
under the blocked group's anchor piece, its init there too, the tile's columns an unrolled
piece of the output's row, the blocked group's innermost piece a register's lanes with an
unrolled piece of vectors beside it, every reduce loop between the anchor and the columns,
the input read along the blocked group packed in panels of a register's lanes.
That is five or six choices made together; a uniform draw has them all rarely (one program of
64 in an exploration of conv2d 56x56 had a vector loop along k at all), and a mutation changes
one at a time, each step alone predicted slower than the rows it starts from. MetaSchedule
writes such sketches as rules; here they are built with the manual primitives from the naive
program, one per register-tile shape, and join the first populations where the space has them.
The stage's other nests stay naive: the vector twins and mutations finish them.

See docs/ARCHITECTURE.md §9 The search.
"""

from __future__ import annotations

from collections.abc import Iterator

from eqsched.egraph.encode import encode, naive_loop_groups
from eqsched.egraph.facts import Facts
from eqsched.egraph.term import MAX_UNROLL_EXTENT, Sizes, Term, remainder_tiles
from eqsched.ir import Program
from eqsched.rules.analysis import blocked_groups, levels, tiled
from eqsched.rules.pack import packable
from eqsched.schedule import Schedule

VECTORS_ACROSS = (1, 2, 4)  # register vectors along the blocked group in one tile


def blocked_sketches(naive: Program, facts: Facts, register_lanes: int
                     ) -> Iterator[tuple[Term, Sizes]]:
    """(term, sizes) of each blocked stage's tiles: `VECTORS_ACROSS` vectors of
    `register_lanes` along its blocked group times every column count of its row
    (`_column_counts`); the model ranks them (spills included). Tiles the schedule or the
    encoding refuses (`ScheduleError`, `EncodeError`: both `ValueError`s) are skipped: a
    sketch is a head start, and the search runs without it."""
    for stage, group in sorted(blocked_groups(facts).items()):
        update = next((name for name, blk in facts.blocks.items()
                       if blk.stage == stage and blk.reduce is not None), None)
        columns = facts.store_inner_group.get(update) if update else None
        if columns is None or not tiled(facts.extents[columns]):
            continue
        for vecs in VECTORS_ACROSS:
            if facts.extents[group] % (vecs * register_lanes):
                continue
            for cols in _column_counts(facts.extents[columns]):
                try:
                    prog = _tile(naive, facts, update, group, columns, vecs, register_lanes,
                                 cols)
                    yield encode(prog, facts)
                except (ValueError, KeyError):  # KeyError: a loop not named as naive ones are
                    continue


def _column_counts(extent: int) -> list[int]:
    """The row's divisors from 2 (the whole row too: 7 columns of a late ResNet stage) and its
    remainder tiles, up to the unrolling limit."""
    allowed = {d for d in range(2, extent + 1) if extent % d == 0} | set(remainder_tiles(extent))
    return sorted(c for c in allowed if c <= MAX_UNROLL_EXTENT)


def _tile(naive: Program, facts: Facts, update: str, group: str, columns: str, vecs: int,
          lanes: int, cols: int) -> Program:
    """The sketch with these sizes, by the manual primitives (see the module docstring)."""
    blk = facts.blocks[update]
    stage = blk.stage
    groups = naive_loop_groups(naive, facts)
    loops = [f"{stage}.{axis.name}" for axis in blk.axes]
    sch = Schedule(naive)
    pieces: dict[str, list[str]] = {}
    for loop in loops:
        g = groups[loop]
        extent = facts.extents[g]
        ways = levels(facts, g)
        if not tiled(extent):
            pieces[g] = [loop]
            continue
        if g == group:
            factors = [-1] + [1] * (ways - 3) + [vecs, lanes]
        elif g == columns:
            factors = [-1] + [1] * (ways - 2) + [cols]
        else:
            factors = [extent] + [1] * (ways - 1)
        pieces[g] = sch.split(loop, factors)
    reduce = facts.reduce_groups[update]
    spatial = [groups[lp] for lp in loops if groups[lp] not in reduce]
    outer = [pieces[g][0] for g in spatial]
    middle = [p for g in spatial for p in pieces[g][1:-1] if g != group]
    anchor = pieces[group][1]
    inner_reduce = [p for g in (groups[lp] for lp in loops if groups[lp] in reduce)
                    for p in pieces[g]]
    rest = [pieces[g][-1] for g in spatial if g not in (group, columns) and len(pieces[g]) > 1]
    tile = [pieces[columns][-1], *pieces[group][2:]]
    sch.reorder(*outer, *middle, anchor, *inner_reduce, *rest, *tile)
    sch.unroll(pieces[columns][-1])
    if vecs > 1:
        sch.unroll(pieces[group][-2])
    sch.vectorize(pieces[group][-1])
    init = next((name for name, b in facts.blocks.items()
                 if b.stage == stage and b.reduce is None), None)
    if init is not None:
        sch.fuse(init, anchor)
        own = {p for ps in pieces.values() for p in ps}  # the update's loops, around the init
        fill = [lp.name for lp in sch.program.enclosing(init) if lp.name not in own]
        for name in fill[:-1]:
            sch.unroll(name)
        if fill:
            sch.vectorize(fill[-1])
    sch.cache_write(update, at=anchor)
    for reader, buffer, dim in packable(facts):
        if reader == update:
            sch.pack(update, buffer, dim, lanes)
    return sch.program
