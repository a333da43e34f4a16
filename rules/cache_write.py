"""Local accumulator: a reduction accumulates in a small local tile, written back once."""

from __future__ import annotations

from egglog import String, rewrite

from ..egraph.facts import Facts
from ..egraph.lang import Body, Kind, cached, loop
from .analysis import b, covers, g, holds, only, p, tiles, uncached
from .base import Rule, register


@register
class CacheWrite(Rule):
    """Accumulate stage S in a local tile under a loop whose body holds S's update and nothing
    of another stage, and has a loop over a spatial group of S (the tile is not empty).

        loop(C.j, "1/4", serial, [loop(C.k, "0/2", ..., [C.update])])
          -> loop(C.j, "1/4", serial, [cached(C, [loop(C.k, "0/2", ..., [C.update])])])

    The body covers every reduce loop of S: a tile inside the reduction would be reset at every
    step. At serial loops only (the parallel and unrolled forms of the loop share its class, and
    an unrolled loop stays around the register tile). `uncached` is existential over the body's
    class, so an extraction may still nest two tiles of one stage: the space must take at most
    one cached per stage.
    """

    name = "cache_write"
    requires = ("contains", "only_stage", "nesting", "local_tile", "covers")

    def rewrites(self, facts: Facts) -> list:
        out = []
        for name, blk in sorted(facts.blocks.items()):
            if blk.reduce is None:
                continue
            stage = String(blk.stage)
            whole = [covers(b, String(group)) for group in sorted(facts.reduce_groups[name])]
            out.append(
                rewrite(loop(g, p, Kind.serial(), b))
                .to(loop(g, p, Kind.serial(), Body.cons(cached(stage, b), Body.nil())),
                    holds(b, String(name)), only(b, stage), uncached(b), tiles(b, stage),
                    *whole))
        return out
