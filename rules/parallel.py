"""Parallel outer loops.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import String, rewrite

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Kind, Root, loop

from .analysis import b, p, reduce_groups, rest, spatial
from .base import Rule, register


@register
class Parallel(Rule):
    """Run a root-level loop in parallel when no block under it reduces over its group.

        rcons(loop(C.i, "0/4", serial, b), r) -> rcons(loop(C.i, "0/4", parallel, b), r)

    Matching the root list (its own sort) keeps parallel loops at the root: the annotated loop
    joins the class of the root list, not the class of the loop, which also occurs nested.
    """

    name = "parallel"
    requires = ("spatial",)

    def rewrites(self, facts: Facts) -> list:
        reducing = reduce_groups(facts)
        out = []
        for group in sorted(facts.extents):
            gr = String(group)
            guards = (spatial(b, gr),) if group in reducing else ()
            out.append(rewrite(Root.rcons(loop(gr, p, Kind.serial(), b), rest))
                       .to(Root.rcons(loop(gr, p, Kind.parallel(), b), rest), *guards))
        return out
