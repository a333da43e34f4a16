"""Lowering a loop program to LLVM IR: one function per run of root nodes.

Consecutive non-parallel root nodes become one function `(ptr buffers...)`; a parallel root loop
becomes a chunk function `(ptr buffers..., i64 lo, i64 hi)` over part of its range (of its
`parallel_nest`'s steps, counted as one), and its packed entry `(ptr args, i64 lo, i64 hi)`,
which loads the buffers from an array: what the threads of a `team` call. Buffers are passed in
`Program.params` order.

Serial loops become counted loops, unrolled loops repeat their body with the variable a constant,
and a vectorized loop emits its body once on `<L x float>` values (`indexing` says how each access
varies over the lanes). Float values stay scalar until they meet a vector, so a load invariant in
the vectorized loop is done once and broadcast.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from ..affine import Affine, AffineError
from ..expr import BinOp, Call, Cmp, Const, Expr, Load, Select, substitute, walk
from ..ir import Alloc, Block, Loop, LoopKind, Node, Program, Scope, parallel_nest
from ..ir import walk as walk_nodes
from ..legality import loop_binding
from .errors import BackendError
from .indexing import Indexer, Lanes, compared, difference
from .mathlib import F32, I32, MathEmitter, broadcast, declare, same_shape
from .transpose import emit as emit_transposes
from .transpose import transposed, transposes_runs, transposing_copy

I1 = ir.IntType(1)
I64 = ir.IntType(64)
PTR = ir.PointerType()
# Partial steps of a loop emitted one by one with the variable a constant; more (blocks under the
# loop that disagree on where their axes end) run as a loop with each block guarded.
MAX_PEELED = 2
PEEL_LIMIT = 256  # blocks (unrolled copies counted) a peeled tail may emit
# An innermost serial loop whose body is straight-line code of at most this many vector
# registers' worth of block evaluations per step runs up to MAX_COPIES copies of it per step.
COPY_BUDGET = 96
MAX_COPIES = 4
# Runs a serial loop is cut into where select conditions change value (a padding's first border
# steps, its inside, its last ones); each run copies the loop's body.
MAX_DECIDED_RUNS = 3


@dataclass(frozen=True)
class Segment:
    """A compiled function and how the kernel calls it."""

    function: str
    parallel_extent: int | None = None  # set for a chunk function (ptrs..., lo, hi)
    preparation: bool = False  # a nest of `Program.preparation`, run once by a bound kernel

    @property
    def packed(self) -> str:
        """A chunk function's packed entry (args, lo, hi): its pointers from an array."""
        return f"{self.function}.packed"


def lower(prog: Program, triple: str, data_layout: str, register_lanes: int = 16,
          most_copies: int | None = None) -> tuple[ir.Module, list[Segment]]:
    """`register_lanes`: float lanes of the target's vector register (see _vectorized);
    `most_copies`: of a small loop body per step (`body_copies`; default MAX_COPIES)."""
    module = ir.Module(name=prog.name)
    module.triple = triple
    module.data_layout = data_layout
    segments: list[Segment] = []
    run: list[Node] = []

    def flush(preparation: bool = False) -> None:
        if run:
            name = f"seg{len(segments)}"
            _FunctionEmitter(module, prog, name, False, register_lanes,
                             most_copies).emit_serial(tuple(run))
            segments.append(Segment(name, preparation=preparation))
            run.clear()

    preparation = set(prog.preparation)
    for k, node in enumerate(prog.body):
        if isinstance(node, Loop) and node.kind == LoopKind.PARALLEL:
            flush()
            name = f"seg{len(segments)}"
            emitter = _FunctionEmitter(module, prog, name, True, register_lanes, most_copies)
            emitter.emit_chunk(node)
            extent = math.prod(lp.extent for lp in parallel_nest(node))
            segments.append(Segment(name, extent, k in preparation))
            _packed_entry(module, emitter.fn, segments[-1].packed)
        elif k in preparation:  # a function of its own, which a bound kernel runs once
            flush()
            run.append(node)
            flush(preparation=True)
        else:
            run.append(node)
    flush()
    return module, segments


class _FunctionEmitter:
    def __init__(self, module: ir.Module, prog: Program, name: str, chunked: bool,
                 register_lanes: int, most_copies: int | None):
        self.prog = prog
        self.register_lanes = register_lanes
        self.most_copies = most_copies
        params = prog.params
        args = [PTR] * len(params) + ([I64, I64] if chunked else [])
        self.fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), name)
        self.fn.attributes.add("nounwind")
        self.ptrs: dict[str, ir.Value] = {}
        for arg, buf in zip(self.fn.args, params):
            arg.name = buf.name
            for attr in ("noalias", "nonnull", "captures(none)"):
                arg.attributes.add(attr)
            arg.attributes.dereferenceable = 4 * buf.size
            # The kernel allocates intermediates 64-byte aligned; callers' arrays may be less.
            arg.attributes.align = 64 if buf.scope == Scope.GLOBAL else 4
            self.ptrs[buf.name] = arg
        self.entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self.entry)
        self.ix = Indexer(self.b, prog)
        self.guarded = 0  # > 0 while emitting a Select branch: loads there may be out of bounds
        self.unpartitioned = 0  # > 0 inside a tail too big to peel: blocks are guarded instead
        self.tail: ir.Constant | None = None  # the active lanes of a tail vector (_vectorized)
        self.tail_lanes = 0  # how many
        self.selecting: dict[str, bool] = {}  # loop name: whether a block under it selects
        # A parallel loop under a parallel loop: (the outer loop, the chunk [lo, hi) of their
        # steps counted as one, its steps per step of the outer loop).
        self.collapsed: dict[str, tuple[str, ir.Value, ir.Value, int]] = {}

    # ---- structure --------------------------------------------------------------------------

    def emit_serial(self, nodes: tuple[Node, ...]) -> None:
        self._nodes(nodes)
        self.b.ret_void()

    def emit_chunk(self, loop: Loop) -> None:
        lo, hi = self.fn.args[-2:]
        if not self._transposing_copy(loop, (lo, hi)):  # a collapsed nest never is one
            self._chunk(loop, lo, hi)
        self.b.ret_void()

    def _chunk(self, loop: Loop, lo: ir.Value, hi: ir.Value) -> None:
        """The steps [lo, hi) of `loop`'s parallel nest, counted as one: of a nest of several
        loops, the steps of `loop` that hold part of that range, and in each the range's part
        for the loop inside (`_collapsed`)."""
        nest = parallel_nest(loop)
        if len(nest) > 1:
            b = self.b
            per_step = math.prod(lp.extent for lp in nest[1:])
            self.collapsed[nest[1].name] = (loop.name, lo, hi, per_step)
            step = ir.Constant(I64, per_step)
            lo, hi = b.udiv(lo, step), b.udiv(b.add(hi, ir.Constant(I64, per_step - 1)), step)
        full, reach = self._span(loop)
        if full == loop.extent:
            self._counted_loop(loop, lo, hi)
        else:
            # The kernel hands out chunks of the whole extent; the full steps run as a loop and
            # the chunk holding the tail step runs it peeled.
            b = self.b
            bound = ir.Constant(I64, full)
            self._counted_loop(loop, lo, b.select(b.icmp_signed("<", hi, bound), hi, bound),
                               (0, max(full - 1, 0)))
            first, last = ir.Constant(I64, full), ir.Constant(I64, reach)
            inside = b.and_(b.icmp_signed("<", lo, last), b.icmp_signed(">", hi, first))
            with b.if_then(inside):
                self._tail(loop, full, reach, (lo, hi))

    def _collapsed(self, loop: Loop) -> None:
        """A parallel loop under a parallel loop: at this step of the outer one, its part of
        the chunk the two share."""
        outer, lo, hi, per_step = self.collapsed[loop.name]
        b, step = self.b, ir.Constant(I64, per_step)
        at = self.ix.env[outer]
        base = b.mul(at if isinstance(at, ir.Value) else ir.Constant(I64, at), step)
        zero = ir.Constant(I64, 0)

        def clamped(value: ir.Value) -> ir.Value:
            value = b.sub(value, base)
            value = b.select(b.icmp_signed("<", value, zero), zero, value)
            return b.select(b.icmp_signed(">", value, step), step, value)

        self._chunk(loop, clamped(lo), clamped(hi))

    def _nodes(self, nodes: tuple[Node, ...]) -> None:
        for n in nodes:
            if isinstance(n, Loop):
                self._loop(n)
            elif isinstance(n, Alloc):
                self._alloc(n)
            else:
                self._block(n)

    def _loop(self, loop: Loop) -> None:
        if loop.kind == LoopKind.PARALLEL:
            if loop.name not in self.collapsed:
                raise BackendError(
                    f"parallel loop {loop.name} is not at the root of the program nor the only "
                    "statement of a parallel loop there; only those can be run in parallel"
                )
            self._collapsed(loop)
            return
        if not self.ix.env and self._transposing_copy(
                loop, (ir.Constant(I64, 0), ir.Constant(I64, loop.extent))):
            return
        if loop.kind == LoopKind.UNROLL and self._transposed_stores(loop):
            return
        full, reach = self._span(loop)
        if loop.kind == LoopKind.UNROLL:
            for value in range(reach):
                self._peeled(loop, value)
        elif loop.kind == LoopKind.VECTOR and full == loop.extent:
            self._vectorized(loop)
        elif loop.kind == LoopKind.VECTOR:
            # A tail: the lanes that run whole form a vector (56 of 64 lanes, 7 of 8); a lane
            # that runs in part (a vector piece with a stride) is peeled.
            if full > 1:
                self._vectorized(loop, active=full, partial_lanes=reach > full)
            for value in range(0 if full == 1 else full, reach):
                self._peeled(loop, value)
        else:
            runs = self._decided_runs(loop, full)
            for first, stop in runs:
                if len(runs) > 1 and stop - first == 1:
                    self._peeled(loop, first)
                else:
                    self._steps(loop, first, stop)
            if reach > full:
                self._tail(loop, full, reach)

    def _steps(self, loop: Loop, first: int, stop: int) -> None:
        """The steps [first, stop) of a serial loop: a counted loop, several copies of a small
        body per step, the steps left over peeled."""
        copies = 1 if self.unpartitioned else body_copies(loop, self.register_lanes,
                                                          self.most_copies)
        whole = stop - (stop - first) % copies
        if whole > first:
            self._counted_loop(loop, ir.Constant(I64, first), ir.Constant(I64, whole),
                               copies=copies)
        for value in range(whole, stop):
            self._peeled(loop, value)

    def _decided_runs(self, loop: Loop, full: int) -> list[tuple[int, int]]:
        """The steps [0, full) in runs over which every select condition under the loop that
        the loop's variable moves keeps one value (or stays undecided): a padding's border
        steps apart from its inside, whose tests the indexer then drops (TVM's loop
        partition). One run when the loop moves no condition, or when more than
        MAX_DECIDED_RUNS would copy its body too often."""
        if self.unpartitioned or full < 2 or not self._selects_under(loop):
            return [(0, full)]
        tests = self._moved_tests(loop)
        if not tests:
            return [(0, full)]
        signatures = [tuple(compared(op, c * step + lo, c * step + hi) for op, c, lo, hi in tests)
                      for step in range(full)]
        runs = [[0, 1]]
        for step in range(1, full):
            if signatures[step] == signatures[step - 1]:
                runs[-1][1] = step + 1
            else:
                runs.append([step, step + 1])
        if len(runs) > MAX_DECIDED_RUNS:
            return [(0, full)]
        return [(a, b) for a, b in runs]

    def _selects_under(self, loop: Loop) -> bool:
        """Whether a block under `loop` selects (remembered: a loop is emitted once per step of
        each unrolled or peeled loop around it)."""
        if loop.name not in self.selecting:
            self.selecting[loop.name] = any(isinstance(e, Select) for blk in _blocks_under(loop)
                                            for e in walk(blk.value))
        return self.selecting[loop.name]

    def _moved_tests(self, loop: Loop) -> list[tuple[str, int, int, int]]:
        """Each comparison of a select condition under `loop` whose sides differ by an affine
        function of the loop's variable: (op, its coefficient, the bounds of the rest over the
        loops around and the whole ranges of the loops inside)."""
        tests = []
        for blk, path in walk_nodes(loop.body):
            selects = [e for e in walk(blk.value) if isinstance(e, Select)] \
                if type(blk) is Block else []
            if not selects:
                continue
            axes = {bd.axis: bd.expr() for bd in blk.bindings}
            ranges = dict(self.ix.ranges)
            ranges.update({lp.name: (0, lp.extent - 1) for lp in (loop, *path)
                           if isinstance(lp, Loop)})
            for atom in (a for e in selects for a in _comparisons(e.cond)):
                try:
                    diff = difference(atom, lambda side: substitute(side, axes), ranges)
                    rest = Affine.of({v: c for v, c in diff.terms if v != loop.name}, diff.const)
                    lo, hi = rest.bounds(ranges)
                except AffineError:
                    continue
                if diff.coeff(loop.name):
                    tests.append((atom.op, diff.coeff(loop.name), lo, hi))
        return tests

    def _transposing_copy(self, loop: Loop, panels: tuple[ir.Value, ir.Value]) -> bool:
        """Emit a root pack nest that transposes as register-tile transposes (`transpose`);
        False when `loop` is not one."""
        copy = transposing_copy(loop, self.prog, self.register_lanes)
        if copy is None:
            return False
        emit_transposes(self.b, self.fn, copy, self.ptrs[copy.src], self.ptrs[copy.dst], panels)
        return True

    def _transposed_stores(self, loop: Loop) -> bool:
        """Emit an unrolled loop whose copies store a strided vector each, contiguous along the
        loop, as register transposes and runs: a local tile's write-back along output channels
        (`Y[n, k, p, q] = Y.local[q, k]` under q unrolled 8 and k vectorized 16) becomes
        8 x 8 transposes of its 8 vectors and 16 stores of 8 columns, where a scatter stores
        each element on its own. The nest must be the unrolled loop (T steps over L lanes, as
        `transposes_runs` allows), unrolled loops of one child each, a vector loop and one
        plain block that does not read what it writes, with no step partial and no
        point guarded; False (nothing emitted) otherwise."""
        chain = [loop]
        while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], Loop) \
                and chain[-1].body[0].kind == LoopKind.UNROLL:
            chain.append(chain[-1].body[0])
        inner = chain[-1].body
        if len(inner) != 1 or not isinstance(inner[0], Loop) or inner[0].kind != LoopKind.VECTOR:
            return False
        vec = inner[0]
        tile, lanes = loop.extent, vec.extent
        if self.ix.vec is not None or self.tail is not None or self.unpartitioned \
                or not transposes_runs(tile, lanes) \
                or len(vec.body) != 1 or not isinstance(vec.body[0], Block):
            return False
        blk = vec.body[0]
        if blk.reduce is not None or blk.buffer in {ld.buffer for ld in blk.reads()} \
                or any(self._span(lp) != (lp.extent, lp.extent) for lp in (*chain, vec)):
            return False
        for lp in chain:
            self.ix.enter(lp, 0)
        self.ix.enter(vec, Lanes(0))
        self.ix.bind(blk)
        # coefficients, not `address`: that would emit the address's code for nothing
        stride = self.ix.coefficient(blk.buffer, blk.indices, vec.name)
        along = self.ix.coefficient(blk.buffer, blk.indices, loop.name)
        clean = self._guard(blk) is True and stride not in (None, 0, 1) and along == 1
        self.ix.leave(vec)
        for lp in reversed(chain):
            self.ix.leave(lp)
        if not clean:
            return False
        for outer in itertools.product(*(range(lp.extent) for lp in chain[1:])):
            rows, base = [], None
            for step in range(tile):
                for lp, value in zip(chain, (step, *outer)):
                    self.ix.enter(lp, value, (value, value))
                self.ix.enter(vec, Lanes(0))
                self.ix.bind(blk)
                if step == 0:
                    base = self.ix.address(blk.buffer, blk.indices).scalar
                rows.append(self._widen(self._value(blk.value, None),
                                        ir.VectorType(F32, lanes)))
                self.ix.leave(vec)
                for lp in reversed(chain):
                    self.ix.leave(lp)
            self._store_columns(blk.buffer, rows, base, stride)
        return True

    def _store_columns(self, buffer: str, rows: list[ir.Value], base: ir.Value,
                       stride: int) -> None:
        """Store `rows` (T vectors of L lanes; row t's lane l goes to base + t + l * stride)
        as L runs of T elements: each T-lane piece of the rows transposed in registers."""
        b, tile = self.b, len(rows)
        lanes = rows[0].type.count
        for first in range(0, lanes, tile):
            piece = ir.Constant(ir.VectorType(I32, tile), list(range(first, first + tile)))
            columns = transposed(b, [b.shuffle_vector(row, row, piece) for row in rows])
            for lane, column in enumerate(columns, start=first):
                at = b.add(base, ir.Constant(I64, lane * stride), flags=["nsw"])
                b.store(column, self._gep(buffer, at)).align = 4

    def _tail(self, loop: Loop, full: int, reach: int,
              chunk: tuple[ir.Value, ir.Value] | None = None) -> None:
        """The partial steps [full, reach) (of them, those in a parallel loop's `chunk` [lo, hi):
        a team claims chunks of any size): peeled, so the loops inside shrink to what is left,
        when that copy of the body is small; else run as they are, each block guarded (every
        peeled level copies the body once more, and big unrolled bodies made code that LLVM
        took a minute to compile)."""
        if reach - full <= MAX_PEELED and _emitted(loop.body) <= PEEL_LIMIT:
            for value in range(full, reach):
                self._within(chunk, value, lambda v=value: self._peeled(loop, v))
            return
        self.unpartitioned += 1
        if reach - full == 1:
            self._within(chunk, full, lambda: self._peeled(loop, full))
        elif chunk is None:
            self._counted_loop(loop, ir.Constant(I64, full), ir.Constant(I64, reach))
        else:
            b, (lo, hi) = self.b, chunk
            start = b.select(b.icmp_signed(">", lo, ir.Constant(I64, full)), lo,
                             ir.Constant(I64, full))
            stop = b.select(b.icmp_signed("<", hi, ir.Constant(I64, reach)), hi,
                            ir.Constant(I64, reach))
            self._counted_loop(loop, start, stop, (full, reach - 1))
        self.unpartitioned -= 1

    def _within(self, chunk: tuple[ir.Value, ir.Value] | None, value: int,
                emit: Callable[[], None]) -> None:
        """`emit()`, run only when step `value` lies in `chunk` (always without one)."""
        if chunk is None:
            emit()
            return
        b, (lo, hi) = self.b, chunk
        step = ir.Constant(I64, value)
        with b.if_then(b.and_(b.icmp_signed("<=", lo, step), b.icmp_signed(">", hi, step))):
            emit()

    def _peeled(self, loop: Loop, value: int) -> None:
        """One iteration with the loop variable a constant, so the loops inside see how much of
        a remainder is left and shrink to it."""
        self.ix.enter(loop, value, (value, value))
        self._nodes(loop.body)
        self.ix.leave(loop)

    def _span(self, loop: Loop) -> tuple[int, int]:
        """(full, reach): the steps [0, full) of `loop` run every point of every block under it,
        the steps [full, reach) some, the steps past reach none (static loop partition).

        A block constrains a loop that is the outermost free piece of one of its axes: the
        pieces inside it span exactly [0, stride) (legality: a mixed-radix number, remainders
        nested outer to inner), so with the enclosing pieces' constant values taken off, `rest`
        points of the axis are left: rest // stride full steps and one partial step."""
        if self.unpartitioned:
            return loop.extent, loop.extent
        full, reach = loop.extent, 0
        for blk in _blocks_under(loop):
            bound = loop_binding(blk, loop.name)
            if bound is None:
                reach = loop.extent  # the block runs at every step
                continue
            axis, stride = bound
            binding = blk.binding(axis)
            rest = blk.axis(axis).extent - binding.offset
            top = True
            for lp, s in binding.terms:
                value = self.ix.env.get(lp)
                if isinstance(value, int):
                    rest -= s * value
                elif lp != loop.name and s > stride:
                    top = False  # a free piece outside this one in the axis: no partition here
            if not top:
                reach = loop.extent
                continue
            full = min(full, max(rest // stride, 0))
            reach = max(reach, min(max(-(-rest // stride), 0), loop.extent))
        return full, reach

    def _counted_loop(self, loop: Loop, lo: ir.Value, hi: ir.Value,
                      span: tuple[int, int] | None = None, copies: int = 1) -> None:
        """`loop` over [lo, hi), its body `copies` times per step (the step then advances by
        `copies`; hi - lo must be a multiple of it)."""
        b = self.b
        body = self.fn.append_basic_block(loop.name)
        done = self.fn.append_basic_block(f"{loop.name}.done")
        pre = b.block
        if isinstance(lo, ir.Constant) and isinstance(hi, ir.Constant):
            b.branch(body)
        else:
            b.cbranch(b.icmp_signed("<", lo, hi), body, done)
        b.position_at_end(body)
        iv = b.phi(I64, name=loop.name)
        iv.add_incoming(lo, pre)
        if span is None and isinstance(lo, ir.Constant) and isinstance(hi, ir.Constant):
            span = (lo.constant, hi.constant - 1)
        for copy in range(copies):
            value = iv if copy == 0 else b.add(iv, ir.Constant(I64, copy), flags=["nuw", "nsw"])
            self.ix.enter(loop, value,
                          None if span is None else (span[0] + copy, span[1] - copies + 1 + copy))
            self._nodes(loop.body)
            self.ix.leave(loop)
        nxt = b.add(iv, ir.Constant(I64, copies), flags=["nuw", "nsw"])
        iv.add_incoming(nxt, b.block)
        b.cbranch(b.icmp_signed("<", nxt, hi), body, done)
        b.position_at_end(done)

    def _vectorized(self, loop: Loop, active: int | None = None,
                    partial_lanes: bool = False) -> None:
        """The body once on vectors; a tail runs only its first `active` lanes.

        A tail of at least a register's lanes whose lanes are whole half registers (56 of 64:
        `in_pieces`) runs the body once per power-of-two piece of them (32, 16 and 8), each an
        exact vector from its first lane: a masked <64 x float> would do the arithmetic of 8
        lanes that do not exist, a whole zmm FMA where a core whose units are half a register
        wide runs the ymm piece in half the time. Another tail of at least a register's lanes
        (63 of 64) is a vector as wide as the next power of two (at most the loop's lanes)
        whose operand loads and stores are masked to the active lanes: LLVM moves a
        non-power-of-two vector such as <63 x float> element by element (§17.2), a masked
        <64 x float> as three plain zmm accesses and one masked one. Arithmetic runs on every
        lane. An accumulator in memory is loaded and stored in power-of-two pieces
        (_plain_load), so LLVM can still keep it in a register. A local tile is accessed whole
        (in its bounds: its extent along the loop is the loop's, and the lanes past `active` are
        points past the axis, never written back), so it can stay in registers. A narrower tail
        (7 of 8 lanes) keeps its exact width: its accumulators are rows narrower than a vector,
        which a wider access would overlap, and LLVM then stores each and reloads the next
        through memory (§17.2). So does a tail with `partial_lanes`: those lanes hold real
        points, peeled after. A whole loop of lanes that are no power of two but whole half
        registers, wider than a register (24 on AVX2: three ymm across), runs as its pieces
        too: LLVM widens a <24 x float> and moves its accumulators lane by lane."""
        if active is not None and active < loop.extent:
            wide = not partial_lanes and active >= self.register_lanes
            if wide and in_pieces(active, self.register_lanes):
                self._each_piece(loop, active)
                return
            width = min(loop.extent, 1 << (active - 1).bit_length()) if wide else active
            loop = Loop(loop.name, width, loop.kind, loop.body)
        else:
            active = loop.extent
            if active & (active - 1) and active > self.register_lanes \
                    and in_pieces(active, self.register_lanes):
                self._each_piece(loop, active)
                return
        self._lanes(loop, 0, active)

    def _each_piece(self, loop: Loop, active: int) -> None:
        """The body once per power-of-two piece of the first `active` lanes, each an exact
        vector from its first lane."""
        for first, lanes in tail_pieces(active):
            self._lanes(Loop(loop.name, lanes, loop.kind, loop.body), first, lanes)

    def _lanes(self, loop: Loop, first: int, active: int) -> None:
        """The body once on the vector of `loop.extent` lanes from lane `first`, its first
        `active` lanes running."""
        if self.ix.vec is not None:
            raise BackendError(
                f"vectorized loop {loop.name} is inside vectorized loop {self.ix.vec.name}")
        self.ix.enter(loop, Lanes(first), (first, first + active - 1))
        if active < loop.extent:
            self.tail = ir.Constant(ir.VectorType(I1, loop.extent),
                                    [lane < active for lane in range(loop.extent)])
            self.tail_lanes = active
        self._nodes(loop.body)
        self.tail = None
        self.ix.leave(loop)

    def _alloc(self, node: Alloc) -> None:
        buf = self.prog.buffer(node.buffer)
        if buf.scope != Scope.LOCAL:
            raise BackendError(
                f"alloc of {buf.name}, which is a {buf.scope.value} buffer, not local")
        # In the entry block, so SROA/mem2reg can turn a register tile into SSA values.
        entry = ir.IRBuilder(self.entry)
        entry.position_at_start(self.entry)
        slot = entry.alloca(ir.ArrayType(F32, buf.size), name=buf.name)
        slot.align = 64
        slot.type = PTR  # llvmlite gives allocas typed pointers; all other pointers are opaque
        # The main builder may be in the entry block too (no loop opened a block before this
        # alloc: they were peeled or unrolled); its insertion point shifted with the alloca.
        self.b.position_at_end(self.b.block)
        self.ptrs[buf.name] = slot
        self._nodes(node.body)
        del self.ptrs[buf.name]

    # ---- blocks -----------------------------------------------------------------------------

    def _block(self, blk: Block) -> None:
        cond = self._guard(blk)
        if cond is False:
            return
        if cond is True:
            self._store(blk, self.tail)
            return
        self.guarded += 1
        if isinstance(cond.type, ir.VectorType):
            self._store(blk, cond if self.tail is None else self.b.and_(cond, self.tail))
        else:
            with self.b.if_then(cond):
                self._store(blk, self.tail)
        self.guarded -= 1

    def _guard(self, blk: Block) -> ir.Value | bool:
        """Whether the block's point lies inside its axes (the guard of a split that leaves a
        remainder): True or False when the loops' ranges decide it, which the static partition
        makes the rule; else the runtime test, `<L x i1>` when it differs per lane."""
        cond: ir.Value | bool = True
        for binding in blk.bindings:
            extent = blk.axis(binding.axis).extent
            lo = hi = binding.offset
            for lp, stride in binding.terms:
                first, last = self.ix.ranges[lp]
                lo, hi = lo + stride * first, hi + stride * last
            if hi < extent:
                continue
            if lo >= extent:
                return False
            value = self.ix.int_value(binding.expr())
            if isinstance(value, int):
                if value >= extent:
                    return False
                continue
            limit = ir.Constant(value.type, [extent] * value.type.count
                                if isinstance(value.type, ir.VectorType) else extent)
            inside = self.b.icmp_signed("<", value, limit)
            cond = inside if cond is True else self.b.and_(*same_shape(self.b, cond, inside))
        return cond

    def _store(self, blk: Block, mask: ir.Value | None) -> None:
        """The block's store; with `mask` (vector code), only the lanes it sets run."""
        self.ix.bind(blk)
        vec = self.ix.vec
        addr = self.ix.address(blk.buffer, blk.indices)
        if vec is not None and (addr.vector is not None or addr.stride == 0):
            stride = "a non-affine index" if addr.vector is not None else "stride 0"
            raise BackendError(
                f"vectorized loop {vec.name} needs stores to distinct elements, but block "
                f"{blk.name} stores {blk.buffer} with {stride} in it"
            )
        if vec is not None and addr.stride != 1:
            self._scattered_block(blk, addr.scalar, addr.stride, mask)
            return
        ptr = self._gep(blk.buffer, addr.scalar)
        ty = ir.VectorType(F32, vec.extent) if vec is not None else F32
        own = self._memory_mask(blk.buffer, mask)  # the store's and the accumulator's
        if blk.reduce is None:
            value = self._widen(self._value(blk.value, mask), ty)
        elif own is None or own is self.tail:
            acc = self._plain_load(ptr, ty, own is not None)
            value = self._accumulate(blk.reduce, acc, blk.value, mask)
        else:
            acc = self._masked_load(ptr, own)
            value = self._accumulate(blk.reduce, acc, blk.value, mask)
        if own is not None and own is self.tail:
            self._plain_store(value, ptr)
            return
        mask = own
        if mask is None:
            store = self.b.store(value, ptr)
            store.align = 4
        else:
            self._masked_store(value, ptr, mask)

    def _scattered_block(self, blk: Block, base: ir.Value, stride: int,
                         mask: ir.Value | None) -> None:
        """A vector store whose lanes are `stride` elements apart: a scatter (and, for an
        accumulation, a gather of the old values first). The legality check makes the lanes'
        elements distinct, so no two lanes race."""
        b, vec = self.b, self.ix.vec
        assert vec is not None
        ty = ir.VectorType(F32, vec.extent)
        offsets = b.add(broadcast(b, base, ir.VectorType(I64, vec.extent)),
                        b.mul(self.ix.lanes(), self.ix.splat(stride)))
        ptrs = self._gep(blk.buffer, offsets)
        every = mask if mask is not None else ir.Constant(ir.VectorType(I1, vec.extent),
                                                          [1] * vec.extent)
        if blk.reduce is None:
            value = self._widen(self._value(blk.value, mask), ty)
        else:
            acc = b.call(_gather(b.module, ty), [ptrs, ir.Constant(I32, 4), every,
                                                 ir.Constant(ty, None)])
            value = self._accumulate(blk.reduce, acc, blk.value, mask)
        b.call(_scatter(b.module, ty), [value, ptrs, ir.Constant(I32, 4), every])

    def _accumulate(self, op: str, acc: ir.Value, e: Expr, mask: ir.Value | None) -> ir.Value:
        b = self.b
        if op == "sum" and isinstance(e, BinOp) and e.op == "*":
            x = self._widen(self._value(e.a, mask), acc.type)
            y = self._widen(self._value(e.b, mask), acc.type)
            return MathEmitter(b, acc.type).fma(x, y, acc)
        v = self._widen(self._value(e, mask), acc.type)
        if op == "sum":
            return b.fadd(acc, v)
        return MathEmitter(b, acc.type).extremum("maximum", acc, v)

    # ---- memory -----------------------------------------------------------------------------

    def _gep(self, buffer: str, offset: ir.Value) -> ir.Value:
        try:
            base = self.ptrs[buffer]
        except KeyError:
            raise BackendError(f"buffer {buffer} is used outside its alloc") from None
        gep = self.b.gep(base, [offset], inbounds=self.guarded == 0, source_etype=F32)
        if isinstance(offset.type, ir.VectorType):
            gep.type = ir.VectorType(PTR, offset.type.count)  # llvmlite types every GEP as `ptr`
        return gep

    # ---- float values -----------------------------------------------------------------------

    def _value(self, e: Expr, mask: ir.Value | None) -> ir.Value:
        """A float value: scalar when invariant in the vectorized loop, else <L x float>.

        `mask` (vector code only) marks the lanes whose value is used; loads outside it must not
        touch memory, as they may be out of bounds (padding).
        """
        b = self.b
        if isinstance(e, Const):
            return ir.Constant(F32, float(e.value))
        if isinstance(e, Load):
            return self._load(e, mask)
        if isinstance(e, BinOp):
            x, y = same_shape(self.b, self._value(e.a, mask), self._value(e.b, mask))
            if e.op == "+":
                return b.fadd(x, y)
            if e.op == "-":
                return b.fsub(x, y)
            if e.op == "*":
                return b.fmul(x, y)
            if e.op == "/":
                return b.fdiv(x, y)
            if e.op in ("max", "min"):
                # llvm.maximum/minimum propagate NaN, as numpy's maximum/minimum do.
                return MathEmitter(b, x.type).extremum("maximum" if e.op == "max" else "minimum",
                                                       x, y)
            raise BackendError(f"unknown float operator {e.op!r}")
        if isinstance(e, Call):
            return self._call(e.fn, self._value(e.args[0], mask))
        if isinstance(e, Select):
            return self._select(e, mask)
        raise BackendError(f"cannot compute {e} as a float value")

    def _call(self, fn: str, x: ir.Value) -> ir.Value:
        math = MathEmitter(self.b, x.type)
        if fn == "neg":
            return self.b.fneg(x)
        if fn == "abs":
            return math.call("fabs", x)
        if fn == "sqrt":
            return math.call("sqrt", x)
        if fn in ("exp", "log", "tanh", "erf"):
            return getattr(math, fn)(x)
        raise BackendError(f"unknown math function {fn!r}")

    def _select(self, e: Select, mask: ir.Value | None) -> ir.Value:
        cond = self.ix.cond(e.cond)
        if isinstance(cond, bool):
            return self._value(e.a if cond else e.b, mask)
        b = self.b
        self.guarded += 1
        if isinstance(cond.type, ir.VectorType):
            # Lanes differ: compute both sides, each loading only for the lanes that take it.
            not_cond = b.xor(cond, ir.Constant(cond.type, [1] * cond.type.count))
            x = self._value(e.a, cond if mask is None else b.and_(mask, cond))
            y = self._value(e.b, not_cond if mask is None else b.and_(mask, not_cond))
            self.guarded -= 1
            x, y = same_shape(self.b, x, y)
            return b.select(cond, x, y)
        # One condition for all lanes: a real branch, so the untaken side never runs.
        then_bb = self.fn.append_basic_block("then")
        else_bb = self.fn.append_basic_block("else")
        merge_bb = self.fn.append_basic_block("merge")
        b.cbranch(cond, then_bb, else_bb)
        b.position_at_end(then_bb)
        x = self._value(e.a, mask)
        x_end = b.block
        b.position_at_end(else_bb)
        y = self._value(e.b, mask)
        y_end = b.block
        self.guarded -= 1
        if x.type != y.type:
            if isinstance(x.type, ir.VectorType):
                b.position_at_end(y_end)
                y = broadcast(self.b, y, x.type)
            else:
                b.position_at_end(x_end)
                x = broadcast(self.b, x, y.type)
        for end in (x_end, y_end):
            b.position_at_end(end)
            b.branch(merge_bb)
        b.position_at_end(merge_bb)
        phi = b.phi(x.type)
        phi.add_incoming(x, x_end)
        phi.add_incoming(y, y_end)
        return phi

    def _plain_load(self, ptr: ir.Value, ty: ir.Type, tail: bool) -> ir.Value:
        """An accumulator's load, in a form LLVM forwards from the last store and promotes to a
        register. A tail vector's (56 of 64 lanes) loads its lanes in power-of-two pieces (32,
        16, 8) that _plain_store stores: a masked access reads and writes the whole vector for
        LLVM's alias analysis, which then sees it overlap the next row's and keeps it in
        memory."""
        b = self.b
        if not tail:
            value = b.load(ptr, typ=ty)
            value.align = 4
            return value
        value = ir.Constant(ty, ir.Undefined)
        for start, lanes in self._pieces():
            piece = b.load(b.gep(ptr, [ir.Constant(I64, start)], source_etype=F32),
                           typ=ir.VectorType(F32, lanes))
            piece.align = 4
            value = _place(b, value, piece, start)
        return value

    def _plain_store(self, value: ir.Value, ptr: ir.Value) -> None:
        b = self.b
        for start, lanes in self._pieces():
            piece = _lanes_of(b, value, start, lanes)
            store = b.store(piece, b.gep(ptr, [ir.Constant(I64, start)], source_etype=F32))
            store.align = 4

    def _pieces(self) -> list[tuple[int, int]]:
        return tail_pieces(self.tail_lanes)

    def _memory_mask(self, buffer: str, mask: ir.Value | None) -> ir.Value | None:
        """The mask an access to `buffer` needs: none for a local tile under the tail mask
        alone (see _vectorized)."""
        if mask is not None and mask is self.tail and self.prog.buffer(buffer).scope == Scope.LOCAL:
            return None
        return mask

    def _load(self, ld: Load, mask: ir.Value | None) -> ir.Value:
        b = self.b
        addr = self.ix.address(ld.buffer, ld.indices, chunked=True)
        vec = self.ix.vec
        mask = self._memory_mask(ld.buffer, mask)
        if addr.chunks is not None:
            return self._runs_load(ld.buffer, addr.chunks, mask)
        if mask is not None and mask is self.tail and addr.vector is None and addr.stride == 0:
            mask = None  # every lane reads the one element lane 0, which is active, reads
        vec_ty = ir.VectorType(F32, vec.extent) if vec is not None else None
        if vec_ty is None or (addr.vector is None and addr.stride == 0 and mask is None):
            value = b.load(self._gep(ld.buffer, addr.scalar), typ=F32)
            value.align = 4
            return value
        if addr.vector is None and addr.stride == 1:
            ptr = self._gep(ld.buffer, addr.scalar)
            if mask is None:
                value = b.load(ptr, typ=vec_ty)
                value.align = 4
                return value
            return self._masked_load(ptr, mask)
        if addr.vector is not None:
            offsets = addr.vector
        else:
            offsets = broadcast(self.b, addr.scalar, ir.VectorType(I64, vec_ty.count))
            if addr.stride:
                lanes = b.mul(self.ix.lanes(), self.ix.splat(addr.stride))
                offsets = b.add(offsets, lanes)
        ptrs = self._gep(ld.buffer, offsets)
        if mask is None:
            mask = ir.Constant(ir.VectorType(I1, vec_ty.count), [1] * vec_ty.count)
        return b.call(_gather(b.module, vec_ty), [ptrs, ir.Constant(I32, 4), mask,
                                                  ir.Constant(vec_ty, None)])

    def _masked_load(self, ptr: ir.Value, mask: ir.Value) -> ir.Value:
        """The mask's lanes of the vector at `ptr`, zero elsewhere, as one masked load per
        register of it: LLVM 22 lowered a <16 x float> masked load for AVX2 with a lane whose
        mask is constant false as a plain load of that lane (conv2d's padding, 9 of 16 lanes
        along a row, copied the next row's first element into the border)."""
        b, width = self.b, self._register_width(mask.type.count)
        ty = ir.VectorType(F32, width)
        pieces = []
        for start in range(0, mask.type.count, width):
            lanes = _lanes_of(b, mask, start, width)
            at = b.gep(ptr, [ir.Constant(I64, start)], source_etype=F32)
            if _every_lane(lanes, False):
                pieces.append(ir.Constant(ty, None))
            elif _every_lane(lanes, True):
                pieces.append(b.load(at, typ=ty))
                pieces[-1].align = 4
            else:
                pieces.append(b.call(_masked_load(b.module, ty), [
                    at, ir.Constant(I32, 4), lanes, ir.Constant(ty, None)]))
        return _concat(b, pieces)

    def _masked_store(self, value: ir.Value, ptr: ir.Value, mask: ir.Value) -> None:
        """The mask's lanes of `value` stored at `ptr`, one masked store per register (see
        _masked_load)."""
        b, width = self.b, self._register_width(mask.type.count)
        for start in range(0, mask.type.count, width):
            lanes = _lanes_of(b, mask, start, width)
            piece = _lanes_of(b, value, start, width)
            at = b.gep(ptr, [ir.Constant(I64, start)], source_etype=F32)
            if _every_lane(lanes, True):
                b.store(piece, at).align = 4
            elif not _every_lane(lanes, False):
                b.call(_masked_store(b.module, piece.type), [piece, at, ir.Constant(I32, 4),
                                                             lanes])

    def _register_width(self, lanes: int) -> int:
        """The width of the pieces a masked access of `lanes` is made in: a register, when
        they are a power of two of registers; else the whole vector."""
        count = lanes // self.register_lanes
        if lanes % self.register_lanes or count & (count - 1):
            return lanes
        return self.register_lanes

    def _runs_load(self, buffer: str, starts: list[ir.Value], mask: ir.Value | None
                   ) -> ir.Value:
        """A vector read as contiguous runs, one plain load each, concatenated (LLVM keeps a
        wide vector as registers, so a run of a register's width is one register load); under
        a mask, a gather of the same elements."""
        b, vec = self.b, self.ix.vec
        assert vec is not None
        ty, width = ir.VectorType(F32, vec.extent), vec.extent // len(starts)
        if mask is not None:
            run_lanes = ir.Constant(ir.VectorType(I64, width), list(range(width)))
            offsets = [b.add(broadcast(b, s, run_lanes.type), run_lanes) for s in starts]
            ptrs = self._gep(buffer, _concat(b, offsets))
            return b.call(_gather(b.module, ty), [ptrs, ir.Constant(I32, 4), mask,
                                                  ir.Constant(ty, None)])
        runs = []
        for start in starts:
            run = b.load(self._gep(buffer, start), typ=ir.VectorType(F32, width))
            run.align = 4
            runs.append(run)
        return _concat(b, runs)

    def _widen(self, value: ir.Value, ty: ir.Type) -> ir.Value:
        return broadcast(self.b, value, ty) if value.type != ty else value


def in_pieces(active: int, register_lanes: int) -> bool:
    """Whether a tail of `active` lanes (at least a register's) runs as its power-of-two pieces
    (`tail_pieces`), each an exact vector: when they are whole half registers (56 lanes of 16:
    32, 16, 8), else as one masked vector (63 would be six pieces, four narrower than a ymm).
    The analytic model costs the same."""
    return active % max(register_lanes // 2, 1) == 0


def tail_pieces(active: int) -> list[tuple[int, int]]:
    """(first lane, lanes) of the power-of-two pieces of `active` lanes (56: 32, 16 and 8; 7: 4,
    2 and 1): what a tail runs as when it runs `in_pieces`, what a masked tail's accumulator is
    loaded and stored in; the analytic model costs the same pieces."""
    pieces, start = [], 0
    for bit in reversed(range(active.bit_length())):
        if active & (1 << bit):
            pieces.append((start, 1 << bit))
            start += 1 << bit
    return pieces


def _packed_entry(module: ir.Module, chunk: ir.Function, name: str) -> None:
    """`name(ptr args, i64 lo, i64 hi)` calling `chunk(args[0], args[1], ..., lo, hi)`."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), name)
    fn.attributes.add("nounwind")
    args, lo, hi = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    pointers = [b.load(b.gep(args, [ir.Constant(I64, i)], inbounds=True, source_etype=PTR),
                       typ=PTR) for i in range(len(chunk.args) - 2)]
    b.call(chunk, [*pointers, lo, hi])
    b.ret_void()


def _comparisons(c: Expr) -> list[Cmp]:
    """The comparisons a condition ands."""
    if isinstance(c, Cmp) and c.op == "and":
        return _comparisons(c.a) + _comparisons(c.b)
    return [c]  # type: ignore[list-item]


def _blocks_under(loop: Loop) -> list[Block]:
    out: list[Block] = []
    for n in loop.body:
        if isinstance(n, Block):
            out.append(n)
        else:
            out += _blocks_under(n)  # type: ignore[arg-type]
    return out


def body_copies(loop: Loop, register_lanes: int, most: int | None = None) -> int:
    """Copies of its body a serial loop runs per step: more than one only for an innermost
    serial loop (everything inside it unrolled or vectorized) whose body is small. Its
    increment, compare and branch then come once per copies: on a core whose issue slots a
    register tile's FMAs, loads and broadcasts nearly fill, they can cost a tenth of the time
    or more (docs/ARCHITECTURE.md §7 "Copies of small loop bodies"). At most `most` copies
    (`CompileOptions.body_copies`), by default MAX_COPIES."""
    if loop.kind != LoopKind.SERIAL:
        return 1
    work = _straight_work(loop.body, register_lanes)
    copies = MAX_COPIES if most is None else most
    while copies > 1 and (work is None or work * copies > COPY_BUDGET
                          or loop.extent < 2 * copies):
        copies //= 2
    return copies


def _straight_work(nodes: tuple[Node, ...], register_lanes: int) -> int | None:
    """Block evaluations the nodes emit, a vector loop's as many as its registers; None when a
    serial or parallel loop of more than one step is inside (the body is not straight-line)."""
    total = 0
    for n in nodes:
        if isinstance(n, Block):
            total += 1
            continue
        inner = _straight_work(n.body, register_lanes)
        if inner is None:
            return None
        if isinstance(n, Loop):
            if n.kind == LoopKind.UNROLL:
                inner *= n.extent
            elif n.kind == LoopKind.VECTOR:
                inner *= -(-n.extent // register_lanes)
            elif n.extent > 1:
                return None
        total += inner
    return total


def _emitted(nodes: tuple[Node, ...]) -> int:
    """Blocks the nodes emit, an unrolled loop's body once per step: what a peeled copy costs."""
    total = 0
    for n in nodes:
        if isinstance(n, Block):
            total += 1
        elif isinstance(n, Loop):
            total += (n.extent if n.kind == LoopKind.UNROLL else 1) * _emitted(n.body)
        else:
            total += _emitted(n.body)
    return total


def _place(b: ir.IRBuilder, whole: ir.Value, piece: ir.Value, start: int) -> ir.Value:
    """`whole` with lanes start.. replaced by `piece` (narrower; shufflevector's operands share
    one type, so the piece is widened first)."""
    n, k = whole.type.count, piece.type.count
    wide = b.shuffle_vector(piece, ir.Constant(piece.type, ir.Undefined), ir.Constant(
        ir.VectorType(I32, n), list(range(k)) + [k] * (n - k)))
    return b.shuffle_vector(whole, wide, ir.Constant(ir.VectorType(I32, n), [
        n + lane - start if start <= lane < start + k else lane for lane in range(n)]))


def _lanes_of(b: ir.IRBuilder, vector: ir.Value, start: int, width: int) -> ir.Value:
    """Lanes start..start + width of `vector` (itself when that is all of it; a constant of
    a constant)."""
    if start == 0 and width == vector.type.count:
        return vector
    if isinstance(vector, ir.Constant) and isinstance(vector.constant, list):
        return ir.Constant(ir.VectorType(vector.type.element, width),
                           vector.constant[start:start + width])
    return b.shuffle_vector(vector, ir.Constant(vector.type, ir.Undefined), ir.Constant(
        ir.VectorType(I32, width), list(range(start, start + width))))


def _every_lane(mask: ir.Value, value: bool) -> bool:
    """Whether `mask` is a constant with every lane `value`."""
    return isinstance(mask, ir.Constant) and isinstance(mask.constant, list) \
        and all(bool(getattr(lane, "constant", lane)) == value for lane in mask.constant)


def _concat(b: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    """Vectors of one type joined end to end (pairwise: shufflevector joins two)."""
    while len(parts) > 1:
        n = parts[0].type.count
        joined = ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n)))
        parts = [b.shuffle_vector(x, y, joined) for x, y in zip(parts[::2], parts[1::2])]
    return parts[0]


def _masked_load(module: ir.Module, ty: ir.VectorType) -> ir.Function:
    # The (ptr, i32 align, mask, passthru) form; LLVM's IR reader upgrades it to its current one.
    return declare(module, f"llvm.masked.load.v{ty.count}f32.p0", ty,
                      [PTR, I32, ir.VectorType(I1, ty.count), ty])


def _masked_store(module: ir.Module, ty: ir.VectorType) -> ir.Function:
    # The (value, ptr, i32 align, mask) form, upgraded by LLVM's IR reader like the load's.
    return declare(module, f"llvm.masked.store.v{ty.count}f32.p0", ir.VoidType(),
                      [ty, PTR, I32, ir.VectorType(I1, ty.count)])


def _scatter(module: ir.Module, ty: ir.VectorType) -> ir.Function:
    return declare(module, f"llvm.masked.scatter.v{ty.count}f32.v{ty.count}p0", ir.VoidType(),
                      [ty, ir.VectorType(PTR, ty.count), I32, ir.VectorType(I1, ty.count)])


def _gather(module: ir.Module, ty: ir.VectorType) -> ir.Function:
    return declare(module, f"llvm.masked.gather.v{ty.count}f32.v{ty.count}p0", ty,
                      [ir.VectorType(PTR, ty.count), I32, ir.VectorType(I1, ty.count), ty])


__all__ = ["Segment", "body_copies", "lower"]
