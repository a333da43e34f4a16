"""Reduction factorization (Ansor's rfactor): the outermost loop of a reduction's nest, over a
piece of a reduce group, indexes partial results of its own, reduced after the loop.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import String, rewrite, var

from eqsched.egraph.facts import Facts, partials_limit
from eqsched.egraph.lang import Body, Kind, Root, loop, rloop

from .analysis import b, holds, only, p, rest, y
from .base import Rule, register

q = var("q", String)

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
    """

    name = "rfactor"
    requires = ("contains", "only_stage")

    def rewrites(self, facts: Facts) -> list:
        serial = Kind.serial()
        units = [group for group, extent in sorted(facts.extents.items()) if extent == 1]
        out = []
        for block, stage, group in factorable(facts):
            gr, blk, st = String(group), String(block), String(stage)
            out.append(rewrite(Root.rcons(loop(gr, p, serial, b), rest))
                       .to(Root.rcons(rloop(gr, p, serial, b), rest), holds(b, blk), only(b, st)))
            for unit in units:
                inner = Body.cons(loop(gr, q, serial, y), Body.nil())
                lifted = Body.cons(loop(String(unit), p, serial, y), Body.nil())
                out.append(rewrite(Root.rcons(loop(String(unit), p, serial, inner), rest))
                           .to(Root.rcons(rloop(gr, q, serial, lifted), rest),
                               holds(y, blk), only(y, st)))
        return out
