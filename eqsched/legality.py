"""Legality: the analysis facts of a loop program and the validator every transformation ends with.

Facts (shared by the manual primitives and the e-graph rules): where each block sits (enclosing
loops, Allocs, program order), each axis's kind, which loop binds which axis with which stride, and
each access as affine functions of the loops (`C[i, j]` with `i = 8*C.i.0 + C.i.1` is
`C[8*C.i.0 + C.i.1, ...]`). From them `check_program` decides whether a program computes what the
computation says; it raises `ScheduleError` naming the first problem it finds.

The dependence rule is stated on loops shared by a writer W and a reader R of a buffer: at each
iteration of the shared loops, R must read only what W wrote in that same iteration (equal
coefficients of every shared loop, and R's residual index range inside W's).

See docs/ARCHITECTURE.md §6 Programs and schedules.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .affine import Affine, AffineError, Ranges, interval_of, to_affine
from .expr import Expr, Load, Select, children, substitute, to_str
from .ir import Alloc, Binding, Block, Loop, LoopKind, Program, Scope, walk

MAX_UNROLL = 64


class ScheduleError(ValueError):
    """A schedule step or a program is illegal; the message names the loop/block/buffer and why."""


@dataclass(frozen=True)
class Access:
    """One load or store of a block, with each index as an affine function of the loops
    (None where an index is not affine)."""

    block: str
    buffer: str
    write: bool
    indices: tuple[Affine | None, ...]
    text: str
    guarded: bool = False  # a load under a Select branch: it may run only for part of the domain
    # Each index's range over the block's own axes (None where not affine): a split that leaves a
    # remainder makes the loops' range overshoot it, and the points past it do not run.
    axis_bounds: tuple[tuple[int, int] | None, ...] = ()


@dataclass(frozen=True)
class Site:
    """Where a block sits in the tree: its enclosing loops and Allocs and its program order."""

    block: Block
    loops: tuple[Loop, ...]  # outermost first
    allocs: tuple[str, ...]
    order: int

    @property
    def loop_names(self) -> tuple[str, ...]:
        return tuple(lp.name for lp in self.loops)

    def ranges(self) -> Ranges:
        return {lp.name: (0, lp.extent - 1) for lp in self.loops}


# ---- facts ------------------------------------------------------------------------------------


def sites(prog: Program) -> dict[str, Site]:
    """Every block by name, in program order."""
    out: dict[str, Site] = {}
    for order, (node, path) in enumerate(walk(prog.body)):
        if isinstance(node, Block):
            loops = tuple(p for p in path if isinstance(p, Loop))
            allocs = tuple(p.buffer for p in path if isinstance(p, Alloc))
            out[node.name] = Site(node, loops, allocs, order)
    return out


def axis_kinds(blk: Block) -> dict[str, str]:
    return {a.name: a.kind for a in blk.axes}


def loop_binding(blk: Block, loop: str) -> tuple[str, int] | None:
    """(axis, stride) that `loop` contributes to in `blk`, or None if the block does not use it."""
    for b in blk.bindings:
        for lp, stride in b.terms:
            if lp == loop:
                return b.axis, stride
    return None


def reduce_loops(blk: Block) -> set[str]:
    """Loops bound to reduce axes of an accumulating block."""
    if blk.reduce is None:
        return set()
    kinds = axis_kinds(blk)
    return {lp for b in blk.bindings if kinds.get(b.axis) == "reduce" for lp, _ in b.terms}


def accumulating_loops(site: Site) -> set[str]:
    """The reduce loops of an accumulating block along which its store stays put: those that
    accumulate into one element. A reduce loop that moves the store (rfactor's partial axis:
    `C_rf[k // 64, i]`) gives each of its iterations an element of its own, as a spatial loop
    does."""
    red = reduce_loops(site.block)
    if not red:
        return red
    store = accesses(site)[0]
    if any(ix is None for ix in store.indices):
        return red
    return {lp for lp in red if not any(ix.coeff(lp) for ix in store.indices)}


def accesses(site: Site) -> list[Access]:
    """The block's store first, then its loads (the accumulator read of a reduction included)."""
    return list(_accesses(site.block, tuple((lp.name, lp.extent) for lp in site.loops)))


@functools.lru_cache(maxsize=4096)
def _accesses(blk: Block, loops: tuple[tuple[str, int], ...]) -> tuple[Access, ...]:
    # Cached: every schedule step re-checks the whole program, and most blocks and their loops
    # are unchanged from the step before (searches realize thousands of programs).
    to_loops = {b.axis: b.expr() for b in blk.bindings}
    ranges = {name: (0, extent - 1) for name, extent in loops}
    axis_ranges = {a.name: (0, a.extent - 1) for a in blk.axes}

    def access(buffer: str, indices: tuple[Expr, ...], write: bool, guarded: bool) -> Access:
        affine = tuple(_affine_or_none(substitute(ix, to_loops), ranges) for ix in indices)
        text = f"{buffer}[{', '.join(to_str(ix) for ix in indices)}]"
        return Access(blk.name, buffer, write, affine, text, guarded,
                      tuple(_interval_or_none(ix, axis_ranges) for ix in indices))

    out = [access(blk.buffer, blk.indices, True, False)]
    if blk.reduce is not None:
        out.append(access(blk.buffer, blk.indices, False, False))
    out += [access(ld.buffer, ld.indices, False, g) for ld, g in _loads(blk.value, False)]
    return tuple(out)


def writers(prog: Program) -> dict[str, list[str]]:
    """Blocks writing each buffer, in program order."""
    out: dict[str, list[str]] = {}
    for blk in prog.blocks():
        out.setdefault(blk.buffer, []).append(blk.name)
    return out


def readers(prog: Program) -> dict[str, list[str]]:
    """Blocks reading each buffer, in program order."""
    out: dict[str, list[str]] = {}
    for blk in prog.blocks():
        for buf in dict.fromkeys(ld.buffer for ld in blk.reads()):
            out.setdefault(buf, []).append(blk.name)
    return out


def address_coeff(access: Access, shape: tuple[int, ...], loop: str) -> int | None:
    """How far the flat (row-major) address moves per step of `loop`; None if not affine."""
    coeff, stride = 0, 1
    for ix, extent in zip(reversed(access.indices), reversed(shape)):
        if ix is None:
            return None
        coeff += ix.coeff(loop) * stride
        stride *= extent
    return coeff


def _affine_or_none(e: Expr, ranges: Ranges) -> Affine | None:
    try:
        return to_affine(e, ranges)
    except AffineError:
        return None


def _interval_or_none(e: Expr, ranges: Ranges) -> tuple[int, int] | None:
    try:
        return interval_of(e, ranges)
    except AffineError:
        return None


def _loads(e: Expr, guarded: bool) -> list[tuple[Load, bool]]:
    if isinstance(e, Select):
        return _loads(e.cond, guarded) + _loads(e.a, True) + _loads(e.b, True)
    out = [(e, guarded)] if isinstance(e, Load) else []
    for k in children(e):
        out += _loads(k, guarded)
    return out


# ---- the validator ----------------------------------------------------------------------------


def check_program(prog: Program) -> None:
    """Raise ScheduleError naming the first reason `prog` may not compute its computation."""
    _check_names(prog)
    where = sites(prog)
    for site in where.values():
        _check_bindings(site)
    for lp, path in ((n, p) for n, p in walk(prog.body) if isinstance(n, Loop)):
        _check_loop_kind(prog, lp, path, where)
    _check_locals(prog, where)
    _check_dependences(prog, where)


def _check_names(prog: Program) -> None:
    seen: set[str] = set()
    for node, _ in walk(prog.body):
        if isinstance(node, (Loop, Block)):
            if node.name in seen:
                raise ScheduleError(f"the name {node.name} is used by two loops/blocks")
            seen.add(node.name)
    names = {b.name for b in prog.buffers}
    allocated: set[str] = set()
    for node, _ in walk(prog.body):
        if isinstance(node, Alloc):
            if node.buffer not in names or prog.buffer(node.buffer).scope != Scope.LOCAL:
                raise ScheduleError(f"alloc of {node.buffer}, which is not a local buffer")
            if node.buffer in allocated:
                raise ScheduleError(f"local buffer {node.buffer} is allocated twice")
            allocated.add(node.buffer)
        elif isinstance(node, Block):
            for buf in [node.buffer] + [ld.buffer for ld in node.reads()]:
                if buf not in names:
                    raise ScheduleError(f"block {node.name} uses unknown buffer {buf}")
            if prog.buffer(node.buffer).scope == Scope.INPUT:
                raise ScheduleError(f"block {node.name} writes input {node.buffer}")


def _check_bindings(site: Site) -> None:
    blk = site.block
    extents = {lp.name: lp.extent for lp in site.loops}
    bound = [b.axis for b in blk.bindings]
    if sorted(bound) != sorted(a.name for a in blk.axes):
        raise ScheduleError(
            f"block {blk.name} binds axes {bound}, not its axes {[a.name for a in blk.axes]}"
        )
    used: set[str] = set()
    for b in blk.bindings:
        for lp, _ in b.terms:
            if lp not in extents:
                raise ScheduleError(
                    f"block {blk.name} binds {b.axis} to {lp}, which is not a loop around it"
                )
            if lp in used:
                raise ScheduleError(f"block {blk.name} binds loop {lp} to more than one axis")
            used.add(lp)
        expected = 1
        # An extent-1 piece shares its stride with the next outer piece: check it first.
        for lp, stride in sorted(b.terms, key=lambda t: (t[1], extents[t[0]])):
            if stride != expected:
                raise ScheduleError(
                    f"block {blk.name}: loop {lp} has stride {stride} in axis {b.axis}, "
                    f"expected {expected} (pieces must form a mixed-radix number)"
                )
            expected *= extents[lp]
        extent = blk.axis(b.axis).extent
        if b.offset != 0 or not (expected == extent or _tight_remainder(b, extents, extent)):
            raise ScheduleError(
                f"block {blk.name}: loops of axis {b.axis} cover "
                f"{b.offset}..{b.offset + expected - 1}, not 0..{extent - 1}"
            )
        if expected > extent:
            _check_remainder_nesting(blk, b, site.loop_names, expected)
    if blk.reduce is not None:
        for lp in site.loop_names:
            if lp not in used:
                raise ScheduleError(
                    f"accumulating block {blk.name} is under loop {lp} that binds none of its axes"
                    " (it would accumulate repeatedly)"
                )


def _tight_remainder(b: Binding, extents: dict[str, int], extent: int) -> bool:
    """Does the axis's outermost piece (largest stride) overshoot the extent by less than one of
    its own steps? Then the points past the extent are skipped (the block's implicit guard) and
    every iteration of that piece but the last is a full tile."""
    if not b.terms:
        return False
    loop, stride = max(b.terms, key=lambda t: (t[1], extents[t[0]]))
    return (extents[loop] - 1) * stride < extent < extents[loop] * stride


def _check_remainder_nesting(blk: Block, b: Binding, nest: tuple[str, ...], covered: int) -> None:
    """A remaindered axis's pieces must nest outer to inner, so that its tail is one iteration of
    each piece in turn and the backend can peel it statically (docs/ARCHITECTURE.md §6)."""
    order = sorted(b.terms, key=lambda t: (-t[1], nest.index(t[0])))
    positions = [nest.index(lp) for lp, _ in order]
    for (outer, _), (inner, _), p, q in zip(order, order[1:], positions, positions[1:]):
        if q < p:
            raise ScheduleError(
                f"block {blk.name}: axis {b.axis} has a remainder (its loops cover "
                f"0..{covered - 1} of {blk.axis(b.axis).extent}), so its pieces must nest outer "
                f"to inner, but {inner} encloses {outer}"
            )


def _check_loop_kind(prog: Program, lp: Loop, path: tuple, where: dict[str, Site]) -> None:
    under = [where[n.name].block for n, _ in walk(lp.body) if isinstance(n, Block)]
    if lp.kind == LoopKind.UNROLL and lp.extent > MAX_UNROLL:
        raise ScheduleError(f"unrolled loop {lp.name} has extent {lp.extent} > {MAX_UNROLL}")
    if lp.kind == LoopKind.PARALLEL:
        # Perfectly nested parallel loops at the root share their steps' product (a collapse).
        if any(not isinstance(outer, Loop) or outer.kind != LoopKind.PARALLEL
               or len(outer.body) != 1 for outer in path):
            raise ScheduleError(f"parallel loop {lp.name} is not at the root of the program "
                                "nor the only statement of a parallel loop there")
        for blk in under:
            bound = loop_binding(blk, lp.name)
            if bound is None:
                raise ScheduleError(
                    f"parallel loop {lp.name} binds no axis of block {blk.name} "
                    "(its threads would race)"
                )
            if lp.name in accumulating_loops(where[blk.name]):
                raise ScheduleError(
                    f"parallel loop {lp.name} binds reduce axis {bound[0]} of block {blk.name}"
                    " (its threads would accumulate into the same elements)"
                )
    if lp.kind == LoopKind.VECTOR:
        for child in lp.body:
            if not isinstance(child, Block):
                inner = getattr(child, "name", getattr(child, "buffer", "?"))
                raise ScheduleError(
                    f"vectorized loop {lp.name} is not innermost: it contains {inner}"
                )
        for blk in under:
            if lp.name in accumulating_loops(where[blk.name]):
                raise ScheduleError(
                    f"vectorized loop {lp.name} is reduce axis "
                    f"{loop_binding(blk, lp.name)[0]} of block {blk.name} (its lanes would "
                    "accumulate into the same element)"
                )
            # Lanes must store distinct elements: a contiguous store, or a scatter (a local
            # tile's write-back to an output whose innermost axis is not the vector axis).
            store = accesses(where[blk.name])[0]
            step = address_coeff(store, prog.buffer(blk.buffer).shape, lp.name)
            if not step:
                raise ScheduleError(
                    f"vectorized loop {lp.name}: block {blk.name} stores {store.text} with stride "
                    f"{'unknown' if step is None else step}: its lanes would not store distinct "
                    "elements"
                )


def _check_locals(prog: Program, where: dict[str, Site]) -> None:
    local = {b.name for b in prog.buffers if b.scope == Scope.LOCAL}
    for site in where.values():
        for acc in accesses(site):
            if acc.buffer in local and acc.buffer not in site.allocs:
                raise ScheduleError(
                    f"block {site.block.name} accesses local {acc.buffer} outside its alloc"
                )


def _check_dependences(prog: Program, where: dict[str, Site]) -> None:
    by_buffer: dict[str, list[tuple[Site, Access]]] = {}
    for site in where.values():
        for acc in accesses(site):
            by_buffer.setdefault(acc.buffer, []).append((site, acc))
    for buf, uses in by_buffer.items():
        writes = [(s, a) for s, a in uses if a.write]
        reads = [(s, a) for s, a in uses if not a.write]
        if prog.buffer(buf).scope == Scope.INPUT:
            continue
        for rs, ra in reads:
            _check_reader(buf, rs, ra, [(s, a) for s, a in writes if s.block.name != rs.block.name])
        _check_reinit(buf, writes)


def _check_reader(buf: str, rs: Site, ra: Access, writes: list[tuple[Site, Access]]) -> None:
    r = rs.block
    if not any(ws.order < rs.order for ws, _ in writes):
        raise ScheduleError(f"block {r.name} reads {buf} before any other block writes it")
    for ws, wa in writes:
        w = ws.block
        shared = _shared_loops(ws, rs)
        if w.stage != r.stage:
            if ws.order > rs.order:
                raise ScheduleError(f"block {r.name} reads {buf} before {w.name} writes it")
            partial = [lp for lp in shared if lp in accumulating_loops(ws)]
            if partial:
                raise ScheduleError(
                    f"block {r.name} reads {buf} inside {w.name}'s reduce loop {partial[0]} "
                    "(a partial result)"
                )
        elif ws.order > rs.order and not shared:
            continue  # the reader takes an earlier writer's value, before this one overwrites it
        _check_same_iteration(buf, ws, wa, rs, ra, shared)


def _shared_loops(a: Site, b: Site) -> list[str]:
    out = []
    for x, y in zip(a.loops, b.loops):
        if x.name != y.name:
            break
        out.append(x.name)
    return out


def _check_same_iteration(buf: str, ws: Site, wa: Access, rs: Site, ra: Access,
                          shared: list[str]) -> None:
    """At each iteration of the shared loops, the reader reads only what the writer wrote in it."""
    w, r = ws.block.name, rs.block.name
    for d, (wi, ri) in enumerate(zip(wa.indices, ra.indices)):
        if wi is None or ri is None:
            if shared:
                raise ScheduleError(
                    f"cannot analyze {r} reading {ra.text} / {w} writing {wa.text} "
                    f"inside shared loops {shared}: index {d} is not affine"
                )
            continue
        for lp in shared:
            if wi.coeff(lp) != ri.coeff(lp):
                raise ScheduleError(
                    f"block {r} reads {ra.text} but {w} writes {wa.text}: dimension {d} moves "
                    f"{ri.coeff(lp)} vs {wi.coeff(lp)} per step of shared loop {lp}, so {r} "
                    "would read another iteration's result"
                )
        if ra.guarded:
            continue
        w_lo, w_hi = _clamped(_residual(wi, shared).bounds(ws.ranges()), wa, d, shared)
        r_lo, r_hi = _clamped(_residual(ri, shared).bounds(rs.ranges()), ra, d, shared)
        if r_lo < w_lo or r_hi > w_hi:
            where = f"per iteration of {shared[-1]}" if shared else "in total"
            raise ScheduleError(
                f"block {r} reads {buf} dimension {d} in [{r_lo}, {r_hi}] {where}, "
                f"but {w} writes only [{w_lo}, {w_hi}]"
            )


def _clamped(bounds: tuple[int, int], acc: Access, dim: int,
             shared: list[str]) -> tuple[int, int]:
    """Bounds over the loops, cut to the range over the block's axes where the shared loops do
    not move the index (then the residual is the whole index): a remainder's points past its
    axis do not run. Where they do, both sides split alike and are compared as they are."""
    whole = acc.axis_bounds[dim] if acc.axis_bounds else None
    index = acc.indices[dim]
    if whole is None or index is None or any(index.coeff(lp) for lp in shared):
        return bounds
    return max(bounds[0], whole[0]), min(bounds[1], whole[1])


def _residual(a: Affine, shared: list[str]) -> Affine:
    return Affine.of({v: c for v, c in a.terms if v not in shared}, a.const)


def _check_reinit(buf: str, writes: list[tuple[Site, Access]]) -> None:
    """A plain writer of an accumulator (init, copy-in) must not sit in the accumulation's reduce
    loops: it would reset the partial result at each step."""
    for us, _ in writes:
        red = accumulating_loops(us)
        if not red:
            continue
        for ws, _ in writes:
            if ws.block.reduce is None and ws.block.stage == us.block.stage:
                inside = [lp for lp in _shared_loops(ws, us) if lp in red]
                if inside:
                    raise ScheduleError(
                        f"block {ws.block.name} is under {inside[0]}, a reduce loop of "
                        f"{us.block.name}: it would reset {buf} at every step"
                    )
