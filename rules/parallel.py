"""Parallel outer loops.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import String, rewrite, var

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Body, Kind, Root, loop, rloop

from .analysis import b, g, p, reduce_groups, rest, spatial, uncached, y
from .base import Rule, register

unit, q = var("unit", String), var("q", String)


@register
class Parallel(Rule):
    """Run a root-level loop in parallel when no block under it reduces over its group.

        rcons(loop(C.i, "0/4", serial, b), r) -> rcons(loop(C.i, "0/4", parallel, b), r)

    Matching the root list (its own sort) keeps parallel loops at the root: the annotated loop
    joins the class of the root list, not the class of the loop, which also occurs nested.

    A root loop of extent 1 (a batch of one) would leave nothing to share among threads, and
    `reorder` never moves it (moving it gives the same serial program). So its only child may
    also come up past it to run in parallel:

        rcons(loop(Y.n, "", serial, [loop(Y.p, "0/4", serial, y)]), r)
          -> rcons(loop(Y.p, "0/4", parallel, [loop(Y.n, "", serial, y)]), r)

    Not when y is a local tile: the loop around it stays its anchor, as in `reorder`.

    A parallel loop's only statement, a loop, may run in parallel with it: the threads share
    the nest's steps counted as one (OpenMP's collapse), so 11 steps of six rows and 4 of
    fourteen become 44 to share, not 11 (six for one core, five for the other):

        loop(Y.k, "0/4", parallel, [loop(Y.p, "1/4", serial, y)])
          -> loop(Y.k, "0/4", parallel, [loop(Y.p, "1/4", parallel, y)])

    An rfactor loop (`rules/rfactor.py`) runs in parallel too: each iteration writes partials
    of its own.

        rcons(rloop(S.c, "0/2", serial, b), r) -> rcons(rloop(S.c, "0/2", parallel, b), r)
    """

    name = "parallel"
    requires = ("spatial", "nesting")

    def rewrites(self, facts: Facts) -> list:
        reducing = reduce_groups(facts)
        serial, parallel = Kind.serial(), Kind.parallel()
        units = [group for group, extent in sorted(facts.extents.items()) if extent == 1]
        out = [rewrite(Root.rcons(rloop(g, p, serial, b), rest))
               .to(Root.rcons(rloop(g, p, parallel, b), rest))]
        for group in sorted(facts.extents):
            gr = String(group)
            out.append(rewrite(Root.rcons(loop(gr, p, serial, b), rest))
                       .to(Root.rcons(loop(gr, p, parallel, b), rest),
                           *((spatial(b, gr),) if group in reducing else ())))
            # A parallel loop is only ever at the root or the only statement of another (no
            # rule moves one), so this rewrite of the loop, not of the root list, keeps it so.
            out.append(
                rewrite(loop(g, p, parallel, Body.cons(loop(gr, q, serial, y), Body.nil())))
                .to(loop(g, p, parallel, Body.cons(loop(gr, q, parallel, y), Body.nil())),
                    *((spatial(y, gr),) if group in reducing else ())))
            if facts.extents[group] == 1:
                continue
            for unit_group in units:
                inner = loop(gr, q, serial, y)
                out.append(
                    rewrite(Root.rcons(loop(String(unit_group), p, serial,
                                            Body.cons(inner, Body.nil())), rest))
                    .to(Root.rcons(loop(gr, q, parallel,
                                        Body.cons(loop(String(unit_group), p, serial, y),
                                                  Body.nil())), rest),
                        uncached(y), *((spatial(y, gr),) if group in reducing else ())))
        return out
