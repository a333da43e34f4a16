"""A transposing pack copy as register-tile transposes.

`Schedule.pack` along a dimension that is not a buffer's innermost (conv2d's `W[k, c, r, s]`
along `k`) copies `W_packed[p0, c, r, s, f] = W[p0 * F + f, c, r, s]`: each output run of `F`
gathers one element from each of `F` source rows. Lowered point by point, that is one scalar
load per element, and `F` rows a power of two apart in flight at once crowd into a few L1 sets.
Copied as tiles, each of `T` contiguous runs of `T` source elements is one vector load, a
transpose in registers (log2 T rounds of interleaving shuffles) makes them `T` runs of the
output, and each is one vector store. OpenBLAS and oneDNN copy their packed panels this way.

The nest is recognized in the exact form `pack` builds (serial loops `P.p0 .. P.pn`, the last
of extent F, one block); anything else (a padded pack, a nest a schedule changed) is lowered
as written.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

from llvmlite import ir

from ..affine import AffineError, to_affine
from ..expr import Load, Var
from ..ir import Block, Loop, LoopKind, Program
from .mathlib import F32

I32 = ir.IntType(32)
I64 = ir.IntType(64)
MIN_TILE = 4


@dataclass(frozen=True)
class TransposingCopy:
    """`dst[p0, outer, rest, f] = src[outer, p0 * F + f, rest]`, the buffers flattened: `outer`
    the source dimensions before the packed one, `rest` those after it."""

    src: str
    dst: str
    panels: int
    factor: int  # F
    outer: int  # product of the source dimensions before the packed one
    rest: int  # product of those after it (contiguous in both buffers)
    tile: int  # T: lanes of one load and one store

    @property
    def source_rows(self) -> int:
        return self.panels * self.factor


def transposing_copy(loop: Loop, prog: Program, register_lanes: int) -> TransposingCopy | None:
    """The copy `loop` runs, when it is a root pack nest that tiles into transposes."""
    loops = [loop]
    while len(loops[-1].body) == 1 and isinstance(loops[-1].body[0], Loop):
        loops.append(loops[-1].body[0])
    inner = loops[-1].body
    if len(loops) < 2 or len(inner) != 1 or not isinstance(inner[0], Block):
        return None
    blk = inner[0]
    if any(lp.kind not in (LoopKind.SERIAL, LoopKind.UNROLL) for lp in loops[1:]) \
            or loop.kind not in (LoopKind.SERIAL, LoopKind.PARALLEL) or blk.reduce is not None \
            or not isinstance(blk.value, Load):
        return None
    names = [lp.name for lp in loops]
    axis_loop = {}
    for bd in blk.bindings:
        if len(bd.terms) != 1 or bd.offset or bd.terms[0][1] != 1:
            return None
        axis_loop[bd.axis] = bd.terms[0][0]
    dst_loops = [axis_loop.get(ix.name) if isinstance(ix, Var) else None for ix in blk.indices]
    if dst_loops != names:
        return None
    src = blk.value
    src_shape = prog.buffer(src.buffer).shape
    if prog.buffer(blk.buffer).shape != tuple(lp.extent for lp in loops) \
            or len(src_shape) != len(loops) - 1:
        return None
    panels, factor = loops[0].extent, loops[-1].extent
    ranges = {a.name: (0, a.extent - 1) for a in blk.axes}
    packed_dims = []
    for d, ix in enumerate(src.indices):
        try:
            aff = to_affine(ix, ranges)
        except AffineError:
            return None
        terms = {axis_loop[v]: c for v, c in aff.terms}
        if aff.const:
            return None
        if terms == {names[0]: factor, names[-1]: 1}:
            packed_dims.append(d)
        elif len(terms) != 1 or next(iter(terms.values())) != 1:
            return None
    if len(packed_dims) != 1:
        return None
    dim = packed_dims[0]
    others = [axis_loop[ix.name] if isinstance(ix, Var) else None
              for d, ix in enumerate(src.indices) if d != dim]
    if others != names[1:-1] or src_shape[dim] != panels * factor:
        return None
    tile = 1 << (min(register_lanes, factor).bit_length() - 1)  # a power of two
    while tile >= MIN_TILE and factor % tile:
        tile //= 2
    rest = prod(src_shape[dim + 1:])
    if tile < MIN_TILE or rest < tile:
        return None
    return TransposingCopy(src.buffer, blk.buffer, panels, factor, prod(src_shape[:dim]), rest,
                           tile)


def emit(b: ir.IRBuilder, fn: ir.Function, copy: TransposingCopy, src: ir.Value, dst: ir.Value,
         panels: tuple[ir.Value, ir.Value]) -> None:
    """The copy of the panels in [lo, hi): whole tiles, then the columns past the last whole
    tile one element at a time."""
    t, f = copy.tile, copy.factor
    whole = copy.rest // t * t

    def src_at(p0: ir.Value, o: ir.Value, row: ir.Value, r: ir.Value) -> ir.Value:
        line = _add(b, _mul(b, o, copy.source_rows), _add(b, _mul(b, p0, f), row))
        return _gep(b, src, _add(b, _mul(b, line, copy.rest), r))

    def dst_at(p0: ir.Value, o: ir.Value, r: ir.Value, col: ir.Value) -> ir.Value:
        run = _add(b, _mul(b, _add(b, _mul(b, p0, copy.outer), o), copy.rest), r)
        return _gep(b, dst, _add(b, _mul(b, run, f), col))

    def panel(p0: ir.Value) -> None:
        def outer(o: ir.Value) -> None:
            def tiles(rb: ir.Value) -> None:
                r0 = _mul(b, rb, t)

                def tile(fb: ir.Value) -> None:
                    f0 = _mul(b, fb, t)
                    rows = [_load(b, src_at(p0, o, _add(b, f0, _c(i)), r0), t) for i in range(t)]
                    for col, vec in enumerate(transposed(b, rows)):
                        store = b.store(vec, dst_at(p0, o, _add(b, r0, _c(col)), f0))
                        store.align = 4
                _for(b, fn, _c(0), _c(f // t), "tile.f", tile)
            _for(b, fn, _c(0), _c(copy.rest // t), "tile.r", tiles)
            if whole < copy.rest:
                def column(r: ir.Value) -> None:
                    def element(ff: ir.Value) -> None:
                        value = b.load(src_at(p0, o, ff, r), typ=F32)
                        value.align = 4
                        b.store(value, dst_at(p0, o, r, ff)).align = 4
                    _for(b, fn, _c(0), _c(f), "tail.f", element)
                _for(b, fn, _c(whole), _c(copy.rest), "tail.r", column)
        _for(b, fn, _c(0), _c(copy.outer), "outer", outer)
    _for(b, fn, panels[0], panels[1], "panel", panel)


def transposes_runs(columns: int, lanes: int) -> bool:
    """Whether a strided store of `lanes`-lane vectors, contiguous along an unrolled loop of
    `columns` steps, is stored as transposed runs (`lower`, and the model's cost of it):
    both powers of two, the columns from `MIN_TILE` to the lanes."""
    return not columns & (columns - 1) and not lanes & (lanes - 1) \
        and MIN_TILE <= columns <= lanes


def transposed(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The columns of a T x T tile given as T row vectors: log2 T rounds, each pairing row i
    with row i + T/2 and interleaving their low halves and their high halves (a perfect
    shuffle of the element's row and column bits; T rounds of it transpose)."""
    t = len(rows)
    half = t // 2
    low = ir.Constant(ir.VectorType(I32, t), [x for i in range(half) for x in (i, t + i)])
    high = ir.Constant(ir.VectorType(I32, t), [x for i in range(half, t) for x in (i, t + i)])
    for _ in range(t.bit_length() - 1):
        rows = [v for i in range(half) for v in (b.shuffle_vector(rows[i], rows[i + half], low),
                                                  b.shuffle_vector(rows[i], rows[i + half], high))]
    return rows


def _for(b: ir.IRBuilder, fn: ir.Function, lo: ir.Value, hi: ir.Value, name: str,
         body: Callable[[ir.Value], None]) -> None:
    pre = b.block
    loop = fn.append_basic_block(f"{name}")
    done = fn.append_basic_block(f"{name}.done")
    b.cbranch(b.icmp_signed("<", lo, hi), loop, done)
    b.position_at_end(loop)
    iv = b.phi(I64, name=name)
    iv.add_incoming(lo, pre)
    body(iv)
    nxt = b.add(iv, _c(1), flags=["nuw", "nsw"])
    iv.add_incoming(nxt, b.block)
    b.cbranch(b.icmp_signed("<", nxt, hi), loop, done)
    b.position_at_end(done)


def _load(b: ir.IRBuilder, ptr: ir.Value, lanes: int) -> ir.Value:
    value = b.load(ptr, typ=ir.VectorType(F32, lanes))
    value.align = 4
    return value


def _gep(b: ir.IRBuilder, base: ir.Value, offset: ir.Value) -> ir.Value:
    return b.gep(base, [offset], inbounds=True, source_etype=F32)


def _c(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


def _add(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.add(x, y, flags=["nsw"])


def _mul(b: ir.IRBuilder, x: ir.Value, k: int) -> ir.Value:
    return x if k == 1 else b.mul(x, _c(k), flags=["nsw"])
