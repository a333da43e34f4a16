"""The manual schedule API: primitives that transform a loop program and record what they did.

    sch = Schedule(naive_program(comp))
    sch.split("C.i", [64, 8])                     # -> ["C.i.0", "C.i.1"]
    sch.reorder("C.i.0", "C.k", "C.i.1")
    sch.fuse("C.init", at="C.i.0")
    sch.vectorize("C.j")

Every primitive builds a new program, validates it with `legality.check_program` and only then
replaces the current one, so a rejected step (ScheduleError) leaves the schedule unchanged. Each
accepted step is appended to `trace` as {"op", "args"}; replaying a trace through the same
primitives gives the identical program (the cross-check with the e-graph's derivations).

See docs/ARCHITECTURE.md §6 Programs and schedules.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .expr import Const, Expr, Load, Var, free_vars, substitute, to_str, transform
from .ir import (
    KIND_WORD,
    Alloc,
    Binding,
    Block,
    Buffer,
    Loop,
    LoopKind,
    Node,
    Program,
    Scope,
    map_nodes,
    nest,
    walk,
)
from .legality import (
    MAX_UNROLL,
    ScheduleError,
    check_program,
    loop_binding,
    reduce_loops,
    sites,
)
from .te import REDUCERS, Axis

# The most elements (1 MiB of float32) a partial-result buffer of `rfactor` may hold: partials
# share a long reduction of a small output (a row statistic, a GEMV's vector) among threads;
# a large output has spatial loops enough to share, and copies of it would cost more memory
# traffic than the reduction saves.
MAX_PARTIAL_ELEMENTS = 1 << 18

# The widest panel `pack` copies as one vector (16 zmm, 32 ymm): a wider one stays a loop,
# whose straight-line vector would only lengthen compilation.
MAX_VECTOR_COPY = 256

# Parameter names of each primitive, as they appear in a trace step's "args".
PRIMITIVES: dict[str, tuple[str, ...]] = {
    "split": ("loop", "factors"),
    "reorder": ("loops",),
    "fuse": ("block", "at"),
    "inline": ("block",),
    "vectorize": ("loop",),
    "unroll": ("loop",),
    "parallel": ("loop",),
    "cache_write": ("block", "at"),
    "pack": ("block", "buffer", "dim", "factor"),
    "rfactor": ("block", "loop"),
}
TRACE_VERSION = 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What each argument of a trace step must be, checked before any step runs: a string where a
# list belongs would otherwise be read as its characters ("C.i" as loops "C", ".", "i").
_ARGUMENTS: dict[str, tuple[str, Callable[[object], bool]]] = {
    **{name: ("a name (a string)", lambda v: isinstance(v, str))
       for name in ("loop", "block", "at", "buffer")},
    "loops": ("a list of loop names", lambda v: isinstance(v, list)
              and all(isinstance(x, str) for x in v)),
    "factors": ("a list of integers", lambda v: isinstance(v, list) and all(map(_is_int, v))),
    "dim": ("an integer", _is_int),
    "factor": ("an integer", _is_int),
}


class Schedule:
    """A program under transformation, with the trace of primitives applied to it."""

    def __init__(self, program: Program, *, checked: bool = True):
        """`checked=False` skips the whole-program check after each primitive (a caller that
        checks the final program itself, such as `eqsched.egraph.derive.realize`)."""
        self._checked = checked
        if checked:
            check_program(program)
        self._program = program
        self._trace: list[dict] = []

    def fork(self) -> Schedule:
        """An independent copy (same program and trace): a trial that can be dropped, since the
        primitives have no undo."""
        copy = Schedule.__new__(Schedule)
        copy._checked, copy._program, copy._trace = self._checked, self._program, list(self._trace)
        return copy

    @property
    def program(self) -> Program:
        return self._program

    @property
    def trace(self) -> list[dict]:
        return json.loads(json.dumps(self._trace))

    @staticmethod
    def replay(program: Program, steps: list[dict], *, checked: bool = True) -> Schedule:
        """`steps` applied to `program`; `checked=False` for a trace already checked when it was
        recorded (a learned model replays every stored measurement: a fifth of the time)."""
        sch = Schedule(program, checked=checked)
        for n, step in enumerate(_validated_steps(steps)):
            args = step["args"]
            try:
                if step["op"] == "reorder":
                    sch.reorder(*args["loops"])
                else:
                    getattr(sch, step["op"])(**args)
            except ScheduleError as e:
                raise ScheduleError(f"trace step {n} ({step['op']}): {e}") from None
        return sch

    # ---- loops ----------------------------------------------------------------------------

    def split(self, loop: str, factors: list[int]) -> list[str]:
        """Split `loop` into nested pieces `loop.0` (outermost) ... with the given extents. They
        may leave a remainder when `loop` is its axis's outermost piece: `[-1, 16]` of 127 is
        8 x 16, and the points past 127 do not run."""
        lp = self._loop(loop)
        if lp.kind != LoopKind.SERIAL:
            raise ScheduleError(f"split of {loop}: it is {KIND_WORD[lp.kind]}; split before "
                                "annotating")
        sizes = _resolve_factors(loop, lp.extent, list(factors))
        if math.prod(sizes) != lp.extent:
            _check_remainder_at_top(f"split of {loop} (extent {lp.extent}) by {list(factors)}",
                                    loop, lp.body)
        names = [f"{loop}.{n}" for n in range(len(sizes))]
        strides = [math.prod(sizes[n + 1:]) for n in range(len(sizes))]

        def rebind(node: Node) -> Node | None:
            if isinstance(node, Block) and loop_binding(node, loop):
                return _rebind(node, {loop: [(nm, s) for nm, s in zip(names, strides)]})
            return None

        # Only blocks under the loop can bind it.
        pieces = [(nm, f, LoopKind.SERIAL) for nm, f in zip(names, sizes)]
        self._commit("split", {"loop": loop, "factors": sizes},
                     self._program.replacing_loop(loop, nest(pieces, map_nodes(lp.body, rebind))))
        return names

    def reorder(self, *loops: str) -> None:
        """Put `loops`, which lie on one chain of single-child nested loops, into this order."""
        if len(loops) < 2 or len(set(loops)) != len(loops):
            raise ScheduleError(f"reorder {list(loops)}: needs two or more distinct loops")
        for name in loops:
            self._loop(name)
        prog = self._program
        by_depth = sorted(loops, key=lambda n: len(prog.enclosing(n)))
        for outer, inner in zip(by_depth, by_depth[1:]):
            if outer not in [lp.name for lp in prog.enclosing(inner)]:
                raise ScheduleError(f"reorder: {inner} is not nested in {outer}")
        around = prog.enclosing(by_depth[-1])
        top = [lp.name for lp in around].index(by_depth[0])
        chain = around[top:] + [prog.loop(by_depth[-1])]
        for lp in chain[:-1]:
            if len(lp.body) != 1:
                raise ScheduleError(
                    f"reorder: {lp.name} has {len(lp.body)} children; the loops from "
                    f"{by_depth[0]} to {by_depth[-1]} must form a single chain"
                )
        slots = [n for n, lp in enumerate(chain) if lp.name in loops]
        new_chain = list(chain)
        for slot, name in zip(slots, loops):
            new_chain[slot] = prog.loop(name)
        body = chain[-1].body
        for lp in reversed(new_chain):
            body = (replace(lp, body=body),)
        self._commit("reorder", {"loops": list(loops)},
                     prog.replacing_loop(chain[0].name, body))

    def vectorize(self, loop: str) -> None:
        self._annotate("vectorize", loop, LoopKind.VECTOR)

    def unroll(self, loop: str) -> None:
        self._annotate("unroll", loop, LoopKind.UNROLL)

    def parallel(self, loop: str) -> None:
        """Share `loop`'s steps among threads: a root loop, or the only statement of a
        parallel loop (the nest's steps are then shared as one, `ir.parallel_nest`)."""
        self._annotate("parallel", loop, LoopKind.PARALLEL)

    def _annotate(self, op: str, loop: str, kind: LoopKind) -> None:
        lp = self._loop(loop)
        self._commit(op, {"loop": loop},
                     self._program.replacing_loop(loop, (Loop(lp.name, lp.extent, kind, lp.body),)))

    # ---- blocks ---------------------------------------------------------------------------

    def fuse(self, block: str, at: str) -> None:
        """Rebuild the root-level nest of `block` under loop `at` (TVM compute_at and
        reverse_compute_at): the loops from the root to `at` now also bind the block's axes."""
        prog = self._program
        blk = self._block(block)
        at_loop = self._loop(at)
        root = _root_nest(prog, block)
        if any(lp.name == at for lp, _ in _loops_in(root)):
            raise ScheduleError(f"fuse {block} at {at}: {at} is in {block}'s own nest")
        chain = prog.enclosing(at) + [at_loop]
        targets = [n for n, _ in walk(at_loop.body) if isinstance(n, Block)]
        produces = [(t, ld) for t in targets for ld in t.reads() if ld.buffer == blk.buffer]
        consumes = [(t, ld) for t in targets for ld in blk.reads()
                    if ld.buffer == t.buffer and t.buffer != blk.buffer]
        if produces and consumes:
            raise ScheduleError(f"fuse {block} at {at}: {block} both feeds and reads blocks there")
        if not produces and not consumes:
            raise ScheduleError(f"fuse {block} at {at}: no block under {at} reads or writes "
                                f"what {block} uses")
        where = f"fuse {block} at {at}"
        mapping = _map_chain(where, blk, chain, produces, consumes)
        new_blk, loops = _rebuild_under(blk, chain, mapping, _nest_prefix(blk), prog)
        new_nest = nest(loops, (new_blk,))

        body = new_nest + at_loop.body if produces else at_loop.body + new_nest
        placed = prog.replacing_loop(at, (Loop(at, at_loop.extent, at_loop.kind, body),))
        self._commit("fuse", {"block": block, "at": at},
                     placed.with_body(tuple(n for n in placed.body if n is not root)))

    def inline(self, block: str) -> None:
        """Substitute an elementwise intermediate's value into its readers; drop its buffer."""
        prog = self._program
        blk = self._block(block)
        buf = prog.buffer(blk.buffer)
        if blk.reduce is not None or len([b for b in prog.blocks() if b.buffer == buf.name]) > 1:
            raise ScheduleError(
                f"inline {block}: {buf.name} is a reduction (or has several writers)"
            )
        if buf.scope != Scope.GLOBAL:
            raise ScheduleError(f"inline {block}: only intermediates can be inlined, "
                                f"{buf.name} is {buf.scope.value}")
        axes = [ix.name for ix in blk.indices if isinstance(ix, Var)]
        if len(axes) != len(blk.indices) or sorted(axes) != sorted(a.name for a in blk.axes):
            raise ScheduleError(f"inline {block}: its store {buf.name}"
                                f"[{', '.join(map(to_str, blk.indices))}] is not one axis per dim")

        def expand(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.buffer == buf.name:
                return substitute(blk.value, dict(zip(axes, e.indices)))
            return None

        def rewrite(node: Node) -> Node | tuple[Node, ...] | None:
            if isinstance(node, Block):
                if node.name == block:
                    return ()
                return replace(node, value=transform(node.value, expand))
            if isinstance(node, (Loop, Alloc)) and not node.body:
                return ()
            return None

        buffers = tuple(b for b in prog.buffers if b.name != buf.name)
        self._commit("inline", {"block": block},
                     prog.with_body(map_nodes(prog.body, rewrite), buffers))

    def cache_write(self, block: str, at: str) -> str:
        """Accumulate the stage written by `block` in a local tile allocated under `at`, copied in
        (unless its init is there too) and out around it. Returns the local buffer's name."""
        prog = self._program
        blk = self._block(block)
        at_loop = self._loop(at)
        around = prog.enclosing(block)
        names = [lp.name for lp in around]
        if at not in names:
            raise ScheduleError(f"cache_write {block} at {at}: {block} is not under {at}")
        stage, target = blk.stage, blk.buffer
        local = f"{stage}.local"
        if any(b.name == local for b in prog.buffers):
            raise ScheduleError(f"cache_write {block} at {at}: {local} already exists")
        kinds = {a.name: a.kind for a in blk.axes}
        inner = []  # (loop, axis, stride) of the spatial loops under `at`, in nest order
        for lp in around[names.index(at) + 1:]:
            bound = loop_binding(blk, lp.name)
            if bound and kinds[bound[0]] == "spatial":
                inner.append((lp, *bound))
        if not inner:
            raise ScheduleError(f"cache_write {block} at {at}: no spatial loop of {stage} "
                                f"under {at} to make a tile of")
        tile_index = tuple(_tile_index(axis, stride, lp.extent) for lp, axis, stride in inner)
        members = [n for n, _ in walk(at_loop.body) if isinstance(n, Block)]
        for other in members:
            if other.stage != stage and target in {ld.buffer for ld in other.reads()}:
                raise ScheduleError(f"cache_write {block} at {at}: {other.name} under {at} "
                                    f"reads {target}")
        has_init = any(b.stage == stage and b.reduce is None for b in members)
        needs_copy_in = any(b.stage == stage and b.reduce for b in members) and not has_init
        spatial = tuple(a for a in blk.axes if a.kind == "spatial")

        def copy(kind: str, buffer: str, indices: tuple, value: Expr) -> tuple[Node, ...]:
            prefix = f"{stage}.{kind}"
            loops, pieces = [], {}
            for lp, axis, stride in inner:
                name = f"{prefix}.{axis}{_piece_suffix(lp.name, axis)}"
                loop_kind = LoopKind.SERIAL if lp.kind == LoopKind.PARALLEL else lp.kind
                loops.append((name, lp.extent, loop_kind))
                pieces.setdefault(axis, []).append((name, stride))
            binds = tuple(
                Binding(a.name, tuple((lp, s) for lp, s in blk.binding(a.name).terms
                                      if lp not in {x.name for x, _, _ in inner})
                        + tuple(pieces.get(a.name, ())))
                for a in spatial
            )
            return nest(loops, (Block(prefix, stage, spatial, binds, buffer, indices, value),))

        copy_in = () if not needs_copy_in else copy("read", local, tile_index,
                                                    Load(target, blk.indices))
        copy_out = copy("write", target, blk.indices, Load(local, tile_index))

        def redirect(node: Node) -> Node | None:
            if isinstance(node, Block) and node.stage == stage and node.buffer == target:
                return replace(node, buffer=local, indices=tile_index)
            return None

        def wrap(node: Node) -> Node | None:
            if isinstance(node, Loop) and node.name == at:
                inside = copy_in + map_nodes(node.body, redirect) + copy_out
                return replace(node, body=(Alloc(local, inside),))
            return None

        shape = tuple(lp.extent for lp, _, _ in inner)
        buffers = prog.buffers + (Buffer(local, shape, Scope.LOCAL),)
        self._commit("cache_write", {"block": block, "at": at},
                     prog.with_body(map_nodes(prog.body, wrap), buffers))
        return local

    def pack(self, block: str, buffer: str, dim: int, factor: int) -> str:
        """Copy `buffer` into panels of `factor` along `dim` (a new innermost dimension) before
        `block`'s nest, and make `block` read the panels. Returns the packed buffer's name.

        A factor that does not divide the dimension pads it (TVM's pad_einsum, oneDNN's padded
        blocks): the panels number the ceiling, and the copy's source axis is split with a
        remainder, so the last panel is copied only as far as the buffer goes. The pad is never
        written and never read: a reader's own axis guard keeps it inside the buffer's extent.
        A copy along the innermost dimension runs in the source's order, each run one vector.
        When the reader's root nest is parallel, so is the copy's outermost loop."""
        prog = self._program
        blk = self._block(block)
        where = f"pack {buffer} for {block}"
        if buffer not in {ld.buffer for ld in blk.reads()} or buffer == blk.buffer:
            raise ScheduleError(f"{where}: {block} does not read {buffer}")
        shape = prog.buffer(buffer).shape
        if not 0 <= dim < len(shape):
            raise ScheduleError(f"{where}: dim {dim} is not a dimension of {list(shape)}")
        if isinstance(factor, bool) or not isinstance(factor, int) or factor <= 0:
            raise ScheduleError(f"{where}: the factor must be a positive integer, not {factor!r}")
        if factor >= 2 * shape[dim]:
            raise ScheduleError(f"{where}: a factor of {factor} pads dimension {dim} (extent "
                                f"{shape[dim]}) to more than twice its extent")
        packed = f"{buffer}_packed"
        if any(b.name == packed for b in prog.buffers):
            raise ScheduleError(f"{where}: {packed} already exists")
        others = [d for d in range(len(shape)) if d != dim]
        panels = -(-shape[dim] // factor)
        pshape = (panels,) + tuple(shape[d] for d in others) + (factor,)
        loops = [f"{packed}.p{n}" for n in range(len(pshape))]
        if shape[dim] % factor == 0:
            axes = tuple(Axis(f"p{n}", e) for n, e in enumerate(pshape))
            p = [a.var for a in axes]
            source = [p[1 + others.index(d)] if d != dim else p[0] * factor + p[-1]
                      for d in range(len(shape))]
            copy_blk = Block(packed, packed, axes,
                             tuple(Binding(a.name, ((lp, 1),)) for a, lp in zip(axes, loops)),
                             packed, tuple(p), Load(buffer, tuple(source)))
        else:
            # The packed dimension stays one axis `q` of its own extent, split over the panel
            # loop and the lane loop with a remainder: the copy stops at the buffer's end.
            q = Axis("q", shape[dim])
            inner = [Axis(f"p{1 + n}", shape[d]) for n, d in enumerate(others)]
            binds = ((Binding("q", ((loops[0], factor), (loops[-1], 1))),)
                     + tuple(Binding(a.name, ((lp, 1),)) for a, lp in zip(inner, loops[1:-1])))
            source = [inner[others.index(d)].var if d != dim else q.var for d in range(len(shape))]
            copy_blk = Block(packed, packed, (q, *inner), binds, packed,
                             (q.var // factor, *(a.var for a in inner), q.var % factor),
                             Load(buffer, tuple(source)))
        # Packing along an outer dimension transposes: each panel row gathers `factor` elements
        # a whole row of `buffer` apart. Unrolled, those loads issue together instead of one per
        # loop iteration behind the store before it (docs/ARCHITECTURE.md §17.6). Packing along
        # the innermost dimension copies contiguous runs: one vector each (LLVM's own
        # vectorizers are off, so a plain loop is a scalar copy, run on every call), in the
        # source's order, the panel loop inside its rows (panel by panel it would read a short
        # run of every row, a whole row apart).
        kinds = [LoopKind.SERIAL] * len(pshape)
        order = list(range(len(pshape)))
        if dim != len(shape) - 1:
            if factor <= MAX_UNROLL:
                kinds[-1] = LoopKind.UNROLL
        else:
            if factor <= MAX_VECTOR_COPY:
                kinds[-1] = LoopKind.VECTOR
            order = [*order[1:-1], 0, order[-1]]
        root = _root_nest(prog, block, alone=False)
        # The copy runs on every call before the reader's nest; when that nest shares its work
        # out across threads, a serial copy would leave the other cores waiting for one. The
        # copy's steps of any loop but the lanes' write disjoint elements, so its outermost loop
        # is parallel like the reader's.
        if isinstance(root, Loop) and root.kind == LoopKind.PARALLEL and pshape[order[0]] > 1:
            kinds[order[0]] = LoopKind.PARALLEL
        copy_nest = nest([(loops[n], pshape[n], kinds[n]) for n in order], (copy_blk,))

        def repack(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.buffer == buffer:
                ix = e.indices
                return Load(packed, (ix[dim] // factor,) + tuple(ix[d] for d in others)
                            + (ix[dim] % factor,))
            return None

        def redirect(node: Node) -> Node | None:
            if isinstance(node, Block) and node.name == block:
                return replace(node, value=transform(node.value, repack))
            return None

        body: list[Node] = []
        for n in prog.body:
            body += list(copy_nest) if n is root else []
            body.append(n)
        buffers = prog.buffers + (Buffer(packed, pshape, Scope.GLOBAL),)
        self._commit("pack", {"block": block, "buffer": buffer, "dim": dim, "factor": factor},
                     prog.with_body(map_nodes(tuple(body), redirect), buffers))
        return packed

    def rfactor(self, block: str, loop: str) -> str:
        """Factor a reduction along `loop`, a piece of one of `block`'s reduce axes (Ansor's
        rfactor, TVM's `Schedule.rfactor` with factor_axis 0): each of its iterations
        accumulates into a partial result of its own, `<stage>_rf[r, ...]`, and a nest reduces
        the partials into the stage's buffer after. The loop then binds no accumulation: it
        may run in parallel or be vectorized. Returns the partial buffer's name.

        `loop` is either the root-level loop over the outermost piece of the axis (the partials
        of an iteration are initialized at the start of its body, so threads share them out),

            for C.k.0 in range(4):                 for C.k.0 in range(4):
              for C.k.1 in range(256):               C.rf_init: C_rf[C.k.0, i] = 0
                C[i] += A[i, k]             ->        for C.k.1 in range(256):
                                                        C_rf[k // 256, i] += A[i, k]
                                                   for C.rf_final.r, C.rf_final.i:
                                                     C[i] += C_rf[r, i]

        or a loop below the root over the innermost piece of a split axis, the lanes of a
        vectorized reduction (TVM's rfactor of the inner piece): each lane accumulates a
        partial of its own, initialized by a nest before the root nest that holds the loop,

            for C.k.0 in range(64):                for C.rf_init.r, C.rf_init.i: C_rf[r, i] = 0
              for C.k.1 in range(16):      ->      for C.k.0 in range(64):
                C[i] += A[i, k]                      for C.k.1 in range(16):
                                                       C_rf[k % 16, i] += A[i, k]
                                                   for C.rf_final.r, C.rf_final.i: (as above)

        The partial axis is the buffer's first dimension, so each partial is one contiguous
        copy of the output (a thread's stores stay apart from another's)."""
        prog = self._program
        blk = self._block(block)
        lp = self._loop(loop)
        where = f"rfactor {block} along {loop}"
        if blk.reduce not in REDUCERS:
            raise ScheduleError(f"{where}: {block} is not a sum or max reduction")
        if block not in {n.name for n, _ in walk(lp.body) if isinstance(n, Block)}:
            raise ScheduleError(f"{where}: {block} is not under {loop}")
        bound = loop_binding(blk, loop)
        if bound is None or blk.axis(bound[0]).kind != "reduce":
            raise ScheduleError(f"{where}: {loop} binds no reduce axis of {block}")
        axis, stride = bound
        strides = [s for _, s in blk.binding(axis).terms]
        lanes = bool(prog.enclosing(loop))
        if lanes and (stride != 1 or len(strides) < 2):
            raise ScheduleError(f"{where}: {loop} is below the root but not the innermost "
                                f"piece of a split of axis {axis}; only that piece (lanes) or "
                                "a root-level outermost piece can index the partials")
        if not lanes and any(s > stride for s in strides):
            raise ScheduleError(f"{where}: {loop} is an inner piece of axis {axis}; only its "
                                "outermost piece can index the partials")
        stage = prog.buffer(blk.stage) if blk.stage in {b.name for b in prog.buffers} else None
        if stage is None or blk.buffer != stage.name:
            raise ScheduleError(f"{where}: {block} does not write its stage's buffer "
                                f"{blk.stage} (rfactor before cache_write)")
        partial = f"{blk.stage}_rf"
        if any(b.name == partial for b in prog.buffers):
            raise ScheduleError(f"{where}: {partial} already exists")
        # A lane piece wider than its whole axis (a padded vector over a 40-long row) has a
        # partial per point only: lanes past the axis never run.
        partials = min(lp.extent, blk.axis(axis).extent) if lanes else lp.extent
        shape = (partials,) + stage.shape
        if math.prod(shape) > MAX_PARTIAL_ELEMENTS:
            raise ScheduleError(f"{where}: the partials {partial}{list(shape)} would hold more "
                                f"than {MAX_PARTIAL_ELEMENTS} elements")
        r = Axis("r", partials)
        spatial = tuple(a for a in blk.axes if a.kind == "spatial")
        if r.name in {a.name for a in blk.axes}:
            r = Axis(f"{blk.stage}_r", partials)
        if lanes:
            part = Var(axis) % lp.extent
        else:
            part = Var(axis) if stride == 1 else Var(axis) // stride
        update = replace(blk, buffer=partial, indices=(part,) + blk.indices)

        def own_nest(name: str, axes: tuple[Axis, ...], outer: dict[str, str], store: str,
                     indices: tuple[Expr, ...], value: Expr, reduce: str | None):
            loops = [(f"{name}.{a.name}", a.extent, LoopKind.SERIAL) for a in axes
                     if a.name not in outer]
            binds = tuple(Binding(a.name, ((outer.get(a.name, f"{name}.{a.name}"), 1),))
                          for a in axes)
            return nest(loops, (Block(name, blk.stage, axes, binds, store, indices, value,
                                      reduce),))

        init = own_nest(f"{blk.stage}.rf_init", (replace(r, kind="spatial"),) + spatial,
                        {} if lanes else {r.name: loop}, partial, (r.var,) + blk.indices,
                        Const(REDUCERS[blk.reduce], "float32"), None)
        final = own_nest(f"{blk.stage}.rf_final", (replace(r, kind="reduce"),) + spatial, {},
                         blk.stage, blk.indices, Load(partial, (r.var,) + blk.indices),
                         blk.reduce)

        def redirect(node: Node) -> Node | None:
            return update if isinstance(node, Block) and node.name == block else None

        holder = _root_nest(prog, block, alone=False) if lanes else lp
        body: list[Node] = []
        for n in prog.body:
            if n is not holder:
                body.append(n)
            elif lanes:
                body += [*init, *map_nodes((n,), redirect), *final]
            else:
                n = Loop(lp.name, lp.extent, lp.kind, init + map_nodes(lp.body, redirect))
                body += [n, *final]
        buffers = prog.buffers + (Buffer(partial, shape, Scope.GLOBAL),)
        self._commit("rfactor", {"block": block, "loop": loop},
                     prog.with_body(tuple(body), buffers))
        return partial

    # ---- bookkeeping ----------------------------------------------------------------------

    def _loop(self, name: str) -> Loop:
        try:
            return self._program.loop(name)
        except KeyError:
            raise ScheduleError(f"no loop named {name!r} in {self._program.name}") from None

    def _block(self, name: str) -> Block:
        try:
            return self._program.block(name)
        except KeyError:
            raise ScheduleError(f"no block named {name!r} in {self._program.name}") from None

    def _commit(self, op: str, args: dict, prog: Program) -> None:
        try:
            if self._checked:
                check_program(prog)
        except ScheduleError as e:
            shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
            raise ScheduleError(f"{op}({shown}) is illegal: {e}") from None
        self._program = prog
        self._trace.append({"op": op, "args": args})


# ---- helpers --------------------------------------------------------------------------------


def _resolve_factors(loop: str, extent: int, factors: list[int]) -> list[int]:
    """The pieces' extents, outermost first. They may overshoot `extent` (a remainder: `-1` is
    the ceiling, `[-1, 16]` of 127 is 8 x 16) when only the outermost piece's last iteration is
    partial; the block's axis extent then skips the points past the end."""
    where = f"split of {loop} (extent {extent}) by {factors}"
    if not factors or any(not isinstance(f, int) or isinstance(f, bool) for f in factors):
        raise ScheduleError(f"{where}: factors must be a non-empty list of integers")
    if factors.count(-1) > 1 or any(f == 0 or f < -1 for f in factors):
        raise ScheduleError(f"{where}: factors must be positive, with at most one -1")
    known = math.prod(f for f in factors if f != -1)
    sizes = [-(-extent // known) if f == -1 else f for f in factors]
    total = math.prod(sizes)
    if total < extent:
        if extent % known:
            raise ScheduleError(f"{where}: {known} does not divide {extent}")
        raise ScheduleError(f"{where}: the factors multiply to {known}, not {extent} "
                            "(use -1 to infer one)")
    if (sizes[0] - 1) * (total // sizes[0]) >= extent:  # the outermost piece's last step is empty
        raise ScheduleError(f"{where}: {known} does not divide {extent}")
    return sizes


def _check_remainder_at_top(where: str, loop: str, body: tuple[Node, ...]) -> None:
    """A split that leaves a remainder must split the outermost piece of every axis it
    iterates: an inner piece's overshoot would run into the next outer step."""
    for blk in (n for n, _ in walk(body) if isinstance(n, Block)):
        bound = loop_binding(blk, loop)
        if bound is None:
            continue
        axis, stride = bound
        if any(s > stride for _, s in blk.binding(axis).terms):
            raise ScheduleError(f"{where}: {loop} is an inner piece of axis {axis} of "
                                f"{blk.name}; only an axis's outermost piece may leave a "
                                "remainder")


def _rebind(blk: Block, pieces: dict[str, list[tuple[str, int]]]) -> Block:
    """Replace each term (loop, s) whose loop is in `pieces` by its pieces' terms scaled by s."""
    binds = []
    for b in blk.bindings:
        terms: list[tuple[str, int]] = []
        for lp, s in b.terms:
            terms += [(p, s * ps) for p, ps in pieces[lp]] if lp in pieces else [(lp, s)]
        binds.append(replace(b, terms=tuple(terms)))
    return replace(blk, bindings=tuple(binds))


def _loops_in(node: Node):
    return ((n, p) for n, p in walk((node,)) if isinstance(n, Loop))


def _root_nest(prog: Program, block: str, alone: bool = True) -> Node:
    """The root-level node containing `block`; with `alone`, it must contain nothing else."""
    for root in prog.body:
        inside = [n for n, _ in walk((root,)) if isinstance(n, (Block, Alloc))]
        if any(isinstance(n, Block) and n.name == block for n in inside):
            if alone and len(inside) != 1:
                raise ScheduleError(f"{block} is not alone in its root-level nest")
            return root
    raise ScheduleError(f"no block named {block!r}")


def _nest_prefix(blk: Block) -> str:
    """The prefix of the block's loop names: `C` for `C.update` and `D`, `C.init` for the init."""
    return blk.stage if blk.name == f"{blk.stage}.update" else blk.name


def _piece_suffix(loop: str, axis: str) -> str:
    """Which piece of its axis a loop is: `C.i.1` -> `.1`, `C.init.j` -> ``."""
    m = re.search(rf"\.{re.escape(axis)}((?:\.\d+)*)$", loop)
    if m is None:
        raise ScheduleError(f"loop {loop} is not named after axis {axis}")
    return m.group(1)


def _tile_index(axis: str, stride: int, extent: int) -> Expr:
    e: Expr = Var(axis)
    return (e if stride == 1 else e // stride) % extent


def _map_chain(where: str, blk: Block, chain: list[Loop],
               produces: list[tuple[Block, Load]], consumes: list[tuple[Block, Load]]):
    """For each loop of the chain: (axis of blk, stride, related block, its axis). The relation is
    elementwise through the buffer: the related block and blk index one dimension by plain axes."""
    mapping: dict[str, tuple[str, int, Block, str]] = {}
    for lp in chain:
        found = []
        for other, ld in produces + consumes:
            bound = loop_binding(other, lp.name)
            if bound is None:
                continue
            other_axis, stride = bound
            # The dimension the other block indexes by this axis, read off the side it owns.
            own = ld.indices if produces else other.indices
            mine = blk.indices if produces else ld.indices
            dims = [d for d, ix in enumerate(own) if ix == Var(other_axis)]
            if not dims:
                if lp.name in reduce_loops(other):
                    raise ScheduleError(f"{where}: would put {blk.name} inside "
                                        f"{other.name}'s reduce loop {lp.name}")
                if any(other_axis in free_vars(ix) for ix in own):
                    raise ScheduleError(f"{where}: {other.name} reads {ld.buffer}"
                                        f"[{', '.join(map(to_str, own))}], not elementwise in "
                                        f"loop {lp.name}")
                continue
            ix = mine[dims[0]]
            axis_names = {a.name for a in blk.axes}
            if not (isinstance(ix, Var) and ix.name in axis_names):
                raise ScheduleError(f"{where}: {blk.name} accesses {ld.buffer}"
                                    f"[{', '.join(map(to_str, mine))}], not elementwise in "
                                    f"loop {lp.name} (axis {other_axis} of {other.name})")
            if blk.axis(ix.name).extent != other.axis(other_axis).extent:
                raise ScheduleError(f"{where}: axis {ix.name} of {blk.name} and {other_axis} of "
                                    f"{other.name} differ in extent")
            found.append((ix.name, stride, other, other_axis))
        if not found:
            raise ScheduleError(f"{where}: loop {lp.name} has no corresponding axis of {blk.name}")
        if len({(a, s) for a, s, _, _ in found}) > 1:
            raise ScheduleError(f"{where}: loop {lp.name} corresponds to several axes of "
                                f"{blk.name}")
        mapping[lp.name] = found[0]
    return mapping


def _rebuild_under(blk: Block, chain: list[Loop], mapping: dict, prefix: str, prog: Program):
    """The block rebound to the chain loops plus its own loops for the remaining pieces."""
    chain_names = {lp.name for lp in chain}
    terms: dict[str, list[tuple[str, int]]] = {a.name: [] for a in blk.axes}
    reference: dict[str, tuple[Block, str]] = {}
    for lp in chain:
        axis, stride, other, other_axis = mapping[lp.name]
        terms[axis].append((lp.name, stride))
        reference.setdefault(axis, (other, other_axis))
    where = sites(prog)
    pieces = []  # (position in the reference nest, loop spec, axis, stride)
    for axis, (other, other_axis) in reference.items():
        order = where[other.name].loop_names
        for lp_name, stride in other.binding(other_axis).terms:
            if lp_name in chain_names:
                continue
            lp = prog.loop(lp_name)
            name = f"{prefix}.{axis}{_piece_suffix(lp_name, other_axis)}"
            pieces.append((order.index(lp_name), (name, lp.extent, LoopKind.SERIAL), axis, stride))
    pieces.sort(key=lambda p: p[0])
    loops = [spec for _, spec, _, _ in pieces]
    for _, (name, _, _), axis, stride in pieces:
        terms[axis].append((name, stride))
    for a in blk.axes:
        if a.name not in reference:
            loops.append((f"{prefix}.{a.name}", a.extent, LoopKind.SERIAL))
            terms[a.name].append((f"{prefix}.{a.name}", 1))
    binds = tuple(Binding(a.name, tuple(terms[a.name])) for a in blk.axes)
    return replace(blk, bindings=binds), loops


# ---- traces ---------------------------------------------------------------------------------


def save_trace(path: str | Path, steps: list[dict], workload: str | None = None,
               size: list[int] | tuple[int, ...] | None = None) -> None:
    doc = {"version": TRACE_VERSION, "workload": workload,
           "size": list(size) if size is not None else None, "steps": _validated_steps(steps)}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def load_trace(path: str | Path) -> tuple[list[dict], dict]:
    """Read a trace file: (steps, meta) with meta = {"workload", "size", "version"}."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ScheduleError(f"trace {path}: cannot read it ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ScheduleError(f"trace {path}: cannot read it as JSON (not UTF-8 text)") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ScheduleError(f"trace {path}: cannot read it as JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        raise ScheduleError(f"trace {path}: expected an object with a list of steps")
    if doc.get("version") != TRACE_VERSION:
        raise ScheduleError(f"trace {path}: version {doc.get('version')!r}, expected "
                            f"{TRACE_VERSION}")
    try:
        steps = _validated_steps(doc["steps"])
    except ScheduleError as e:
        raise ScheduleError(f"trace {path}: {e}") from None
    if doc.get("workload") is not None and not isinstance(doc["workload"], str):
        raise ScheduleError(f"trace {path}: workload must be a workload name, got "
                            f"{doc['workload']!r}")
    if doc.get("size") is not None and not isinstance(doc["size"], list):
        raise ScheduleError(f"trace {path}: size must be a list of integers, got "
                            f"{doc['size']!r}")
    meta = {"workload": doc.get("workload"), "size": doc.get("size"), "version": doc["version"]}
    return steps, meta


def _validated_steps(steps: list) -> list[dict]:
    for n, step in enumerate(steps):
        if not isinstance(step, dict) or set(step) != {"op", "args"}:
            raise ScheduleError(f"step {n} is not an object with exactly 'op' and 'args'")
        op, args = step["op"], step["args"]
        if not isinstance(op, str) or op not in PRIMITIVES:
            raise ScheduleError(f"step {n}: unknown primitive {op!r}")
        if not isinstance(args, dict) or set(args) != set(PRIMITIVES[op]):
            raise ScheduleError(f"step {n} ({op}): args must be exactly {list(PRIMITIVES[op])}")
        for name in PRIMITIVES[op]:
            kind, fits = _ARGUMENTS[name]
            if not fits(args[name]):
                raise ScheduleError(f"step {n} ({op}): {name} must be {kind}, got "
                                    f"{args[name]!r}")
    return list(steps)


__all__ = ["PRIMITIVES", "Schedule", "ScheduleError", "load_trace", "save_trace"]
