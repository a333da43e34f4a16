"""Vectorization of the innermost loop along a unit-stride store.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import String, rewrite

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Kind, loop
from eqsched.egraph.term import split_path

from .analysis import b, blocked_groups, blocks_only, lane_store, levels, tiled, unit_stride
from .base import Rule, register


@register
class Vectorize(Rule):
    """Make the innermost loop a vector loop when every block under it stores unit-stride along
    its group (and none reduces over it).

        loop(C.j, "3/4", serial, [C.update]) -> loop(C.j, "3/4", vector, [C.update])

    Only a whole loop or a group's innermost piece (stride 1 in the axis), and only around blocks
    (so a vector loop is always innermost). The space limits its extent to the target's vector
    lanes (term.vector_lanes).

    A stage whose output's innermost axis cannot hold a vector is blocked along another stored
    axis (`analysis.blocked_groups`): its blocks' loops over that group vectorize too, storing
    contiguously into a local tile, else as a scatter.

        loop(Y.k, "3/4", serial, [Y.update]) -> loop(Y.k, "3/4", vector, [Y.update])
    """

    name = "vectorize"
    requires = ("nesting", "unit_stride", "lane_store")

    def rewrites(self, facts: Facts) -> list:
        out = []
        stored = {gr for gr in facts.store_inner_group.values() if gr is not None}
        blocked = set(blocked_groups(facts).values())
        for group in sorted(stored | blocked):
            ways = levels(facts, group)
            paths = ("", split_path("", ways - 1, ways)) if tiled(facts.extents[group]) else ("",)
            for path in paths:
                gr, pa = String(group), String(path)
                for guard in [unit_stride] * (group in stored) + [lane_store] * (group in blocked):
                    out.append(rewrite(loop(gr, pa, Kind.serial(), b))
                               .to(loop(gr, pa, Kind.vector(), b), blocks_only(b), guard(b, gr)))
        return out
