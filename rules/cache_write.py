"""Local accumulator: a reduction accumulates in a small local tile, written back once.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import String, rewrite

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Body, Kind, cached, loop
from eqsched.egraph.term import split_path

from .analysis import (
    b,
    covers,
    holds,
    lane_group,
    levels,
    only,
    tiled,
    tiles,
    uncached,
    unfactored,
)
from .base import Rule, register


@register
class CacheWrite(Rule):
    """Accumulate stage S in a local tile anchored at S's unit-stride store group (C.j): at its
    second piece "1/4" when tiled (Ansor's SSRSRS puts the accumulator above the first reduce
    level), at the whole loop when not. The anchor's body holds S's update and nothing of another
    stage, has a loop over a spatial group of S, and covers every reduce loop of S (a tile inside
    the reduction would be reset at every step).

        loop(C.j, "1/4", serial, [loop(C.k, "0/2", ..., [C.update])])
          -> loop(C.j, "1/4", serial, [cached(C, [loop(C.k, "0/2", ..., [C.update])])])

    A stage blocked along another axis (`analysis.blocked_groups`, conv2d's Y.k) anchors its tile
    at that group instead: the tile's vector axis is then innermost in the tile.
    One anchor symbol per stage makes two nested tiles of a stage impossible in any program (a
    guard such as "no tile inside" holds for some member of a class, not for all; `uncached`
    only keeps the rule from wrapping its own result again).
    At serial loops only (the parallel and unrolled forms of the loop share its class).
    """

    name = "cache_write"
    requires = ("contains", "only_stage", "nesting", "local_tile", "covers", "unfactored")

    def rewrites(self, facts: Facts) -> list:
        out = []
        for name, blk in sorted(facts.blocks.items()):
            anchor = lane_group(facts, name)
            if blk.reduce is None or anchor is None or anchor in facts.reduce_groups[name]:
                continue
            path = split_path("", 1, levels(facts, anchor)) if tiled(facts.extents[anchor]) else ""
            at = (String(anchor), String(path), Kind.serial())
            stage = String(blk.stage)
            whole = [covers(b, String(group)) for group in sorted(facts.reduce_groups[name])]
            out.append(rewrite(loop(*at, b)).to(
                loop(*at, Body.cons(cached(stage, b), Body.nil())),
                holds(b, String(name)), only(b, stage), tiles(b, stage), uncached(b),
                unfactored(b), *whole))
        return out
