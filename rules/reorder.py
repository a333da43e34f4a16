"""Loop interchange in a perfect nest.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import String, ne, relation, rewrite, rule, var

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Body, Kind, loop

from .analysis import g, p, uncached, y
from .base import Rule, register

g2, p2 = var("g2", String), var("p2", String)
movable = relation("movable", String)  # groups of extent > 1 (a loop of extent 1 stays put)


@register
class Reorder(Rule):
    """Swap a serial loop with its only child, a serial loop over another group.

        loop(C.i, p, serial, [loop(C.k, q, serial, y)])
          -> loop(C.k, q, serial, [loop(C.i, p, serial, y)])

    Pieces of one group never pass each other (they keep their outer -> inner order, which bounds
    the classes of a nest). Annotated loops do not move: a vector loop stays innermost, a
    parallel one at the root; unrolling is decided after the order (both forms share a class).
    Loops of extent 1 stay where they are: moving them gives the same program. The loop around a
    local tile stays its anchor (nothing moves in between).
    """

    name = "reorder"
    requires = ("nesting",)

    def rewrites(self, facts: Facts) -> list:
        serial = Kind.serial()
        groups = [movable(String(group)) for group, extent in sorted(facts.extents.items())
                  if extent > 1]
        return [rule().then(*groups)] * bool(groups) + [
            rewrite(loop(g, p, serial, Body.cons(loop(g2, p2, serial, y), Body.nil())))
            .to(loop(g2, p2, serial, Body.cons(loop(g, p, serial, y), Body.nil())),
                ne(g).to(g2), movable(g), movable(g2), uncached(y)),
        ]
