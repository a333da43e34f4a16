"""Fusion of adjacent loops over the same piece: a consumer into its producer's tile (Ansor's
compute_at / reverse_compute_at), or a reduction's init into its update nest.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import String, rewrite

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Body, Kind, Root, append, loop
from eqsched.expr import Var, loads

from .analysis import (
    h,
    holds,
    inlinable,
    p,
    reduce_groups,
    rest,
    spatial,
    t,
    uncached,
    unfactored,
    x,
    y,
)
from .base import Rule, register


def unsafe_groups(facts: Facts) -> set[str]:
    """Groups along which some reader also reads its writer's buffer at another index.

    A group joins reader and writer axes as soon as one read is elementwise (`C[i]`); if the same
    reader also reads `C[n - 1 - i]`, a loop over the group shared by both would make it read a
    point not written yet, so no fusion happens along that group at all."""
    writers = {blk.buffer: blk for blk in facts.blocks.values()}
    unsafe = set()
    for reader in facts.blocks.values():
        mine = set(facts.groups_of(reader.name))
        for ld in loads(reader.value):
            writer = writers.get(ld.buffer)
            if writer is None or writer.stage == reader.stage:
                continue
            for ix, wx in zip(ld.indices, writer.indices):
                if not isinstance(wx, Var):
                    continue
                group = facts.group(writer.name, wx.name)
                axis = facts.axis_of(reader.name, group) if group in mine else None
                if axis is not None and not (isinstance(ix, Var) and ix.name == axis):
                    unsafe.add(group)
    return unsafe


def fusible(facts: Facts) -> set[tuple[str, str, str]]:
    """(first block, second block, group): the second's nest may join the first's loop over the
    group. Producer -> elementwise consumer, and init -> update of one reduction.

    A consumer also pairs with the producer of an inlinable intermediate it reads (a
    convolution's scale-shift inlined into its ReLU: the ReLU then reads the convolution), when
    both reads are elementwise along the group: once the intermediate is inlined no other pair
    joins the two nests. While it is not, its own nest lies between them (they are not adjacent)
    or inside one of them, where it reads a point the first's nest has finished."""
    unsafe = unsafe_groups(facts)
    links = {(w, r, gr) for w, r, gr in facts.elementwise if gr not in unsafe}
    stages = set(inlinable(facts))
    inlinable_blocks = {name for name, blk in facts.blocks.items() if blk.stage in stages}
    out = set(links)
    while True:
        through = {(w, r, gr) for w, mid, gr in out
                   if mid in inlinable_blocks and facts.blocks[w].reduce is not None
                   for mid2, r, gr2 in links if mid2 == mid and gr2 == gr and r != w}
        if through <= out:
            break
        out |= through
    for name, blk in facts.blocks.items():
        if blk.reduce is None:
            continue
        for init, other in facts.blocks.items():
            if other.stage == blk.stage and other.reduce is None:
                out |= {(init, name, gr) for gr in facts.groups_of(init)}
    return out


@register
class Fuse(Rule):
    """Merge two adjacent serial loops over the same piece when the second's blocks read what the
    first's write, elementwise along the group (or hold the update of the first's init).

        cons(loop(C.i, p, serial, x), cons(loop(C.i, p, serial, y), t))
          -> cons(loop(C.i, p, serial, append(x, y)), t)            (and the same at the root)

    Never along a group that an accumulating block in x reduces over: a consumer inside the
    producer's reduction loop would read partial sums. Not when x or y is a local tile (a cached
    statement stays the only child of its loop), nor when x holds an rfactor lane loop (its
    partials are reduced after the root nest, so no reader may join it). `append` evaluates by
    rewrites, so every fused body also exists as a plain cons list.
    """

    name = "fuse"
    requires = ("contains", "spatial", "nesting", "unfactored")

    def rewrites(self, facts: Facts) -> list:
        out = []
        reducing = reduce_groups(facts)
        for first, second, group in sorted(fusible(facts)):
            gr, serial = String(group), Kind.serial()
            guards = (holds(x, String(first)), holds(y, String(second)), uncached(x), uncached(y),
                      unfactored(x))
            guards += (spatial(x, gr),) if group in reducing else ()
            out.append(
                rewrite(Body.cons(loop(gr, p, serial, x), Body.cons(loop(gr, p, serial, y), t)))
                .to(Body.cons(loop(gr, p, serial, append(x, y)), t), *guards))
            at_root = Root.rcons(loop(gr, p, serial, x), Root.rcons(loop(gr, p, serial, y), rest))
            out.append(rewrite(at_root)
                       .to(Root.rcons(loop(gr, p, serial, append(x, y)), rest), *guards))
        return out + [
            rewrite(append(Body.cons(h, t), y)).to(Body.cons(h, append(t, y))),
            rewrite(append(Body.nil(), y)).to(y),
        ]
