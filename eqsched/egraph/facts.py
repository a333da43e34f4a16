"""Analysis facts of a naive program that rules and the space are built from.

Dimension groups: axes of different stages that iterate together when fused. Axis `a` of reader
R and axis `b` of writer W join one group when R reads W's buffer with index `a` (a plain axis
variable) in the dimension W writes with `b`, and both have the same extent. Init and update of a
stage share the stage's axes. A group is named by its first member in program order ("C.i").

See docs/ARCHITECTURE.md §3 Vocabulary and §4 The e-graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..expr import Var, loads
from ..ir import Block, Program
from ..schedule import MAX_PARTIAL_ELEMENTS


@dataclass
class Facts:
    groups: dict[tuple[str, str], str]  # (block name, axis) -> group
    extents: dict[str, int]  # group -> extent
    blocks: dict[str, Block]  # naive blocks by name, program order
    stage_of: dict[str, str]  # block -> stage
    reduce_groups: dict[str, set[str]] = field(default_factory=dict)  # block -> its reduce groups
    store_inner_group: dict[str, str | None] = field(default_factory=dict)  # unit-stride store dim
    elementwise: set[tuple[str, str, str]] = field(default_factory=set)  # (writer, reader, group)

    def group(self, block: str, axis: str) -> str:
        return self.groups[(block, axis)]

    def groups_of(self, block: str) -> list[str]:
        return [self.groups[(block, a.name)] for a in self.blocks[block].axes]

    def axis_of(self, block: str, group: str) -> str | None:
        for a in self.blocks[block].axes:
            if self.groups[(block, a.name)] == group:
                return a.name
        return None


def facts_of(prog: Program) -> Facts:
    blocks = {b.name: b for b in prog.blocks()}
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(x: tuple[str, str]) -> tuple[str, str]:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    def union(a: tuple[str, str], b: tuple[str, str]) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb, key=order.get)] = min(ra, rb, key=order.get)

    order: dict[tuple[str, str], int] = {}
    for b in blocks.values():
        for a in b.axes:
            order[(b.name, a.name)] = len(order)
    stage_axes: dict[tuple[str, str], tuple[str, str]] = {}
    for b in blocks.values():  # init and update of one stage share their axes
        for a in b.axes:
            first = stage_axes.setdefault((b.stage, a.name), (b.name, a.name))
            union(first, (b.name, a.name))

    writers = {b.buffer: b for b in blocks.values()}  # the last writer: the update of a reduction
    elementwise: set[tuple[str, str, tuple[str, str]]] = set()
    for r in blocks.values():
        r_ext = {a.name: a.extent for a in r.axes}
        for ld in loads(r.value):
            w = writers.get(ld.buffer)
            if w is None or w.stage == r.stage:
                continue
            for ix, wx in zip(ld.indices, w.indices):
                if isinstance(ix, Var) and isinstance(wx, Var):
                    if r_ext[ix.name] == w.axis(wx.name).extent:
                        union((r.name, ix.name), (w.name, wx.name))
                        elementwise.add((w.name, r.name, (w.name, wx.name)))

    def name(key: tuple[str, str]) -> str:
        blk, axis = find(key)
        return f"{blocks[blk].stage}.{axis}"

    groups = {k: name(k) for k in order}
    extents = {groups[(b.name, a.name)]: a.extent for b in blocks.values() for a in b.axes}
    facts = Facts(groups, extents, blocks, {b.name: b.stage for b in blocks.values()})
    for b in blocks.values():
        facts.reduce_groups[b.name] = (
            {groups[(b.name, a.name)] for a in b.axes if a.kind == "reduce"} if b.reduce else set())
        last = b.indices[-1] if b.indices else None
        facts.store_inner_group[b.name] = (
            groups[(b.name, last.name)] if isinstance(last, Var) else None)
    facts.elementwise = {(w, r, groups[key]) for w, r, key in elementwise}
    return facts


def partials_limit(facts: Facts, group: str) -> int:
    """The most partials an rfactor loop over `group` may have: each is a copy of the output
    of a stage reducing over it, and all of them fit MAX_PARTIAL_ELEMENTS (0 when no sum or max
    reduces over the group)."""
    points = [math.prod(a.extent for a in blk.axes if a.kind == "spatial")
              for name, blk in facts.blocks.items()
              if blk.reduce in ("sum", "max") and group in facts.reduce_groups[name]]
    return MAX_PARTIAL_ELEMENTS // max(points) if points else 0
