"""Unrolling of the loops of the register tile.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import rewrite

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Kind, loop

from .analysis import b, g, p, reg_tile
from .base import Rule, register


@register
class Unroll(Rule):
    """Unroll a serial loop whose body is only blocks and vector or unrolled loops.

        loop(C.i, "3/4", serial, [loop(C.j, "3/4", vector, [C.update])])
          -> loop(C.i, "3/4", unroll, [...])

    Its extent must be short (term.MAX_UNROLL_EXTENT).
    """

    name = "unroll"
    requires = ("nesting",)

    def rewrites(self, facts: Facts) -> list:
        return [rewrite(loop(g, p, Kind.serial(), b)).to(loop(g, p, Kind.unroll(), b), reg_tile(b))]
