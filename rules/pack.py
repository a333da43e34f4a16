"""Array packing: an input operand copied into panels along its unit-stride dimension.

See docs/ARCHITECTURE.md §5 Rules.
"""

from __future__ import annotations

from egglog import String, rewrite

from eqsched.egraph.facts import Facts
from eqsched.egraph.lang import Root
from eqsched.expr import Var, loads

from .analysis import h, lane_group
from .base import Rule, register


def packable(facts: Facts) -> list[tuple[str, str, int]]:
    """(block, input buffer, dim): an accumulating block reads an input whose dimension `dim` is
    indexed by the group its vector loops run along: its unit-stride store group (B[k, j] in
    C[i, j] += A[i, k] * B[k, j]) or its blocked group (W[k, c, r, s] for Y[n, k, p, q])."""
    written = {blk.buffer for blk in facts.blocks.values()}
    out = set()
    for name, blk in facts.blocks.items():
        inner = lane_group(facts, name)
        if blk.reduce is None or inner is None:
            continue
        for ld in loads(blk.value):
            if ld.buffer in written:
                continue
            for dim, ix in enumerate(ld.indices):
                if isinstance(ix, Var) and facts.group(name, ix.name) == inner:
                    out.add((name, ld.buffer, dim))
    return sorted(out)


@register
class Pack(Rule):
    """Pack an input operand into panels (the factor is the symbol "pack:" + buffer).

        rcons(last, rnil) -> rcons(last, packed(C.update, B, 1, rnil))
        packed(C.update, B, 1, rnil) -> packed(C.update, B, 1, packed(F.update, E, 1, rnil))

    A pack is a fact about the whole program; its node sits at the end of the root list, the one
    place where it cannot make a cycle (a Root class holding packed(.., itself) would make the
    space infinite) and where it is taken at most once. Several packs chain in sorted order.
    """

    name = "pack"

    def rewrites(self, facts: Facts) -> list:
        packs = [(String(blk), String(buf), dim) for blk, buf, dim in packable(facts)]
        out = [rewrite(Root.rcons(h, Root.rnil())).to(Root.rcons(h, Root.packed(*pk, Root.rnil())))
               for pk in packs]
        for n, first in enumerate(packs):
            out += [rewrite(Root.packed(*first, Root.rnil()))
                    .to(Root.packed(*first, Root.packed(*later, Root.rnil())))
                    for later in packs[n + 1:] if later[1] != first[1]]  # one copy per buffer
        return out
