"""Multi-level tiling: a whole loop becomes a chain of pieces of its dimension group."""

from __future__ import annotations

from math import isqrt

from egglog import String, rewrite

from ..egraph.facts import Facts
from ..egraph.lang import Body, Kind, loop
from ..egraph.term import split_path
from .analysis import b
from .base import Rule, register

SPATIAL_LEVELS = 4  # Ansor's SSRSRS: spatial groups in 4 pieces, reduce groups in 2
REDUCE_LEVELS = 2


def levels(facts: Facts, group: str) -> int:
    """Pieces of a group, decided by its owner: the first reduction that iterates the group
    (where tiling matters most), else the first block that does. conv2d's padding copy Xpad.c
    is the convolution's reduce axis rc: 2 pieces; C.j in C = A@B; D = exp(C); F = D@E is
    spatial for C: 4 pieces, though F reduces over it."""
    users = [name for name in facts.blocks if group in facts.groups_of(name)]
    owner = next((name for name in users if facts.blocks[name].reduce is not None), users[0])
    return REDUCE_LEVELS if group in facts.reduce_groups[owner] else SPATIAL_LEVELS


def tiled(extent: int) -> bool:
    """Only composite extents are tiled: every split of a prime has all pieces but one of extent
    1, the same loop nests as moving the whole loop (duplicates that only grow the e-graph)."""
    return any(extent % d == 0 for d in range(2, isqrt(extent) + 1))


@register
class Tile(Rule):
    """Split a whole serial loop into n nested pieces (extents are symbols, fixed later).

        loop(C.i, "", serial, b)
          -> loop(C.i, "0/4", serial, loop(C.i, "1/4", ..., loop(C.i, "3/4", serial, b)))

    Only whole loops (path "") are tiled: tiling a piece again would make the e-graph explode
    (DESIGN.md). Groups of prime extent are left whole (see `tiled`).
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
