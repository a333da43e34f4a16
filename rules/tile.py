"""Multi-level tiling: a whole loop becomes a chain of pieces of its dimension group.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import String, rewrite

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Body, Kind, loop
from eqsched.egraph.term import split_path

from .analysis import b, levels, tiled
from .base import Rule, register


@register
class Tile(Rule):
    """Split a whole serial loop into n nested pieces (extents are symbols, fixed later).

        loop(C.i, "", serial, b)
          -> loop(C.i, "0/4", serial, loop(C.i, "1/4", ..., loop(C.i, "3/4", serial, b)))

    Only whole loops (path "") are tiled: tiling a piece again would make the e-graph explode
    (docs/ARCHITECTURE.md §17.2). Groups of prime extent are left whole (see
    `rules.analysis.tiled`).
    """

    name = "tile"

    def rewrites(self, facts: Facts) -> list:
        out = []
        for group, extent in sorted(facts.extents.items()):
            if not tiled(extent):
                continue
            ways = levels(facts, group)
            piece = loop(String(group), String(split_path("", ways - 1, ways)), Kind.serial(), b)
            for index in reversed(range(ways - 1)):
                path = split_path("", index, ways)
                piece = loop(String(group), String(path), Kind.serial(),
                             Body.cons(piece, Body.nil()))
            out.append(rewrite(loop(String(group), String(""), Kind.serial(), b)).to(piece))
        return out
