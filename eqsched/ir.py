"""The loop program: loops over structurally named axis pieces, and blocks that compute one point.

A `Program` is a tree of `Loop`s, `Alloc`s (a local buffer's scope) and `Block`s (TensorIR's
term): a block states one point of a stage's computation over its own axes, and binds each axis to
the loops around it as a mixed-radix sum (`i = 64*C.i.0 + 8*C.i.1 + C.i.2`). Schedules only move,
split and annotate loops and rebind axes; block bodies keep the stage's own index expressions, so
every program's meaning is readable off the tree.

Loop names are structural: `C.i` is axis `i` of block `C`'s nest; splitting it gives `C.i.0`,
`C.i.1`; splitting `C.i.1` gives `C.i.1.0`, `C.i.1.1`. The reduction's init is its own block
(`C.init`) in its own nest, before the update nest (`C.update`): TensorIR's decompose_reduction
at the outermost loop. Fusing the init back into the update nest is an ordinary `fuse`.

See docs/ARCHITECTURE.md §3 Vocabulary and §6 Programs and schedules.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum

from .expr import Const, Expr, Load, Var, to_str, transform
from .te import Axis, Computation


class LoopKind(StrEnum):
    SERIAL = "serial"
    PARALLEL = "parallel"
    VECTOR = "vector"
    UNROLL = "unroll"


class Scope(StrEnum):
    INPUT = "input"  # passed in by the caller, read only
    OUTPUT = "output"  # passed in by the caller, written
    GLOBAL = "global"  # intermediate, allocated by the runtime for one call
    LOCAL = "local"  # small scratch (register tile), allocated in the kernel at an `Alloc`


@dataclass(frozen=True)
class Buffer:
    name: str
    shape: tuple[int, ...]
    scope: Scope
    dtype: str = "float32"

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Binding:
    """`axis = sum(stride * loop) + offset` over enclosing loops."""

    axis: str
    terms: tuple[tuple[str, int], ...]  # (loop name, stride), outer to inner
    offset: int = 0

    def expr(self) -> Expr:
        out: Expr = Const(self.offset, "int")
        first = True
        for loop, stride in self.terms:
            t: Expr = Var(loop) if stride == 1 else Var(loop) * stride
            out = t if first and self.offset == 0 else out + t
            first = False
        return out


@dataclass(frozen=True)
class Block:
    """`buffer[indices] = value`, or `buffer[indices] = reduce(buffer[indices], value)`.

    `indices` and `value` are expressions over the block's axes; `bindings` says how each axis
    is computed from the enclosing loops.
    """

    name: str
    stage: str
    axes: tuple[Axis, ...]
    bindings: tuple[Binding, ...]
    buffer: str
    indices: tuple[Expr, ...]
    value: Expr
    reduce: str | None = None

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    def binding(self, axis: str) -> Binding:
        for b in self.bindings:
            if b.axis == axis:
                return b
        raise KeyError(axis)

    def loops_used(self) -> set[str]:
        return {lp for b in self.bindings for lp, _ in b.terms}

    def axis_of_loop(self, loop: str) -> str | None:
        for b in self.bindings:
            if any(lp == loop for lp, _ in b.terms):
                return b.axis
        return None

    def reads(self) -> list[Load]:
        from .expr import loads

        out = loads(self.value)
        if self.reduce is not None:
            out.append(Load(self.buffer, self.indices))
        return out


@dataclass(frozen=True)
class Loop:
    name: str
    extent: int
    kind: LoopKind
    body: tuple[Node, ...]

    @property
    def lanes(self) -> int:
        return self.extent if self.kind == LoopKind.VECTOR else 1


@dataclass(frozen=True)
class Alloc:
    """The scope of a local buffer: it exists (uninitialized) for each execution of `body`."""

    buffer: str
    body: tuple[Node, ...]


Node = Loop | Block | Alloc


@dataclass(frozen=True)
class Program:
    name: str
    buffers: tuple[Buffer, ...]
    body: tuple[Node, ...]
    computation: Computation = field(compare=False, hash=False, repr=False)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    @property
    def inputs(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.scope == Scope.INPUT)

    @property
    def outputs(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.scope == Scope.OUTPUT)

    @property
    def params(self) -> tuple[Buffer, ...]:
        """Buffers passed to the compiled kernel, in call order: inputs, outputs, intermediates."""
        order = {Scope.INPUT: 0, Scope.OUTPUT: 1, Scope.GLOBAL: 2}
        bufs = [b for b in self.buffers if b.scope in order]
        return tuple(sorted(bufs, key=lambda b: order[b.scope]))

    @functools.cached_property
    def _index(self) -> tuple[list[Block], list[Loop], dict[str, Loop], dict[str, list[Loop]]]:
        # Schedules and searches look nodes up by name thousands of times per program; the
        # tree is immutable, so one walk serves them all.
        blocks: list[Block] = []
        loops: list[Loop] = []
        loop_named: dict[str, Loop] = {}
        around: dict[str, list[Loop]] = {}

        def visit(nodes: tuple[Node, ...], outer: list[Loop]) -> None:
            for n in nodes:
                if type(n) is Block:
                    blocks.append(n)
                    around.setdefault(n.name, outer)
                elif type(n) is Loop:
                    loops.append(n)
                    loop_named.setdefault(n.name, n)
                    around.setdefault(n.name, outer)
                    visit(n.body, outer + [n])
                else:
                    visit(n.body, outer)

        visit(self.body, [])
        return blocks, loops, loop_named, around

    def blocks(self) -> list[Block]:
        return list(self._index[0])

    def loops(self) -> list[Loop]:
        return list(self._index[1])

    def block(self, name: str) -> Block:
        for b in self._index[0]:
            if b.name == name:
                return b
        raise KeyError(name)

    def loop(self, name: str) -> Loop:
        return self._index[2][name]

    def enclosing(self, name: str) -> list[Loop]:
        """The loops around the loop or block called `name`, outermost first."""
        return list(self._index[3][name])

    @functools.cached_property
    def preparation(self) -> tuple[int, ...]:
        """The positions in `body` of the nests a kernel bound to its constant inputs runs once,
        at binding, instead of on each call: top-level nests whose every block writes an
        intermediate (GLOBAL) buffer no other nest writes, from the computation's constants
        and other such nests' buffers only (the pack of a weight, a fill of its padding)."""
        constants = self.computation.constants
        if not constants:
            return ()
        global_ = {b.name for b in self.buffers if b.scope == Scope.GLOBAL}
        blocks = [_blocks_in(n) for n in self.body]
        chosen = set(range(len(self.body)))
        while True:
            written_outside = {b.buffer for k, bs in enumerate(blocks) if k not in chosen
                               for b in bs}
            ready = constants | ({b.buffer for k in chosen for b in blocks[k]} - written_outside)
            keep = {k for k in chosen
                    if all(b.buffer in ready and b.buffer in global_
                           and all(ld.buffer in ready for ld in b.reads()) for b in blocks[k])}
            if keep == chosen:
                return tuple(sorted(chosen))
            chosen = keep

    @property
    def prepared_buffers(self) -> frozenset[str]:
        """The intermediates `preparation` fills."""
        return frozenset(b.buffer for k in self.preparation for b in _blocks_in(self.body[k]))

    @functools.cached_property
    def per_call(self) -> Program:
        """What each call of a kernel bound to its constants runs: the program without its
        `preparation` (whose buffers it reads as already filled). Cost models predict this."""
        if not self.preparation:
            return self
        skip = set(self.preparation)
        return self.with_body(tuple(n for k, n in enumerate(self.body) if k not in skip))

    def with_body(self, body: tuple[Node, ...],
                  buffers: tuple[Buffer, ...] | None = None) -> Program:
        return replace(self, body=body, buffers=self.buffers if buffers is None else buffers)

    def replacing_loop(self, name: str, new: tuple[Node, ...]) -> Program:
        """The program with loop `name` replaced by `new`: only the loops around it are rebuilt
        (a schedule step touches one nest; copying the whole tree made searches slow)."""
        spine = [lp.name for lp in self._index[3][name]]

        def down(nodes: tuple[Node, ...], depth: int) -> tuple[Node, ...]:
            out: list[Node] = []
            for n in nodes:
                if type(n) is Loop:
                    if depth == len(spine) and n.name == name:
                        out.extend(new)
                        continue
                    if depth < len(spine) and n.name == spine[depth]:
                        n = Loop(n.name, n.extent, n.kind, down(n.body, depth + 1))
                elif type(n) is Alloc:
                    body = down(n.body, depth)
                    if _changed(body, n.body):
                        n = Alloc(n.buffer, body)
                out.append(n)
            return tuple(out)

        return self.with_body(down(self.body, 0))

    def text(self) -> str:
        """The canonical, readable text form (TVMScript-like); `hash` is taken of it."""
        return print_program(self)

    def hash(self) -> str:
        """Stable content hash (of the canonical printed form)."""
        return hashlib.sha256(self.text().encode()).hexdigest()[:16]

    def __str__(self) -> str:
        return self.text()


def _blocks_in(node: Node) -> list[Block]:
    return [node] if type(node) is Block else [b for b, _ in walk(node.body) if type(b) is Block]


def parallel_nest(loop: Loop) -> tuple[Loop, ...]:
    """The parallel loops a root parallel `loop` shares among threads as one: it and each
    parallel loop that is the only statement of the one before (their steps' product is
    shared out, as OpenMP's collapse). Empty for a loop that is not parallel."""
    nest: list[Loop] = []
    node: Node = loop
    while isinstance(node, Loop) and node.kind == LoopKind.PARALLEL:
        nest.append(node)
        if len(node.body) != 1:
            break
        node = node.body[0]
    return tuple(nest)


def walk(nodes: tuple[Node, ...],
         path: tuple[Node, ...] = ()) -> Iterator[tuple[Node, tuple[Node, ...]]]:
    """Pre-order walk yielding each node with the Loops/Allocs around it (outermost first)."""
    for n in nodes:
        yield n, path
        if isinstance(n, (Loop, Alloc)):
            yield from walk(n.body, path + (n,))


def map_nodes(nodes: tuple[Node, ...],
              fn: Callable[[Node], Node | tuple[Node, ...] | None]) -> tuple[Node, ...]:
    """Bottom-up rebuild: `fn` sees each node (children already mapped) and returns a replacement
    node, a tuple of nodes to splice in its place (possibly empty), or None to keep it."""
    out: list[Node] = []
    for n in nodes:
        # Unchanged subtrees are shared, not copied: schedules rebuild programs thousands of
        # times per search round and most of each tree stays as it was.
        if isinstance(n, Loop):
            body = map_nodes(n.body, fn)
            if _changed(body, n.body):
                n = Loop(n.name, n.extent, n.kind, body)
        elif isinstance(n, Alloc):
            body = map_nodes(n.body, fn)
            if _changed(body, n.body):
                n = Alloc(n.buffer, body)
        r = fn(n)
        if r is None:
            out.append(n)
        elif isinstance(r, tuple):
            out.extend(r)
        else:
            out.append(r)
    return tuple(out)


# Elements (before, after) around a buffer in each of its dimensions.
Border = tuple[tuple[int, int], ...]


def bordered_shape(shape: tuple[int, ...], border: Border) -> tuple[int, ...]:
    """`shape` with `border` around it."""
    return tuple(d + before + after for d, (before, after) in zip(shape, border))


def embedded(prog: Program, buffer: str, border: Border) -> Program:
    """The program writing and reading `buffer` inside a larger one: `border` gives, per
    dimension, the elements (before, after) around it, and every index into it is moved by the
    `before`s. What lies in the border is never touched, so a caller that zeroes it once has the
    value stored already padded for a convolution that reads it (`model.tasks`)."""
    shape = prog.buffer(buffer).shape
    if len(border) != len(shape) or min((n for pair in border for n in pair), default=0) < 0:
        raise ValueError(f"a border of {buffer}{list(shape)} needs one non-negative (before, "
                         f"after) per dimension, got {border}")

    def moved(indices: tuple[Expr, ...]) -> tuple[Expr, ...]:
        return tuple(i + before if before else i for i, (before, _) in zip(indices, border))

    def load(e: Expr) -> Expr | None:
        return Load(buffer, moved(e.indices)) if isinstance(e, Load) and e.buffer == buffer \
            else None

    def node(n: Node) -> Node | None:
        if type(n) is not Block:
            return None
        value = transform(n.value, load)
        if n.buffer != buffer and value is n.value:
            return None
        return replace(n, value=value,
                       indices=moved(n.indices) if n.buffer == buffer else n.indices)

    buffers = tuple(replace(b, shape=bordered_shape(b.shape, border)) if b.name == buffer else b
                    for b in prog.buffers)
    return prog.with_body(map_nodes(prog.body, node), buffers)


def _changed(new: tuple[Node, ...], old: tuple[Node, ...]) -> bool:
    return len(new) != len(old) or any(a is not b for a, b in zip(new, old))


def nest(loops: list[tuple[str, int, LoopKind]], inner: tuple[Node, ...]) -> tuple[Node, ...]:
    """Wrap `inner` in loops given outermost first."""
    body = inner
    for name, extent, kind in reversed(loops):
        body = (Loop(name, extent, kind, body),)
    return body


def _stage_nest(prefix: str, block_name: str, stage_name: str, axes: tuple[Axis, ...],
                buffer: str, indices: tuple[Expr, ...], value: Expr,
                reduce: str | None) -> tuple[Node, ...]:
    loops = [(f"{prefix}.{a.name}", a.extent, LoopKind.SERIAL) for a in axes]
    bindings = tuple(Binding(a.name, ((lp[0], 1),)) for a, lp in zip(axes, loops))
    blk = Block(block_name, stage_name, axes, bindings, buffer, indices, value, reduce)
    return nest(loops, (blk,))


def naive_program(comp: Computation) -> Program:
    """One loop nest per stage, in definition order; a reduction's init is its own nest first."""
    buffers = [Buffer(t.name, t.shape, Scope.INPUT) for t in comp.inputs]
    body: list[Node] = []
    for s in comp.stages:
        scope = Scope.OUTPUT if s.name in comp.outputs else Scope.GLOBAL
        buffers.append(Buffer(s.name, s.shape, scope))
        idx = tuple(a.var for a in s.spatial)
        if s.reduce is None:
            body += _stage_nest(s.name, s.name, s.name, s.axes, s.name, idx, s.body, None)
        else:
            init = f"{s.name}.init"
            body += _stage_nest(init, init, s.name, s.spatial, s.name, idx,
                                Const(s.init_value, "float32"), None)
            body += _stage_nest(s.name, f"{s.name}.update", s.name, s.axes, s.name, idx, s.body,
                                s.reduce)
    return Program(comp.name, tuple(buffers), tuple(body), comp)


# ---- the text form: what `Program.text()` prints and `Program.hash()` digests -------------------
#
#     program matmul
#       input  A: float32[64, 64]
#       ...
#     for C.i in range(64):
#       for C.j in vectorized(16):
#         C.update(i = C.i, j = C.j, k = C.k):
#           C[i, j] += A[i, k] * B[k, j]
#
# The words printed for loop kinds (KIND_WORD; messages use them too) are part of every stored
# program hash: keep them as they are.

KIND_WORD = {
    LoopKind.SERIAL: "range",
    LoopKind.PARALLEL: "parallel",
    LoopKind.VECTOR: "vectorized",
    LoopKind.UNROLL: "unrolled",
}
_ACC = {"sum": "+=", "max": "max="}


def _binding(b: Binding) -> str:
    parts = [lp if s == 1 else f"{s}*{lp}" for lp, s in b.terms]
    if b.offset or not parts:
        parts.append(str(b.offset))
    return f"{b.axis} = {' + '.join(parts)}"


def _block(b: Block, pad: str) -> list[str]:
    head = f"{pad}{b.name}({', '.join(_binding(x) for x in b.bindings)}):"
    target = f"{b.buffer}[{', '.join(to_str(i) for i in b.indices)}]"
    op = _ACC[b.reduce] if b.reduce else "="
    return [head, f"{pad}  {target} {op} {to_str(b.value)}"]


def _nodes(nodes: tuple[Node, ...], depth: int, out: list[str], prog: Program) -> None:
    pad = "  " * depth
    for n in nodes:
        if isinstance(n, Loop):
            out.append(f"{pad}for {n.name} in {KIND_WORD[n.kind]}({n.extent}):")
            _nodes(n.body, depth + 1, out, prog)
        elif isinstance(n, Alloc):
            buf = prog.buffer(n.buffer)
            out.append(f"{pad}alloc {n.buffer}: {buf.dtype}{list(buf.shape)}:")
            _nodes(n.body, depth + 1, out, prog)
        else:
            out.extend(_block(n, pad))


def print_program(prog: Program) -> str:
    lines = [f"program {prog.name}"]
    for b in prog.buffers:
        if b.scope.value != "local":
            # A constant input is named so (its measurements are of a kernel that prepares it
            # once, so its programs and their hashes are not those of the same inputs unfixed).
            word = "const" if b.name in prog.computation.constants else b.scope.value
            lines.append(f"  {word:<6} {b.name}: {b.dtype}{list(b.shape)}")
    _nodes(prog.body, 0, lines, prog)
    return "\n".join(lines) + "\n"
