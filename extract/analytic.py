"""The analytic cost model: predicted seconds of a loop program from a model of one core, whose
hardware numbers all come from a `MachineModel` (eqsched.machine_model: the target's vector width
and registers, measured throughputs, latencies and bandwidths).

    model = AnalyticModel()                      # the host target's calibrated machine model
    model = AnalyticModel(machine_model(Target.parse("host,-avx512f")), threads=2)
    seconds = model.predict([prog_a, prog_b])    # ranks candidates; no measurement needed
    model.breakdown(prog_a)["l2_fill"]           # the named terms behind one prediction

Each block is costed where it sits, then the blocks are summed (a program runs its nests one
after the other). Per block, in cycles of the machine model's reference clock:

    compute  = vector ops x cycles per op        FMA throughput at the op's width (full or half)
    loads    = loads x cycles per load           contiguous vector loads, broadcasts, gathers
                                                 (a scalar load per lane); a vector load not
                                                 known to be aligned crosses a cache line at
                                                 the share of offsets that make it, costed at
                                                 the calibrated split rate
    stores   = stores x cycles per store         contiguous vector stores, scatters (a scalar
                                                 store per lane), or a scatter's transposed
                                                 runs (L/T stores of T lanes, log2 T shuffles)
    issue    = instructions / issue width        loop bookkeeping included; a body too big for
                                                 the L1i issues at LEGACY_DECODE_SHARE of it
    latency  = updates per accumulator * FMA latency, when the accumulator is carried through the
               block's innermost serial loop or chained through unrolled reduction copies (too
               few accumulators stall on FMA latency); RMW_CYCLES per update and register when it
               is updated in memory
    X_fill   = cache lines brought into level X * cycles per line from the level below, at the
               bandwidth one core gets while the nest's threads stream at once
               (l1_fill, l2_fill, dram)
    block    = (sum(term ** 4)) ** (1/4) + spills    a soft maximum: saturated resources overlap

Every operation runs once per iteration of the innermost serial loop it depends on, and once per
unrolled copy it depends on (of an axis split with a remainder, only the steps and copies that
hold points: the backend peels the partial step): that is LLVM's loop-invariant code motion
(an accumulator invariant in the innermost loop is promoted to a register, an invariant load
or exp is hoisted) and CSE across unrolled copies (A[i, k] under an unrolled j is loaded
once), as long as the loads hoisted out of the innermost serial loop fit in HOISTED_SHARE of
the registers; past that they are re-loaded in it, as LLVM does (B[k, j] invariant in i but
unrolled 16 x 4 vectors). An
operation that does not depend on the vectorized loop is scalar (a broadcast, for loads). A
vector access whose lanes are not contiguous is a gather (a load per lane, never hoisted); an
index that is not affine (a packed panel narrower than the vector) costs scalar integer code per
lane. An accumulator in memory whose vector is a tail narrower than a register and not a power
of two (7 of 8 lanes) is loaded and stored at every point, in the power-of-two pieces the
backend accesses it in: LLVM promotes none of them (8 of 16 lanes is a plain ymm). A local tile
whose accesses depend on unrolled and vectorized loops only (of those inside its alloc) lives in
registers, and counts whole toward them. Accumulators kept
in registers (carried through the innermost serial loop, or through unrolled copies of a loop
they do not depend on) spill beyond the register file less one
copy of a streamed operand and every copy across the tile of the shared operand with fewer
(the 3 vectors of B[k, j] under 10 rows; an unshared operand needs none: FMAs read it from
memory), or, when they go through
memory every iteration, less every loaded value CSE keeps live across unrolled copies (B[k, j]
under rows unrolled around unrolled k: one per k copy until the last row).

Cache traffic is the classic reuse model: for each access and level, find the outermost loop
whose body's footprint (distinct lines per buffer, from index strides and extents) fits the
level; the loop just outside it reuses lines between consecutive iterations, loops further out
bring everything again. A working set up to twice a level's share is blended between the two
cases (LRU keeps part of it); a program whose whole footprint fits a level stays warm between
calls. Lines at a power-of-two stride crowd into few L1 and L2 sets (the sets and ways are the
machine's): a panel of 2048 rows 4 KiB apart, 256 B each, fills 64 of 1,024 L2 sets, holds 320
of its rows and comes from the L3 again on every pass (mm_exp_mm's unpacked B: 6 GFLOPS, 35
packed). Lines fetched a part at a time, STRIDED_BYTES or more apart (a column walk), or read in
visits that leave a gap of STRIDED_BYTES or more (an unpacked operand's rows under a register
tile) and either jump on too or stream each row for less than STREAM_BYTES, cost the machine's
measured `strided_fill` times more from the L3 and beyond: no prefetcher follows them, and
each line is a miss at the L3's latency (the L2 serves the same walk at its streamed rate). A
parallel root loop divides its nest among `threads` cores, which share each level's bandwidth
as calibrated.

No hardware number lives here: the constants below are modelling choices (how terms combine,
what LLVM does with our code) and a few fitted costs of code shapes, in reference cycles.

See docs/ARCHITECTURE.md §8 Cost models.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eqsched.affine import AffineError
from eqsched.backend.lower import body_copies, in_pieces, tail_pieces
from eqsched.backend.transpose import TransposingCopy, transposes_runs, transposing_copy
from eqsched.expr import BinOp, Call, Cmp, Const, Expr, Load, Select, Var, free_vars
from eqsched.ir import Alloc, Block, Loop, LoopKind, Node, Program, Scope, parallel_nest, walk
from eqsched.legality import loop_binding
from eqsched.machine_model import MachineModel, machine_model

from .cost import CostModel, register

# Modelling choices, not hardware numbers (those come from the MachineModel):
LOOP_INSTRUCTIONS = 2  # increment, compare-and-branch
GATHER_ALU = 2  # per gathered vector, besides one scalar load per lane
IRREGULAR_INDEX_OPS = 10  # scalar integer ops per lane of an index that is not affine
REGISTER_TILE_ELEMS = 1024  # larger local tiles are not split into registers (LLVM's SROA)
HOISTED_SHARE = 0.5  # of the vector registers: loads hoisted out of the innermost serial loop
INSTRUCTION_BYTES = 5.5  # a vector instruction's average encoding: a body past L1i / this
LEGACY_DECODE_SHARE = 0.625  # runs from the decoders, at this share of the issue width
STRIDED_BYTES = 1024  # jumps of this size per step defeat the prefetchers
STREAM_BYTES = 4096  # ... and so do such visits' pieces streamed for less than this
SOFT_MAX_POWER = 4  # how saturated resources overlap
CACHED_PROFILES = 50_000  # block profiles kept between calls (a search ranks thousands)
# Costs of code shapes the calibration does not measure, in reference cycles: fitted once to
# measured programs (docs/ARCHITECTURE.md §17.4) and small next to the throughput terms.
RMW_CYCLES = 3.0  # a register of an accumulator updated in memory: load, FMA, store
SPILL_CYCLES = (8.0, 4.0)  # per iteration of the innermost loop: once, and per excess
# register and update of it
MAX_DIAGONAL = 4096  # distinct offsets past which an access is taken to share nothing
LOOP_ENTRY_CYCLES = 3.0
PARALLEL_CALL_SECONDS = 5e-6  # the backend's thread pool hands out a parallel loop's chunks
# Per fill term: the level whose capacity holds the working set and the level its lines come
# from, and the share of the level a working set may fill before conflicts and other data evict
# it.
FILLS = {"l1_fill": ("L1d", "L2"), "l2_fill": ("L2", "L3"), "dram": ("L3", "DRAM")}
# Per fill term: which lines count against the level's capacity: those crowded into few sets by
# a power-of-two stride (as the share of ways they fill) in the set-associative L1 and L2, plain
# lines in the L3 (hashed across slices).
FILL_OF = {source: key for key, (_, source) in FILLS.items()}  # "L3" -> "l2_fill"
PRESSURE = {"l1_fill": "l1_pressure", "l2_fill": "l2_pressure", "dram": "lines"}
CACHE_SHARE = {"l1_fill": 0.75, "l2_fill": 0.75, "dram": 0.5}
# ALU ops per evaluation; exp/log/tanh/erf are the backend's straight-line vector math.
OP_COST = {"+": 1, "-": 1, "*": 1, "/": 5, "max": 2, "min": 2}
CALL_COST = {"exp": 30, "log": 38, "tanh": 50, "erf": 20, "sqrt": 6, "abs": 1, "neg": 1}

THROUGHPUT_KEYS = ("compute", "loads", "stores", "issue", "latency", "l1_fill", "l2_fill", "dram")
KEYS = THROUGHPUT_KEYS + ("spills", "loop_overhead", "parallel", "copies", "total")


@dataclass(frozen=True)
class _Access:
    buffer: str
    written: bool
    strides: tuple[tuple[int, int], ...]  # (loop position, flat stride in elements), non-zero
    regular: bool  # affine; otherwise `strides` guesses one line per step of each loop used
    # A vector read in runs (`_runs`): (count, elements from one run's start to the next's);
    # the vector loop's stride 1 then holds within a run only.
    runs: tuple[int, int] | None = None


@dataclass(frozen=True)
class _Footprint:
    """One memory access's lines while loops d.. run (d = 0..n), plainly and as L1 pressure
    (lines crowded into few sets by a power-of-two stride count as the share of ways they
    fill, times the whole cache)."""

    access: _Access
    lines: tuple[float, ...]
    l1_pressure: tuple[float, ...]
    l2_pressure: tuple[float, ...]
    strided: bool  # fetched a part of a line at a time, far apart: no prefetcher follows


@dataclass(frozen=True)
class _Profile:
    """A block's compute-side cycles and its accesses' footprints (depends on its site only)."""

    cycles: dict[str, float]  # compute, loads, stores, issue, latency, spills
    footprints: tuple[_Footprint, ...]


@register
class AnalyticModel(CostModel):
    """Predicts seconds from a model of one core (the module docstring has the formula);
    `machine` gives every hardware number (default: the calibrated host)."""

    name = "analytic"

    def __init__(self, machine: MachineModel | None = None, threads: int = 1):
        if threads < 1:
            raise ValueError(f"threads must be a positive count, got {threads}")
        self.machine = machine or machine_model()
        self.hz = self.machine.hz
        self.peak_gflops = self.machine.peak_gflops
        self.threads = threads
        self._profiles: dict[tuple, _Profile] = {}

    def predict(self, programs: Sequence[Program]) -> np.ndarray:
        return np.array([self.breakdown(p)["total"] for p in programs], dtype=float)

    def breakdown(self, prog: Program) -> dict[str, float]:
        """The named terms of `prog`'s prediction in seconds (`total` is the prediction): of
        what each call runs, so without a preparation from constant inputs."""
        prog = prog.per_call
        out = dict.fromkeys(KEYS, 0.0)
        sites = _sites(prog)
        in_registers = _register_tiles(prog, sites)
        profiles = {name: self._profile(prog, blk, loops, in_registers)
                    for name, (blk, loops) in sites.items()}
        footprints = {kind: _footprints(sites, profiles, kind) for kind in PRESSURE.values()}
        machine = self.machine
        for root in prog.body:
            share = self._share(root)
            parallel = isinstance(root, Loop) and root.kind == LoopKind.PARALLEL
            streaming = self.threads if parallel else 1  # cores sharing the bandwidth
            copy = transposing_copy(root, prog, machine.vector_lanes) \
                if isinstance(root, Loop) else None
            if copy is not None:
                terms = _transpose_terms(copy, machine, streaming)
                for key, cycles in terms.items():
                    out[key] += cycles * share / self.hz
                cycles = _soft_max(list(terms.values()))
                out["copies"] += cycles * share / self.hz
                out["total"] += cycles * share / self.hz
                if parallel:
                    out["parallel"] += PARALLEL_CALL_SECONDS
                continue
            for name in _blocks_under(root):
                loops, profile = sites[name][1], profiles[name]
                terms = dict(profile.cycles)
                for key, (level, source) in FILLS.items():
                    capacity = machine.caches[level] * CACHE_SHARE[key] / machine.line_bytes
                    footprint = footprints[PRESSURE[key]]
                    terms[key] = machine.fill_cycles(source, streaming) * sum(
                        _traffic(fp, loops, footprint, capacity,
                                 machine.strided_fill if source != "L2" else 1.0)
                        for fp in profile.footprints)
                cycles = _soft_max([terms[k] for k in THROUGHPUT_KEYS]) + terms["spills"]
                for key in THROUGHPUT_KEYS + ("spills",):
                    out[key] += terms[key] * share / self.hz
                if isinstance(sites[name][0].value, Load) and sites[name][0].reduce is None:
                    out["copies"] += cycles * share / self.hz
                out["total"] += cycles * share / self.hz
            overhead = _loop_entries(root) * LOOP_ENTRY_CYCLES * share / self.hz
            out["loop_overhead"] += overhead
            out["total"] += overhead
            if parallel:
                out["parallel"] += PARALLEL_CALL_SECONDS
        out["total"] += out["parallel"] + 1e-9  # an empty program still costs a call
        return out

    def _share(self, root: Node) -> float:
        """The fraction of a root nest the busiest core runs: a parallel loop's steps go to
        the threads as they free up, and a step over an axis's remainder has fewer points (56
        columns in two steps of 32: one core runs 32 of them, not half)."""
        if not isinstance(root, Loop) or root.kind != LoopKind.PARALLEL:
            return 1.0
        counts = _step_points(root)
        loads = [0.0] * min(self.threads, sum(counts.values()))
        for weight in sorted(counts, reverse=True):  # heaviest first, each to the least loaded
            rounds, extra = divmod(counts[weight], len(loads))
            loads = [load + weight * (rounds + (n < extra)) for n, load in enumerate(sorted(loads))]
        return max(loads) / sum(weight * n for weight, n in counts.items())

    def _profile(self, prog: Program, blk: Block, loops: tuple[Loop, ...],
                 in_registers: frozenset[str]) -> _Profile:
        used = sorted({blk.buffer} | {ld.buffer for ld in blk.reads()})
        buffers = tuple((name, prog.buffer(name).shape, prog.buffer(name).scope == Scope.LOCAL,
                         name in in_registers) for name in used)
        key = (blk, tuple((lp.name, lp.extent, lp.kind) for lp in loops), buffers)
        if key not in self._profiles:
            if len(self._profiles) >= CACHED_PROFILES:
                self._profiles.clear()
            self._profiles[key] = _BlockCoster(blk, loops, buffers, self.machine).profile()
        return self._profiles[key]


# ---- program structure ----------------------------------------------------------------------


def _sites(prog: Program) -> dict[str, tuple[Block, tuple[Loop, ...]]]:
    """Every block with its enclosing loops, outermost first."""
    out: dict[str, tuple[Block, tuple[Loop, ...]]] = {}

    def visit(nodes: tuple[Node, ...], loops: tuple[Loop, ...]) -> None:
        for n in nodes:
            if isinstance(n, Block):
                out[n.name] = (n, loops)
            else:
                visit(n.body, loops + (n,) if isinstance(n, Loop) else loops)

    visit(prog.body, ())
    return out


def _step_points(root: Loop) -> dict[float, int]:
    """How many steps of `root` (of its parallel nest's steps counted as one) cover each
    number of points of the main block under it (its reduction, else its first block): a step
    past the end of a loop's axis covers fewer (the remainder), or none. Equal steps when no
    block binds a loop of the nest to an axis."""
    nest = parallel_nest(root) or (root,)
    steps = math.prod(lp.extent for lp in nest)
    blocks = [n for n, _ in walk(root.body) if isinstance(n, Block)]
    bound = [blk for blk in blocks if any(loop_binding(blk, lp.name) for lp in nest)]
    if not bound:
        return {1.0: steps}
    blk = next((b for b in bound if b.reduce is not None), bound[0])
    pieces: dict[str, list[tuple[Loop, int]]] = defaultdict(list)  # axis: (loop, stride)
    for lp in nest:
        binding = loop_binding(blk, lp.name)
        if binding is not None:
            pieces[binding[0]].append((lp, binding[1]))
    counts: dict[int, int] = {1: steps // math.prod(lp.extent for ps in pieces.values()
                                                    for lp, _ in ps)}
    for axis, axis_pieces in pieces.items():  # the axes vary independently
        rest = blk.axis(axis).extent - blk.binding(axis).offset
        inside = min(stride for _, stride in axis_pieces)
        covered: dict[int, int] = defaultdict(int)
        for values in itertools.product(*(range(lp.extent) for lp, _ in axis_pieces)):
            left = rest - sum(value * stride for value, (_, stride) in zip(values, axis_pieces))
            covered[max(0, min(inside, left))] += 1
        combined: dict[int, int] = defaultdict(int)
        for (a, m), (c, n) in itertools.product(counts.items(), covered.items()):
            combined[a * c] += m * n
        counts = combined
    if not any(counts):  # no step covers a point
        return {1.0: steps}
    return {float(points): n for points, n in counts.items()}


def _blocks_under(node: Node) -> list[str]:
    if isinstance(node, Block):
        return [node.name]
    return [name for child in node.body for name in _blocks_under(child)]


def _loop_entries(node: Node, runs: int = 1) -> float:
    """How often serial loops (extent > 1) start: each start costs a setup and an exit branch."""
    if isinstance(node, Block):
        return 0.0
    if isinstance(node, Alloc):
        return sum(_loop_entries(c, runs) for c in node.body)
    own = runs if _is_serial(node) else 0
    inner = runs * (node.extent if node.kind != LoopKind.VECTOR else 1)
    return own + sum(_loop_entries(c, inner) for c in node.body)


def _is_serial(lp: Loop) -> bool:
    return lp.kind in (LoopKind.SERIAL, LoopKind.PARALLEL) and lp.extent > 1


def _tail(blk: Block, vec: Loop) -> tuple[float, int] | None:
    """For a vector loop whose last step along its axis runs fewer lanes than it has (56 of
    64, 7 of 8): the share of its steps that are that tail and its lanes; None when no step is
    one."""
    for binding in blk.bindings:
        if (vec.name, 1) not in binding.terms:
            continue
        extent = blk.axis(binding.axis).extent
        steps = -(-extent // vec.extent)
        active = extent - vec.extent * (steps - 1)
        return (1 / steps, active) if active < vec.extent else None
    return None


def _remainders(blk: Block, loops: tuple[Loop, ...], vec: int | None
                ) -> list[tuple[int, list[tuple[int, int]]]]:
    """The block's axes whose pieces reach past their extent (a split with a remainder): per
    axis, the points it has from its offset on and its pieces but the vector loop (whose
    partial step is a tail, costed at its widths), as (loop position, stride), the largest
    stride first."""
    position = {lp.name: d for d, lp in enumerate(loops)}
    out = []
    for binding in blk.bindings:
        rest = blk.axis(binding.axis).extent - binding.offset
        terms = [(position[lp], stride) for lp, stride in binding.terms]
        if sum((loops[d].extent - 1) * stride for d, stride in terms) < rest:
            continue
        pieces = sorted(((d, stride) for d, stride in terms if d != vec),
                        key=lambda piece: -piece[1])
        if pieces:
            out.append((rest, pieces))
    return out


def _steps_holding_points(rest: int, pieces: list[tuple[int, int]]) -> int:
    """How many combinations of the pieces' values (stride, extent; largest stride first)
    hold a point below `rest` once the other pieces of the axis are 0: every value of a piece
    below the one reaching `rest`, with all of the pieces inside it, and that one with those
    inside counted again. Split pieces nest (each spans at most the stride of the one out of
    it); a binding where they do not is counted by enumeration."""
    if rest <= 0:
        return 0
    if not pieces:
        return 1
    (stride, extent), inner = pieces[0], pieces[1:]
    span = sum((e - 1) * s for s, e in inner)
    if span >= stride:
        return sum(1 for values in itertools.product(*(range(e) for _, e in pieces))
                   if sum(v * s for v, (s, _) in zip(values, pieces)) < rest)
    whole = min(extent, rest // stride)
    combos = whole * math.prod(e for _, e in inner)
    if whole < extent:
        combos += _steps_holding_points(rest - whole * stride, inner)
    return combos


def _register_tiles(prog: Program, sites: dict) -> frozenset[str]:
    """Local buffers that live in registers: small, and indexed only by unrolled and vectorized
    loops wherever they are accessed (so every index is a constant after unrolling)."""
    around = {n.buffer: {lp.name for lp in path if isinstance(lp, Loop)}  # its alloc's loops
              for n, path in walk(prog.body) if isinstance(n, Alloc)}
    out = set()
    for buf in prog.buffers:
        if buf.scope != Scope.LOCAL or buf.size > REGISTER_TILE_ELEMS:
            continue
        outside = around.get(buf.name, set())  # each of their steps has a tile of its own
        constant = True
        for blk, loops in sites.values():
            for ld_buffer, indices in [(blk.buffer, blk.indices)] + [
                    (ld.buffer, ld.indices) for ld in blk.reads()]:
                if ld_buffer != buf.name:
                    continue
                axes = {v for ix in indices for v in free_vars(ix)}
                varying = {lp for b in blk.bindings if b.axis in axes for lp, _ in b.terms}
                constant &= all(not _is_serial(lp) for lp in loops
                                if lp.name in varying - outside)
        if constant:
            out.add(buf.name)
    return frozenset(out)


# ---- one block ------------------------------------------------------------------------------


class _BlockCoster:
    """Counts one block's operations where LLVM places them (see the module docstring)."""

    def __init__(self, blk: Block, loops: tuple[Loop, ...], buffers: tuple,
                 machine: MachineModel):
        self.blk, self.loops, self.machine = blk, loops, machine
        self.line_elems = machine.line_bytes // 4  # float32
        self.shape = {name: shape for name, shape, _, _ in buffers}
        self.local = {name for name, _, local, _ in buffers if local}
        self.registers = {name for name, _, _, in_regs in buffers if in_regs}
        position = {lp.name: d for d, lp in enumerate(loops)}
        self.axes = {b.axis: ({position[lp]: c for lp, c in b.terms}, b.offset)
                     for b in blk.bindings}
        vec = [d for d, lp in enumerate(loops) if lp.kind == LoopKind.VECTOR]
        self.vec = vec[0] if vec else None
        self.lanes = loops[self.vec].extent if vec else 1
        # A tail narrower than a register keeps its width: a power of two (8 of 16 lanes) is a
        # plain narrower vector; another (7 of 8, 19 = 16 + 3) computes at the next power of
        # two and is moved in power-of-two pieces. A wider tail of whole half registers runs
        # its pieces as vectors (56: 32, 16, 8), another as a masked vector of whole registers
        # (63: 4 zmm). `tail_widths`: (share of steps, widths computed, widths moved).
        tail = _tail(blk, loops[self.vec]) if vec else None
        self.narrow_tail = None
        self.tail_widths: tuple[float, tuple[int, ...], tuple[int, ...]] | None = None
        if tail is not None:
            share, active = tail
            pieces = tuple(lanes for _, lanes in tail_pieces(active))
            if active < min(self.lanes, machine.vector_lanes):
                self.tail_widths = (share, (1 << (active - 1).bit_length(),), pieces)
                if len(pieces) > 1:
                    self.narrow_tail = (share, pieces)
            elif in_pieces(active, machine.vector_lanes):
                self.tail_widths = (share, pieces, pieces)
        serial = [d for d, lp in enumerate(loops) if _is_serial(lp)]
        self.innermost = serial[-1] if serial else -1
        self.remainders = _remainders(blk, loops, self.vec)
        self.counted: dict[tuple[int, ...], float] = {}  # loops counted -> their steps
        # The backend runs a small straight-line body several times per step of that loop.
        self.copies = body_copies(loops[self.innermost], machine.vector_lanes) \
            if serial else 1
        self.spans: dict[int, tuple[int, int]] = {}  # loop position -> range, when not whole
        self.cycles = dict.fromkeys(("compute", "loads", "stores"), 0.0)
        self.instructions = 0.0
        self.hoisted_registers = 0
        self.operand_registers = 0  # loaded values the unrolled copies keep live together
        # Per operand the copies share: the registers of all its copies across the tile
        self.shared_operands: list[int] = []
        self.store_deps: frozenset[int] = frozenset()  # the loops the stored value depends on
        self.diagonal_registers = 0  # values CSE merges along a diagonal of unrolled copies

    def profile(self) -> _Profile:
        blk = self.blk
        store = self._access(blk.buffer, blk.indices, written=True)
        deps = self._deps(store)
        self.store_deps = deps
        everywhere = frozenset(range(len(self.loops)))
        fused = blk.reduce == "sum" and isinstance(blk.value, BinOp) and blk.value.op == "*"
        if fused:  # one FMA per point: the multiply goes with the accumulation
            self._value(blk.value.a)
            self._value(blk.value.b)
        else:
            self._value(blk.value)
        latency = spills = 0.0
        # A vector store whose lanes are not contiguous is a scatter: a scalar store per lane
        # (and, for an accumulation, a gather before it).
        lane_stride = dict(store.strides).get(self.vec, 0) if self.vec is not None else 0
        scattered = lane_stride not in (0, 1)
        per_lane = {port: self.lanes * self.machine.op_cycles(port, 1) if scattered else 0
                    for port in ("loads", "stores")}
        if blk.reduce is not None:
            self._op("compute", OP_COST["max" if blk.reduce == "max" else "+"], everywhere)
            unrolled_inside = [(d, lp) for d, lp in enumerate(self.loops)
                               if d > self.innermost and lp.kind == LoopKind.UNROLL]
            chains = math.prod(lp.extent for d, lp in unrolled_inside if d in deps)
            # Accumulators stay in registers through the loops they are invariant in: a
            # carried innermost serial loop, or unrolled copies (CSE) inside each iteration.
            live = any(d not in deps for d, _ in unrolled_inside)
            if store.buffer not in self.registers:  # promoted out of the loops it is invariant in
                # ... unless scattered: LICM promotes no gather or scatter, so it runs per point
                placed = everywhere if scattered else deps
                self._op("loads", 1, placed, per_lane["loads"])
                self._op("stores", 1, placed, per_lane["stores"])
                if self.innermost in placed:  # updated in memory, reloaded after its store
                    # per register of the accumulator: a 56-lane row is four round trips
                    latency = self._count(placed) * self._registers(deps) * RMW_CYCLES
                if self.narrow_tail is not None and not scattered \
                        and store.buffer not in self.local:
                    # ... nor a tail narrower than a register that is not a power of two (7
                    # of 8 lanes): the backend accesses it in power-of-two pieces of its exact
                    # width, and LLVM keeps those in memory, loaded and stored at every point
                    # of the tail (8 of 16 lanes is one ymm, promoted like any register).
                    share, pieces = self.narrow_tail
                    for port in ("loads", "stores"):
                        self._op(port, len(pieces) * share, everywhere,
                                 sum(self.machine.op_cycles(port, w) for w in pieces)
                                 / len(pieces))
            carried = self.innermost >= 0 and self.innermost not in deps and not scattered
            if carried:
                latency = self._count(everywhere) / chains * self.machine.fma_latency
                live = True
            elif live and not scattered:  # a chain through the unrolled copies (k.1) instead
                latency = max(latency, self._count(everywhere) / chains * self.machine.fma_latency)
            # Updated in memory each iteration, the operands CSE shares across copies stay live
            # together. Carried accumulators make the body one tree of FMAs into loop phis,
            # which LLVM's scheduler orders copy by copy of the loops they do not depend on
            # (k unrolled: matmul 1024's AVX-512 winner kept 32 shared B vectors without a
            # spill), but within a step it keeps one operand's copies across the tile live,
            # the one with fewer, and streams the other: 10 rows by 3 vectors keep 3 of B and
            # one broadcast of A beside 30 accumulators and spilled on 32 registers, as 15 by
            # 2 and 5 by 6 did; 5 by 5 and 8 by 3 did not.
            # A value one address reaches from several copies (Xpad[p + ry] with p and ry both
            # unrolled) is loaded once and reused along the diagonal: LLVM keeps each of them
            # live across the copies that read it (conv2d's 4 rows x 3 taps read 6 rows of X;
            # with 12 accumulators and 9 taps of W, 26 stack accesses per step on 16 registers).
            operands = (1 + min(self.shared_operands, default=0) + self.diagonal_registers
                        if carried
                        else max(1, self.operand_registers))
            # A local tile in registers keeps all of it live, not only the chains of the
            # innermost loop: rows unrolled around that loop each run their own copy of it
            # while the others wait in registers (7 rows x 8 registers over a 16-register
            # file put every accumulator on the stack). What spills is at most what the
            # innermost loop touches.
            touched = chains * self._registers(deps) + operands
            live_registers = max(touched, self._tile_registers(store.buffer, deps) + operands)
            excess = live_registers - self.machine.vector_registers
            if live and excess > 0:
                # A spilled accumulator makes a round trip through memory at each of its
                # updates in an iteration (rc unrolled 8 inside the taps: 8 of them).
                updates = math.prod(lp.extent for d, lp in unrolled_inside if d not in deps)
                once, each = SPILL_CYCLES
                spills = (once + each * min(excess, touched) * updates) * self._iterations()
        elif store.buffer not in self.registers:
            run = self._transposed_run(store) if scattered else 0
            if run:  # the backend's transposed stores: L/T runs and log2 T shuffle rounds
                pieces = self.lanes // run
                self._op("stores", 1, everywhere,
                         pieces * self.machine.op_cycles("stores", run))
                self._op("compute", 1, everywhere,
                         pieces * math.log2(run) * self.machine.op_cycles("compute", run))
            else:
                self._op("stores", 1, everywhere, per_lane["stores"])
        self.instructions += LOOP_INSTRUCTIONS * self._iterations() / self.copies
        body = self.instructions / max(self._iterations(), 1) * self.copies
        width = self.machine.issue_width
        if body > self.machine.caches["L1i"] / INSTRUCTION_BYTES:
            width *= LEGACY_DECODE_SHARE
        cycles = {**self.cycles, "issue": self.instructions / width, "latency": latency,
                  "spills": spills}
        return _Profile(cycles, self._footprints(store))

    # ---- placement ---------------------------------------------------------------------------

    def _count(self, deps: frozenset[int]) -> float:
        """How often an operation depending on loops `deps` runs: once per iteration of the
        innermost serial loop it depends on, times the unrolled copies it depends on; of an
        axis split with a remainder, only the steps that hold points run (the backend peels
        the partial step and drops copies past the end: 7 rows as 2 x 4 run 7 copies)."""
        inner = max((d for d in deps if _is_serial(self.loops[d])), default=-1)
        counted = tuple(d for d, lp in enumerate(self.loops) if d != self.vec and (
            d <= inner or (d in deps and lp.kind == LoopKind.UNROLL)))
        if counted not in self.counted:
            n = math.prod(self.loops[d].extent for d in counted)
            for rest, pieces in self.remainders:
                mine = [(stride, self.loops[d].extent) for d, stride in pieces if d in counted]
                if mine:
                    n = n // math.prod(e for _, e in mine) * _steps_holding_points(rest, mine)
            self.counted[counted] = float(n)
        return self.counted[counted]

    def _iterations(self) -> float:
        return self._count(frozenset([self.innermost])) if self.innermost >= 0 else 1.0

    def _tile_registers(self, buffer: str, deps: frozenset[int]) -> int:
        """Registers a local tile kept in registers takes whole (0 for any other buffer)."""
        if buffer not in self.registers:
            return 0
        size = math.prod(self.shape[buffer])
        return self.machine.instructions(size) if self._width(deps) > 1 else size

    def _width(self, deps: frozenset[int]) -> int:
        return self.lanes if self.vec is not None and self.vec in deps else 1

    def _registers(self, deps: frozenset[int]) -> int:
        return self.machine.instructions(self._width(deps))

    def _op(self, port: str, ops: float, deps: frozenset[int], cycles_per_op: float = 0) -> None:
        count = self._count(deps) * ops
        width = self._width(deps)
        self.cycles[port] += count * (cycles_per_op or self._op_cycles(port, width))
        self.instructions += count * self._instructions(port, width)

    def _transposed_run(self, store: _Access) -> int:
        """The columns T of a strided vector store the backend stores as transposed runs
        (`lower._FunctionEmitter._transposed_stores`): an unrolled loop of T steps
        (`transposes_runs`), contiguous in the store, among the unrolled loops right around the
        vector loop; 0 when there is none."""
        strides = dict(store.strides)
        for d in range(self.vec - 1, -1, -1):
            lp = self.loops[d]
            if lp.kind != LoopKind.UNROLL:
                break
            if strides.get(d) == 1 and transposes_runs(lp.extent, self.lanes):
                return lp.extent
        return 0

    def _instructions(self, port: str, width: int) -> float:
        """Instructions of one operation `width` lanes wide, on average over the vector loop's
        steps: a tail moved in more pieces than it computes in (7 of 8 lanes: 4, 2 and 1) is
        assembled from its loads, or split for its stores, one insert or extract per extra
        piece."""
        whole = self.machine.instructions(width)
        if port == "compute" or self.tail_widths is None or width != self.lanes:
            return whole
        share, computed, moved = self.tail_widths
        pieces = sum(self.machine.instructions(w) for w in moved) + len(moved) - len(computed)
        return (1 - share) * whole + share * pieces

    def _op_cycles(self, port: str, width: int) -> float:
        """Cycles of one operation `width` lanes wide, on average over the vector loop's steps:
        a tail's steps run at its widths (56 of 64 lanes: two zmm, one zmm and one ymm, which a
        core of half-width units runs in three and a half zmm's time, not four; 8 of 16: one
        ymm)."""
        whole = self.machine.op_cycles(port, width)
        if self.tail_widths is None or width != self.lanes:
            return whole
        share, computed, moved = self.tail_widths
        widths = computed if port == "compute" else moved
        return (1 - share) * whole + share * sum(self.machine.op_cycles(port, w) for w in widths)

    # ---- expressions -------------------------------------------------------------------------

    def _value(self, e: Expr) -> frozenset[int]:
        """Cost the evaluation of `e`; returns the loops it depends on."""
        if isinstance(e, Const):
            return frozenset()
        if isinstance(e, Load):
            return self._load(e)
        if isinstance(e, BinOp):
            deps = self._value(e.a) | self._value(e.b)
            self._op("compute", OP_COST.get(e.op, 1), deps)
            return deps
        if isinstance(e, Call):
            deps = self._value(e.args[0])
            self._op("compute", CALL_COST.get(e.fn, 1), deps)
            return deps
        if isinstance(e, Select):
            deps = self._condition(e.cond) | self._value(e.a) | self._value(e.b)
            self._op("compute", 1, deps)  # the blend
            return deps
        return frozenset()

    def _condition(self, c: Expr) -> frozenset[int]:
        """Each comparison is placed by its own loops: padding's row tests are hoisted out of
        the column loop, only the column tests are per lane."""
        if isinstance(c, Cmp) and c.op == "and":
            deps = self._condition(c.a) | self._condition(c.b)
        else:
            deps = self._index_deps(c)
        self._op("compute", 1, deps)
        return deps

    def _load(self, ld: Load) -> frozenset[int]:
        access = self._access(ld.buffer, ld.indices, written=False)
        deps = self._deps(access)
        if access.buffer in self.registers:
            return deps
        lane_stride = dict(access.strides).get(self.vec, 0) if self.vec is not None else 0
        gather = lane_stride not in (0, 1) or (lane_stride and not access.regular)
        # LICM cannot prove a gather's lanes invariant past the block's stores: it runs per point.
        placed = frozenset(range(len(self.loops))) if gather else deps
        if not access.regular:  # integer code per lane: x86 has no vector i64 division
            count = self._count(placed) * IRREGULAR_INDEX_OPS * self._width(deps)
            self.cycles["compute"] += count * self.machine.op_cycles("compute", 1)
            self.instructions += count
        if gather:  # a scalar load per lane
            self._op("loads", 1, placed, self.lanes * self.machine.op_cycles("loads", 1))
            self._op("compute", GATHER_ALU, placed)
        elif lane_stride and not self._aligned(ld.indices, access):
            # Registers that cross a cache line take the split rate (conv2d's rows at q + s).
            self._op("loads", 1, self._hoisted(deps),
                     self.machine.unaligned_load_cycles(self.lanes))
        else:
            self._op("loads", 1, self._hoisted(deps))
        if not gather:  # a value in registers: count it among those the copies keep live
            copies = self._live_copies(deps)
            self.operand_registers += copies * self._registers(deps)
            if copies:
                self.shared_operands.append(self._tile_copies(deps) * self._registers(deps))
            self.diagonal_registers += self._diagonal(access) * self._registers(deps)
        return deps

    def _diagonal(self, access: _Access) -> int:
        """How many distinct values an access takes over the unrolled copies of its loops (past
        the innermost serial one), when that is fewer than the copies: CSE then merges copies
        whose offsets coincide. 0 when every copy reads its own value, or when the strides are
        a guess (an index that is not affine)."""
        if not access.regular:
            return 0
        offsets, copies = {0}, 1
        for d, stride in access.strides:
            lp = self.loops[d]
            if d > self.innermost and lp.kind == LoopKind.UNROLL and lp.extent > 1:
                copies *= lp.extent
                offsets = {o + stride * i for o in offsets for i in range(lp.extent)}
                if len(offsets) > MAX_DIAGONAL:
                    return 0
        return len(offsets) if len(offsets) < copies else 0

    def _aligned(self, indices: tuple[Expr, ...], access: _Access) -> bool:
        """Whether every register of a contiguous vector access starts on a register boundary:
        its offset and the strides of all other loops are multiples of a register's lanes
        (buffers start on a line: the kernel aligns what it allocates, callers align inputs)."""
        lanes = min(self.lanes, self.machine.vector_lanes)
        if any(c % lanes for d, c in access.strides if d != self.vec):
            return False
        dims = self.shape[access.buffer]
        if self.vec is not None:  # a load in runs (`_runs`): where its first register starts
            self.spans[self.vec] = (0, lanes - 1)
        try:
            offset = sum(self._affine(ix)[1] * math.prod(dims[d + 1:])
                         for d, ix in enumerate(indices))
        finally:
            self.spans.pop(self.vec, None)
        return offset % lanes == 0

    def _live_copies(self, deps: frozenset[int]) -> int:
        """How many copies of a loaded value the straight-line body keeps live at once: CSE
        loads it once per unrolled copy it depends on and reuses it in the copies of an
        unrolled loop it does not depend on; if that loop is outside the copies it depends on
        (rows i.3 around k.1 for B[k, j]), all of those are live until its last copy (48 zmm
        for 12 rows of a 64-wide B under a 4-row tile: LLVM spills them). One when no
        unrolled loop reuses it: then it can be an FMA's memory operand."""
        unrolled = [d for d, lp in enumerate(self.loops)
                    if d > self.innermost and lp.kind == LoopKind.UNROLL and lp.extent > 1]
        reusing = [d for d in unrolled if d not in deps]
        if not reusing:
            return 0
        return math.prod(self.loops[d].extent for d in unrolled if d in deps and d > reusing[0])

    def _tile_copies(self, deps: frozenset[int]) -> int:
        """The copies of a loaded value across the unrolled loops (inside the innermost serial
        one) that the stored value depends on too: B[k, j] per vector of the tile's columns."""
        return math.prod(lp.extent for d, lp in enumerate(self.loops)
                         if d > self.innermost and lp.kind == LoopKind.UNROLL
                         and d in deps and d in self.store_deps)

    def _hoisted(self, deps: frozenset[int]) -> frozenset[int]:
        """Where a value invariant in the innermost serial loop is computed: hoisted out of it
        while the hoisted values fit in registers, else (LLVM re-loads it) in it after all."""
        if self.innermost < 0 or self.innermost in deps:
            return deps
        copies = math.prod(lp.extent for d, lp in enumerate(self.loops)
                           if d > self.innermost and d in deps and lp.kind == LoopKind.UNROLL)
        self.hoisted_registers += copies * self._registers(deps)
        room = self.machine.vector_registers * HOISTED_SHARE
        return deps if self.hoisted_registers <= room else deps | {self.innermost}

    def _access(self, buffer: str, indices: tuple[Expr, ...], written: bool) -> _Access:
        try:
            flat: dict[int, int] | None = self._flat(buffer, indices)[0]
        except AffineError:
            flat = None
        runs = None
        if not written and (flat is None or flat.get(self.vec, 0) not in (0, 1)):
            found = self._runs(buffer, indices)
            if found is not None:
                flat, runs = found
        if flat is None:
            used = self._loops_of(indices)
            return _Access(buffer, written, tuple((d, self.line_elems) for d in sorted(used)),
                           False)
        return _Access(buffer, written, tuple(sorted((d, c) for d, c in flat.items() if c)), True,
                       runs)

    def _flat(self, buffer: str, indices: tuple[Expr, ...]) -> tuple[dict[int, int], int]:
        """The access's flat offset: ({loop position: stride}, constant)."""
        dims = self.shape[buffer]
        flat: dict[int, int] = defaultdict(int)
        const = 0
        for d, ix in enumerate(indices):
            stride = math.prod(dims[d + 1:])
            terms, offset = self._affine(ix)
            const += offset * stride
            for loop, c in terms.items():
                flat[loop] += c * stride
        return flat, const

    def _runs(self, buffer: str, indices: tuple[Expr, ...]
              ) -> tuple[dict[int, int], tuple[int, int]] | None:
        """A vector load the backend reads as contiguous runs of at least a register
        (`Indexer.address` with `chunked`): its strides (the vector loop's 1, within a run)
        and (runs, elements from one run's start to the next's); else None."""
        if self.vec is None:
            return None
        width = self.lanes // 2
        while width >= self.machine.vector_lanes and self.lanes % width == 0:
            try:
                runs = []
                for run in range(self.lanes // width):
                    self.spans[self.vec] = (run * width, run * width + width - 1)
                    runs.append(self._flat(buffer, indices))
            except AffineError:
                runs = []
            finally:
                self.spans.pop(self.vec, None)
            if runs and all(r.get(self.vec, 0) == 1 and r == runs[0][0] for r, _ in runs):
                # lane `run * width` sits at const + run * width (the lane's coefficient is 1)
                step = runs[1][1] - runs[0][1] + width
                return runs[0][0], (len(runs), step)
            width //= 2
        return None

    def _affine(self, e: Expr) -> tuple[dict[int, int], int]:
        """An index over the block's axes as ({loop position: coeff}, const) (what
        `eqsched.affine.to_affine` computes, without rebuilding the expression over loops)."""
        if isinstance(e, Var):
            return self.axes[e.name]
        if isinstance(e, Const):
            return {}, int(e.value)
        if not isinstance(e, BinOp):
            raise AffineError(f"not affine: {e}")
        (a, ac), (b, bc) = self._affine(e.a), self._affine(e.b)
        if e.op in ("+", "-"):
            sign = 1 if e.op == "+" else -1
            out = dict(a)
            for v, c in b.items():
                out[v] = out.get(v, 0) + sign * c
            return out, ac + sign * bc
        if e.op == "*" and (not a or not b):
            (terms, const), k = ((a, ac), bc) if not b else ((b, bc), ac)
            return {v: c * k for v, c in terms.items()}, const * k
        if e.op in ("//", "%") and not b and bc > 0:
            whole = {v: c // bc for v, c in a.items() if c % bc == 0}
            lo = hi = ac
            for v, c in a.items():
                if c % bc:
                    first, last = self.spans.get(v, (0, self.loops[v].extent - 1))
                    lo, hi = lo + min(c * first, c * last), hi + max(c * first, c * last)
            if lo // bc != hi // bc:
                raise AffineError(f"not affine: {e}")
            if e.op == "//":
                return whole, lo // bc
            rest = {v: c - bc * whole.get(v, 0) for v, c in a.items()}
            return rest, ac - bc * (lo // bc)
        raise AffineError(f"not affine: {e}")

    def _loops_of(self, indices: tuple[Expr, ...]) -> set[int]:
        return {d for ix in indices for v in free_vars(ix) for d in self.axes[v][0]}

    def _deps(self, access: _Access) -> frozenset[int]:
        return frozenset(d for d, _ in access.strides if self.loops[d].extent > 1)

    def _index_deps(self, cond: Expr) -> frozenset[int]:
        return frozenset(d for d in self._loops_of((cond,)) if self.loops[d].extent > 1)

    # ---- footprints --------------------------------------------------------------------------

    def _footprints(self, store: _Access) -> tuple[_Footprint, ...]:
        """The footprint of every distinct access to memory (local tiles are not memory)."""
        accesses = {store}
        for ld in _loads(self.blk.value):
            accesses.add(self._access(ld.buffer, ld.indices, written=False))
        return tuple(self._footprint(a) for a in sorted(accesses, key=lambda a: (
            a.buffer, a.written, a.strides)) if a.buffer not in self.local)

    def _footprint(self, access: _Access) -> _Footprint:
        # Only depths where the access gains a loop change its lines.
        lines = [1.0] * (len(self.loops) + 1)
        pressure = [1.0] * (len(self.loops) + 1)
        l2_pressure = [1.0] * (len(self.loops) + 1)
        machine = self.machine
        terms: list[tuple[int, int]] = []
        strides = dict(access.strides)
        for d in range(len(self.loops) - 1, -1, -1):
            if d in strides:
                if d == self.vec and access.runs is not None:  # runs of a register or more
                    count, step = access.runs
                    terms += [(1, self.lanes // count), (abs(step), count)]
                else:
                    terms.append((abs(strides[d]), self.loops[d].extent))
                lines[d], pressure[d] = _lines_touched(terms, self.line_elems,
                                                       machine.l1_sets, machine.l1_ways)
                l2_pressure[d] = _lines_touched(terms, self.line_elems, machine.l2_sets,
                                                machine.l2_ways)[1] if machine.l2_sets else lines[d]
            else:
                lines[d], pressure[d] = lines[d + 1], pressure[d + 1]
                l2_pressure[d] = l2_pressure[d + 1]
        return _Footprint(access, tuple(lines), tuple(pressure), tuple(l2_pressure),
                          self._strided(access, strides))

    def _strided(self, access: _Access, strides: dict[int, int]) -> bool:
        """Whether no prefetcher follows the access: a visit (one step of the innermost serial
        loop it depends on) reads part of a line, or pieces STRIDED_BYTES or more apart, and the
        visits jump too (a column walk; an unpacked operand's rows under a register tile), or
        step along each piece only for a stream shorter than STREAM_BYTES before the loops
        around jump elsewhere (B[k, j] with k unrolled over 8 rows 4 KiB apart under a serial
        j of a few steps: eight streams of a few lines each, a demand miss per line)."""
        serial = sorted((d for d in strides if _is_serial(self.loops[d])), reverse=True)
        if not serial:
            return False
        inner = serial[0]
        if abs(strides[inner]) * 4 >= STRIDED_BYTES:
            run, gap = self._run_and_gap(strides, inner)
            return run < self.line_elems or (not access.written and gap * 4 >= STRIDED_BYTES)
        piece, gap = self._run_and_gap(strides, inner + 1)
        if access.written or gap * 4 < STRIDED_BYTES:
            return False
        # Visits step along their pieces: each piece streams on while the serial loops around
        # continue where it ended (k = 8 * k.0 + k.1 does; past a few steps of j, B's next rows
        # do not).
        stream = piece
        for d in serial:
            step = abs(strides[d])
            if step > stream:
                break
            stream = max(stream, step * (self.loops[d].extent - 1) + piece)
        return stream * 4 < STREAM_BYTES

    def _run_and_gap(self, strides: dict[int, int], start: int) -> tuple[int, int]:
        """The contiguous run (elements) the loops from position `start` inward read first, and
        the jump to the next piece (0: one run)."""
        run = 1
        for stride, extent in sorted((abs(c), self.loops[d].extent)
                                     for d, c in strides.items() if d >= start):
            if extent > 1 and stride > run:
                return run, stride - run
            run += stride * (extent - 1)
        return run, 0


def _transpose_terms(copy: TransposingCopy, machine: MachineModel, streaming: int
                     ) -> dict[str, float]:
    """Cycles of a pack copy the backend runs as register-tile transposes (`backend.transpose`):
    a vector load and a vector store per run of a tile, log2(tile) shuffles per run, the
    columns past the last whole tile one element at a time; the source and the packed copy
    each cross the memory hierarchy once (the copy's lines twice: filled, then written back),
    from the smallest level that holds both (a kernel timed back to back finds them there)."""
    t = copy.tile
    rows = copy.panels * copy.factor * copy.outer
    runs = rows * (copy.rest // t)  # of the source; as many of the copy
    single = rows * (copy.rest % t)
    lines = rows * copy.rest * 4 / machine.line_bytes
    level = next((lv for lv in ("L2", "L3") if machine.caches[lv] >= 8 * rows * copy.rest),
                 "DRAM")
    return {"loads": runs * machine.op_cycles("loads", t) + single * machine.op_cycles("loads", 1),
            "stores": runs * machine.op_cycles("stores", t)
            + single * machine.op_cycles("stores", 1),
            "compute": runs * math.log2(t) * machine.op_cycles("compute", t),
            FILL_OF[level]: 3 * lines * machine.fill_cycles(level, streaming)}


def _loads(e: Expr) -> list[Load]:
    if isinstance(e, Load):
        return [e]
    kids = {BinOp: lambda: (e.a, e.b), Call: lambda: e.args, Select: lambda: (e.a, e.b)}
    for cls, get in kids.items():
        if isinstance(e, cls):
            return [ld for k in get() for ld in _loads(k)]
    return []


def _lines_touched(terms: list[tuple[int, int]], line_elems: int, sets_of_cache: int,
                   ways: int) -> tuple[float, float]:
    """Distinct cache lines an access touches while loops with (flat stride, extent) run, and
    their pressure on a cache of `sets_of_cache` sets and `ways` ways.

    Strides up to a line (or within the contiguous run so far) extend one contiguous run;
    larger strides repeat the run; equal, overlapping or abutting large strides (conv's
    `p + ry`, a row walk split into k.0 x k.1) merge. Repeats a multiple of 4 KiB apart land in
    few sets (rows 12 KiB apart in 16 of 1,024: every address is a multiple of the strides'
    common divisor); beyond its ways they count as if every set were that full.
    """
    run = 1
    copies: list[list[int]] = []  # [stride, count]
    for stride, extent in sorted(terms):
        if extent <= 1:
            continue
        if not copies and stride <= max(run, line_elems):
            run += stride * (extent - 1)
        elif copies and stride <= copies[-1][0] * copies[-1][1]:
            last = copies[-1]
            last[1] = (last[0] * (last[1] - 1) + stride * (extent - 1)) // last[0] + 1
        else:
            copies.append([stride, extent])
    per_run = 1 + (run - 1) / line_elems
    lines = per_run * math.prod(count for _, count in copies)
    if not copies:
        return lines, lines
    sets = math.ceil(per_run)
    for stride, count in copies:  # repeats a multiple of 4 KiB apart share their sets
        sets *= min(count, sets_of_cache // math.gcd(stride // line_elems, sets_of_cache)) \
            if stride % line_elems == 0 else count
    if all(stride % line_elems == 0 for stride, _ in copies):  # together, no more than their
        common = math.gcd(sets_of_cache, *(stride // line_elems for stride, _ in copies))
        sets = min(sets, math.ceil(per_run) * sets_of_cache // common)  # common divisor allows
    sets = min(sets_of_cache, sets)
    return lines, lines * sets_of_cache / sets if lines / sets > ways else lines


def _soft_max(terms: list[float]) -> float:
    return sum(t ** SOFT_MAX_POWER for t in terms) ** (1 / SOFT_MAX_POWER)


# ---- caches ---------------------------------------------------------------------------------


def _footprints(sites: dict, profiles: dict, kind: str) -> dict[str, float]:
    """Lines touched by one run of each loop (per buffer, the largest of its accesses; `kind`
    is a _Footprint field: lines, l1_pressure or l2_pressure), and by the whole program (key
    "")."""
    per_buffer: dict[tuple[str, str], float] = defaultdict(float)
    for name, (_, loops) in sites.items():
        for fp in profiles[name].footprints:
            lines = getattr(fp, kind)
            for d, lp in enumerate(loops):
                key = (lp.name, fp.access.buffer)
                per_buffer[key] = max(per_buffer[key], lines[d])
            key = ("", fp.access.buffer)
            per_buffer[key] = max(per_buffer[key], lines[0])
    totals: dict[str, float] = defaultdict(float)
    for (loop, _), lines in per_buffer.items():
        totals[loop] += lines
    return totals


def _traffic(fp: _Footprint, loops: tuple[Loop, ...], footprint: dict[str, float],
             capacity: float, strided_fill: float) -> float:
    """Lines an access brings into a level of `capacity` lines (twice that when it writes),
    weighted by their fill cost (`strided_fill` per line of a strided access)."""
    fits = next((d for d, lp in enumerate(loops) if footprint[lp.name] <= capacity), len(loops))
    moved = _moved(fp, loops, footprint, capacity, fits)
    outside = footprint[loops[fits - 1].name] if fits else footprint[""]
    if capacity < outside < 2 * capacity:  # LRU keeps part of a working set a bit too large
        share = (outside - capacity) / capacity
        moved = share * moved + (1 - share) * _moved(fp, loops, footprint, capacity, fits - 1)
    return moved * (2 if fp.access.written else 1) * (strided_fill if fp.strided else 1.0)


def _moved(fp: _Footprint, loops: tuple[Loop, ...], footprint: dict[str, float],
           capacity: float, fits: int) -> float:
    """Lines brought in when loops from `fits` inward keep their data (-1: the whole program,
    warm from the previous call)."""
    if fits < 0:
        return 0.0
    if fits == 0:
        return 0.0 if footprint[""] <= capacity else fp.lines[0]
    return fp.lines[fits - 1] * math.prod(lp.extent for lp in loops[:fits - 1])
