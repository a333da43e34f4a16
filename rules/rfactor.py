"""Reduction factorization (Ansor's rfactor): a piece of a reduce group indexes partial results
of their own, reduced after the nest: the outermost piece as a root loop (partials the threads
share out), or the innermost piece as a vector loop (partials that are the lanes).

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import String, rewrite, var

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Body, Kind, Root, factor_lanes, loop, rloop
from eqsched.egraph.term import split_path

from .analysis import (
    b,
    blocks_only,
    factorable,
    h,
    holds,
    k,
    lane_body,
    levels,
    only,
    p,
    rest,
    t,
    tiled,
    unfactored,
    unread,
    x,
    y,
)
from .base import Rule, register

q = var("q", String)
g2 = var("g2", String)


@register
class Rfactor(Rule):
    """Factor a reduction along its nest's root loop when that loop is over a reduce group of
    the stage (its extent, the number of partials, limited by `facts.partials_limit`):

        rcons(loop(S.c, "0/2", serial, b), r) -> rcons(rloop(S.c, "0/2", serial, b), r)

    b holds the stage's update and nothing of another stage (so the loop's only accumulation is
    the one factored). A root loop of extent 1 (a batch of one row) never moves, so its only
    child may come up past it as the factored loop, as in `parallel`:

        rcons(loop(S.i, "", serial, [loop(S.c, "0/2", serial, y)]), r)
          -> rcons(rloop(S.c, "0/2", serial, [loop(S.i, "", serial, y)]), r)

    The `parallel` rule then runs an rloop's iterations on threads: each writes its own
    partials.

    Or factor it along the innermost piece of a split reduce group, a vector loop whose lanes
    are the partials (its extent limited by the vector lanes and the partials limit):

        rcons(loop(S.i, "", k, x), r) -> rcons(loop(S.i, "", k, factor_lanes(S.update, x)), r)
        factor_lanes(S.update, cons(loop(S.c, "1/2", serial, [E, S.update]), t))
          -> cons(rloop(S.c, "1/2", vector, [E, S.update]), t)

    `factor_lanes` walks down to the loop around the update (other statements stay as they
    are) and makes a new nest beside the plain one: the partials are initialized before the
    root nest and reduced after it, so the nest must not hold a reader of the stage (`unread`);
    the lane loop holds the update and blocks that store along the lanes (`lane_body`). Other
    rules keep a factored nest from gaining what would break it (`unfactored`: fuse, cache_write,
    the root rfactor).
    """

    name = "rfactor"
    requires = ("contains", "only_stage", "unfactored", "unread", "nesting", "lane_body")

    def rewrites(self, facts: Facts) -> list:
        serial = Kind.serial()
        units = [group for group, extent in sorted(facts.extents.items()) if extent == 1]
        out = []
        for block, stage, group in factorable(facts):
            gr, blk, st = String(group), String(block), String(stage)
            out.append(rewrite(Root.rcons(loop(gr, p, serial, b), rest))
                       .to(Root.rcons(rloop(gr, p, serial, b), rest), holds(b, blk), only(b, st),
                           unfactored(b)))
            for unit in units:
                inner = Body.cons(loop(gr, q, serial, y), Body.nil())
                lifted = Body.cons(loop(String(unit), p, serial, y), Body.nil())
                out.append(rewrite(Root.rcons(loop(String(unit), p, serial, inner), rest))
                           .to(Root.rcons(rloop(gr, q, serial, lifted), rest),
                               holds(y, blk), only(y, st), unfactored(y)))
            out += self._lanes(facts, block, stage, group)
        return out

    @staticmethod
    def _lanes(facts: Facts, block: str, stage: str, group: str) -> list:
        """Rewrites that factor `block` along the innermost piece of `group`."""
        if not tiled(facts.extents[group]):
            return []
        ways = levels(facts, group)
        gr, lanes = String(group), String(split_path("", ways - 1, ways))
        blk, st = String(block), String(stage)
        return [
            rewrite(Root.rcons(loop(g2, p, k, x), rest))
            .to(Root.rcons(loop(g2, p, k, factor_lanes(blk, x)), rest),
                holds(x, blk), unread(x, st), unfactored(x)),
            rewrite(factor_lanes(blk, Body.cons(loop(gr, lanes, Kind.serial(), b), t)))
            .to(Body.cons(rloop(gr, lanes, Kind.vector(), b), t),
                blocks_only(b), holds(b, blk), lane_body(b, blk, gr)),
            rewrite(factor_lanes(blk, Body.cons(loop(g2, q, k, y), t)))
            .to(Body.cons(loop(g2, q, k, factor_lanes(blk, y)), t), holds(y, blk)),
            rewrite(factor_lanes(blk, Body.cons(h, y)))
            .to(Body.cons(h, factor_lanes(blk, y)), holds(y, blk)),
        ]
