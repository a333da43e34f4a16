"""Features of a concrete loop program, for cost models that learn from measurements.

In the manner of Ansor/TVM's per-store features: every block (one store statement) is described by
its loop nest (trip counts by loop kind, vector lanes, the unrolled register tile, a local
accumulator), by each of its accesses (stride along the innermost loop and along the innermost
loop that stays a loop, bytes touched at every loop level against the cache sizes, reuse
distance), and the blocks are aggregated weighted by their iteration counts. Program-wide terms
add the work (log2 flops), the copies (packing, cache_write copy nests) and the estimated traffic
into each cache level per flop.

    hardware = Hardware.of(machine_model(target), threads=2)   # what the program runs on
    x = features(prog, hardware)       # float64, len(FEATURE_NAMES), finite
    dict(zip(FEATURE_NAMES, x))["unit_stride_share"]

Registers, lanes, cache lines and sizes come from the target's machine model and the parallel
balance from the run's threads, so a program's features describe it on the hardware it was
measured on (the same program has other features on an AVX2 target: twice the registers per
tile, and those run out sooner).

See docs/ARCHITECTURE.md §8 Cost models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from eqsched.affine import Affine
from eqsched.expr import Load, count_flops
from eqsched.ir import Block, Loop, LoopKind, Program, Scope
from eqsched.legality import Site, accesses, sites
from eqsched.machine_model import MachineModel

_DTYPE_BYTES = {"float32": 4}

# Per block, averaged over blocks weighted by their iteration counts.
BLOCK_FEATURES = (
    "log2_serial_trips",  # product of the extents of the block's loops of each kind
    "log2_parallel_trips",
    "log2_unrolled_trips",
    "log2_vector_lanes",
    "innermost_vectorized",
    "vector_lane_fill",  # lanes of the innermost loop / lanes of the registers they occupy
    "log2_register_tile",  # elements of the innermost run of unrolled and vectorized loops
    "log2_tile_registers",  # vector registers that tile needs
    "log2_register_spill",  # how far it exceeds the register file (0 when it fits)
    "log2_innermost_extent",
    "nest_depth",
    "reduction",
    "accumulates_locally",  # the block writes a local buffer (cache_write)
    "log2_local_bytes",
    "flops_per_point",
    "loads_per_point",
    "broadcast_share",  # distinct accesses by stride along the innermost loop: 0 / 1 / other
    "unit_stride_share",
    "gather_share",
    "vector_gather_share",  # gathers under a vectorized innermost loop
    "rolled_broadcast_share",  # the same along the innermost loop not unrolled or vectorized
    "rolled_unit_stride_share",
    "rolled_gather_share",
    "log2_rolled_extent",
    "log2_unrolled_around_loops",  # unrolled loops that copy whole loops (code size)
    "reuse_in_L1_share",  # accesses whose reuse distance (bytes touched between uses) fits
    "reuse_in_L2_share",
    "reuse_in_L3_share",
    "no_reuse_share",
    "log2_reuse_distance",
    "log2_reuse_ratio",  # iterations per distinct byte of the access, over the whole nest
    "parallel_balance",  # useful share of the cores' iterations of the parallel loop
)
PROGRAM_FEATURES = (
    "log2_flops",
    "log2_points",
    "blocks",
    "copy_blocks",  # blocks that only move data: packing and local-tile copies
    "copy_point_share",
    "packed_buffers",
    "local_buffers",
    "parallel_point_share",
    "log2_compulsory_intensity",  # flops per byte of inputs and outputs
    "log2_traffic_L1_per_flop",  # bytes brought into each cache level per flop (estimate)
    "log2_traffic_L2_per_flop",
    "log2_traffic_L3_per_flop",
)
FEATURE_NAMES: tuple[str, ...] = BLOCK_FEATURES + PROGRAM_FEATURES
_CACHE_LEVELS = ("L1d", "L2", "L3")
_ROLLED = (LoopKind.SERIAL, LoopKind.PARALLEL)


@dataclass(frozen=True)
class Hardware:
    """What a program's features are measured against: the target's vector registers, this
    machine's cache lines and L1d/L2/L3 sizes, and the threads the program runs on."""

    vector_bytes: int
    vector_registers: int
    line_bytes: int
    caches: tuple[int, int, int]
    threads: int = 1

    @classmethod
    def of(cls, machine: MachineModel, threads: int = 1) -> Hardware:
        return cls(machine.vector_lanes * 4, machine.vector_registers, machine.line_bytes,
                   tuple(machine.caches[level] for level in _CACHE_LEVELS), threads)


@dataclass(frozen=True)
class _Access:
    """One distinct access: per dimension the (loop depth, |coefficient|, extent) terms, or None
    where the index is not affine."""

    shape: tuple[int, ...]
    elem_bytes: int
    dims: tuple[tuple[tuple[int, int, int], ...] | None, ...]
    indices: tuple[Affine | None, ...]

    def bytes_touched(self, extents: list[int], line: int) -> list[int]:
        """Per loop level (0 = the whole nest ... len(extents) = one iteration), the distinct
        bytes in whole cache lines that one run of the loops from that level inward touches:
        per dimension the distinct index values, the last dimension counted in lines."""
        depth = len(extents)
        if not self.dims:
            return [line] * (depth + 1)
        span = [1] * len(self.dims)  # 1 + sum(|coefficient| * (extent - 1)) of the inner loops
        values = [1] * len(self.dims)  # product of their extents
        by_level: list[list[tuple[int, int, int]]] = [[] for _ in range(depth)]
        for d, terms in enumerate(self.dims):
            for level, coeff, extent in terms or ((lv, 1, e) for lv, e in enumerate(extents)):
                by_level[level].append((d, coeff, extent))
        out = [0] * (depth + 1)
        last = len(self.dims) - 1
        for level in range(depth, -1, -1):
            if level < depth:
                for d, coeff, extent in by_level[level]:
                    span[d] += coeff * (extent - 1)
                    values[d] *= extent
            total = 1
            for d, extent in enumerate(self.shape):
                # A non-affine index may take any value: as many as the inner iterations.
                reach = min(extent, values[d] if self.dims[d] is None else span[d])
                distinct = min(reach, values[d])
                if d == last:
                    lines = -(-reach * self.elem_bytes // line)
                    total *= min(distinct, lines) * line
                else:
                    total *= distinct
            out[level] = total
        return out

    def indexed_by(self, depth: int) -> bool:
        return any(terms is None or any(t[0] == depth for t in terms) for terms in self.dims)

    def step(self, loop: Loop | None) -> int | None:
        """How far the flat address moves per iteration of `loop` (None: not affine)."""
        if loop is None:
            return 0
        step, stride = 0, 1
        for ix, extent in zip(reversed(self.indices), reversed(self.shape)):
            if ix is None:
                return None
            step += ix.coeff(loop.name) * stride
            stride *= extent
        return step


def _distinct_accesses(prog: Program, site: Site) -> list[_Access]:
    depth = {lp.name: n for n, lp in enumerate(site.loops)}
    extent = {lp.name: lp.extent for lp in site.loops}
    seen: set[tuple[str, tuple[Affine | None, ...]]] = set()
    out = []
    for acc in accesses(site):
        key = (acc.buffer, acc.indices)
        if key in seen:  # a reduction's accumulator read is its store
            continue
        seen.add(key)
        buf = prog.buffer(acc.buffer)
        dims = tuple(None if ix is None else
                     tuple((depth[v], abs(c), extent[v]) for v, c in ix.terms if v in depth)
                     for ix in acc.indices)
        out.append(_Access(buf.shape, _DTYPE_BYTES.get(buf.dtype, 4), dims, acc.indices))
    return out


def _stride_shares(accs: list[_Access], loop: Loop | None) -> tuple[float, float, float]:
    """Shares of the accesses that stay put, move by one element, or jump along `loop`."""
    steps = [a.step(loop) for a in accs]
    n = max(len(steps), 1)
    return (sum(s == 0 for s in steps) / n,
            sum(s is not None and abs(s) == 1 for s in steps) / n,
            sum(s is None or abs(s) > 1 for s in steps) / n)


@dataclass(frozen=True)
class _BlockStats:
    points: int
    flops: int
    is_copy: bool
    parallel: bool
    traffic: tuple[float, float, float]
    values: tuple[float, ...]  # in BLOCK_FEATURES order


def _log2(x: float) -> float:
    return math.log2(x) if x > 1 else 0.0


def _block_stats(prog: Program, site: Site, hw: Hardware) -> _BlockStats:
    """The block's BLOCK_FEATURES values and what it adds to the program-wide ones."""
    blk: Block = site.block
    extents = [lp.extent for lp in site.loops]
    points = math.prod(extents)
    flops_per_point = count_flops(blk.value) + (1 if blk.reduce else 0)
    accs = _distinct_accesses(prog, site)
    touched = [a.bytes_touched(extents, hw.line_bytes) for a in accs]
    footprint = [sum(t[level] for t in touched) for level in range(len(extents) + 1)]
    par_extent = math.prod(lp.extent for lp in site.loops if lp.kind == LoopKind.PARALLEL)
    values = (*_nest_values(prog, site, flops_per_point, hw),
              *_stride_values(accs, site.loops),
              *_reuse_values(accs, touched, footprint, extents, points, hw.caches),
              _balance(par_extent, hw.threads))
    is_copy = blk.reduce is None and isinstance(blk.value, Load)
    return _BlockStats(points, points * flops_per_point, is_copy,
                       par_extent > 1, _traffic(footprint, extents, hw.caches), values)


def _vectorized(inner: Loop | None) -> bool:
    return inner is not None and inner.kind == LoopKind.VECTOR


def _nest_values(prog: Program, site: Site, flops_per_point: int,
                 hw: Hardware) -> tuple[float, ...]:
    """log2_serial_trips ... loads_per_point: the loop nest and the statement."""
    blk, loops = site.block, site.loops
    trips = {kind: math.prod(lp.extent for lp in loops if lp.kind == kind) for kind in LoopKind}
    inner: Loop | None = loops[-1] if loops else None
    target = prog.buffer(blk.buffer)
    elem = _DTYPE_BYTES.get(target.dtype, 4)
    local = target.scope == Scope.LOCAL
    return (
        _log2(trips[LoopKind.SERIAL]),
        _log2(trips[LoopKind.PARALLEL]),
        _log2(trips[LoopKind.UNROLL]),
        _log2(trips[LoopKind.VECTOR]),
        *_register_values(loops, elem, hw),
        _log2(inner.extent) if inner else 0.0,
        float(len(loops)),
        float(blk.reduce is not None),
        float(local),
        _log2(target.size * elem) if local else 0.0,
        float(flops_per_point),
        float(len(blk.reads())),
    )


def _register_values(loops: tuple[Loop, ...], elem: int, hw: Hardware) -> tuple[float, ...]:
    """innermost_vectorized ... log2_register_spill: the vector lanes and the register tile (the
    innermost run of unrolled loops, inside the vectorized one if any)."""
    inner: Loop | None = loops[-1] if loops else None
    vectorized = _vectorized(inner)
    lanes = inner.extent if vectorized else 1
    lanes_per_register = hw.vector_bytes // elem
    vector_registers = -(-lanes // lanes_per_register)
    unrolled = 1
    for lp in reversed(loops[:-1] if vectorized else loops):
        if lp.kind != LoopKind.UNROLL:
            break
        unrolled *= lp.extent
    registers = unrolled * vector_registers
    return (
        float(vectorized),
        lanes / (vector_registers * lanes_per_register) if vectorized else 0.0,
        _log2(unrolled * lanes),
        _log2(registers),
        _log2(registers / hw.vector_registers),
    )


def _stride_values(accs: list[_Access], loops: tuple[Loop, ...]) -> tuple[float, ...]:
    """broadcast_share ... log2_unrolled_around_loops: how the accesses move along the innermost
    loop and along the innermost loop that stays a loop."""
    inner: Loop | None = loops[-1] if loops else None
    broadcast, unit, gather = _stride_shares(accs, inner)
    # The innermost loop that stays a loop: what a register tile unrolled inside it streams.
    rolled = next((lp for lp in reversed(loops) if lp.kind in _ROLLED), None)
    unrolled_around_loops = math.prod(
        lp.extent for at, lp in enumerate(loops)
        if lp.kind == LoopKind.UNROLL and any(o.kind in _ROLLED for o in loops[at + 1:]))
    return (
        broadcast,
        unit,
        gather,
        gather if _vectorized(inner) else 0.0,
        *_stride_shares(accs, rolled),
        _log2(rolled.extent) if rolled else 0.0,
        _log2(unrolled_around_loops),
    )


def _reuse_values(accs: list[_Access], touched: list[list[int]], footprint: list[int],
                  extents: list[int], points: int,
                  caches: tuple[int, int, int]) -> tuple[float, ...]:
    """reuse_in_L1_share ... log2_reuse_ratio: per access, the innermost loop that does not move
    it (its reuse) and the bytes the nest touches between two uses, against the caches."""
    depth = len(extents)
    n = max(len(accs), 1)
    reuse_fit = [0.0, 0.0, 0.0]
    no_reuse, distance_log, ratio_log = 0, 0.0, 0.0
    for a, bytes_of in zip(accs, touched):
        reuse_loop = next((lv for lv in reversed(range(depth))
                           if extents[lv] > 1 and not a.indexed_by(lv)), None)
        distance = footprint[0] if reuse_loop is None else footprint[reuse_loop + 1]
        no_reuse += reuse_loop is None
        for c, size in enumerate(caches):
            reuse_fit[c] += reuse_loop is not None and distance <= size
        distance_log += _log2(distance)
        ratio_log += _log2(points * a.elem_bytes / bytes_of[0])
    return (reuse_fit[0] / n, reuse_fit[1] / n, reuse_fit[2] / n,
            no_reuse / n, distance_log / n, ratio_log / n)


def _balance(par_extent: int, threads: int) -> float:
    """parallel_balance: the useful share of the threads' iterations of the parallel loops."""
    return par_extent / (-(-par_extent // threads) * threads) if par_extent > 1 else 0.0


def _traffic(footprint: list[int], extents: list[int],
             caches: tuple[int, int, int]) -> tuple[float, ...]:
    """Bytes brought into each cache level: the footprint of the outermost loop level whose
    footprint fits, times the trips of the loops around it."""
    depth = len(extents)
    traffic = []
    for size in caches:
        level = next(lv for lv in range(depth + 1) if footprint[lv] <= size or lv == depth)
        traffic.append(float(footprint[level] * math.prod(extents[:level])))
    return tuple(traffic)


def features(prog: Program, hardware: Hardware) -> np.ndarray:
    """The program's feature vector on `hardware`, float64, in FEATURE_NAMES order: of what
    each call runs, so without a preparation from constant inputs."""
    prog = prog.per_call
    stage_names = {s.name for s in prog.computation.stages}
    stats = [_block_stats(prog, site, hardware) for site in sites(prog).values()]
    points = sum(s.points for s in stats)
    weights = np.array([s.points for s in stats], dtype=float) / max(points, 1)
    per_block = np.array([s.values for s in stats]).reshape(len(stats), len(BLOCK_FEATURES))
    flops = max(sum(s.flops for s in stats), 1)
    compulsory = sum(b.size * _DTYPE_BYTES.get(b.dtype, 4) for b in prog.buffers
                     if b.scope in (Scope.INPUT, Scope.OUTPUT))
    traffic = [sum(s.traffic[c] for s in stats) for c in range(len(_CACHE_LEVELS))]
    program = (
        _log2(flops),
        _log2(points),
        float(len(stats)),
        float(sum(s.is_copy for s in stats)),
        sum(s.points for s in stats if s.is_copy) / max(points, 1),
        float(sum(b.scope == Scope.GLOBAL and b.name not in stage_names for b in prog.buffers)),
        float(sum(b.scope == Scope.LOCAL for b in prog.buffers)),
        sum(s.points for s in stats if s.parallel) / max(points, 1),
        math.log2(flops / max(compulsory, 1)),
        *(math.log2(max(t, 1.0) / flops) for t in traffic),
    )
    return np.concatenate([weights @ per_block, np.array(program)])


__all__ = ["BLOCK_FEATURES", "FEATURE_NAMES", "PROGRAM_FEATURES", "Hardware", "features"]
