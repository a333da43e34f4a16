"""Lowering a loop program to LLVM IR: one function per run of root nodes.

Consecutive non-parallel root nodes become one function `(ptr buffers...)`; a parallel root loop
becomes a chunk function `(ptr buffers..., i64 lo, i64 hi)` over part of its range, which the kernel
calls from several threads. Buffers are passed in `Program.params` order.

Inside a function every loop variable is one of: a Python int (an unrolled loop: the body is
emitted once per value, so indices fold to constants and a local tile can live in registers), an
i64 SSA value (a serial loop), or the lanes `<0, 1, .., L-1>` of the one vectorized loop around the
code. Index expressions are normalized to affine form over the loop variables (`to_affine`, which
also resolves `//` and `%` of split loops); the coefficient of the vectorized loop in a buffer's
linearized address decides between a vector load (1), a scalar load and broadcast (0) and a gather.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from llvmlite import ir

from ..affine import Affine, AffineError, to_affine
from ..expr import BinOp, Call, Cmp, Const, Expr, Load, Select, Var, substitute
from ..ir import Alloc, Block, Loop, LoopKind, Node, Program, Scope
from .errors import BackendError
from .mathlib import F32, I32, MathEmitter

I1 = ir.IntType(1)
I64 = ir.IntType(64)
PTR = ir.PointerType()


@dataclass(frozen=True)
class Segment:
    """A compiled function and how the kernel calls it."""

    function: str
    parallel_extent: int | None = None  # set for a chunk function (ptrs..., lo, hi)


def lower(prog: Program, triple: str, data_layout: str) -> tuple[ir.Module, list[Segment]]:
    module = ir.Module(name=prog.name)
    module.triple = triple
    module.data_layout = data_layout
    segments: list[Segment] = []
    run: list[Node] = []

    def flush() -> None:
        if run:
            name = f"seg{len(segments)}"
            _FunctionEmitter(module, prog, name, chunked=False).emit_serial(tuple(run))
            segments.append(Segment(name))
            run.clear()

    for node in prog.body:
        if isinstance(node, Loop) and node.kind == LoopKind.PARALLEL:
            flush()
            name = f"seg{len(segments)}"
            _FunctionEmitter(module, prog, name, chunked=True).emit_chunk(node)
            segments.append(Segment(name, node.extent))
        else:
            run.append(node)
    flush()
    return module, segments


class _Lanes:
    """Marker: this loop variable is the lane index of the vectorized loop."""


LANES = _Lanes()
Scalar = int | ir.Value  # an index value: folded constant or i64 / <L x i64> SSA value


@dataclass
class _Address:
    """Element offset of an access: `scalar + stride * lane`, or per-lane `vector` offsets."""

    scalar: ir.Value
    stride: int = 0
    vector: ir.Value | None = None


class _FunctionEmitter:
    def __init__(self, module: ir.Module, prog: Program, name: str, chunked: bool):
        self.prog = prog
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
            arg.attributes.align = 4
            self.ptrs[buf.name] = arg
        self.entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self.entry)
        self.env: dict[str, Scalar | _Lanes] = {}
        self.ranges: dict[str, tuple[int, int]] = {}
        self.depth: dict[str, int] = {}
        self.axes: dict[str, Expr] = {}  # the current block's axes as expressions over loops
        self.vec: Loop | None = None
        self.guarded = 0  # > 0 while emitting a Select branch: loads there may be out of bounds

    # ---- structure --------------------------------------------------------------------------

    def emit_serial(self, nodes: tuple[Node, ...]) -> None:
        self._nodes(nodes)
        self.b.ret_void()

    def emit_chunk(self, loop: Loop) -> None:
        lo, hi = self.fn.args[-2:]
        self._counted_loop(loop, lo, hi)
        self.b.ret_void()

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
            raise BackendError(
                f"parallel loop {loop.name} is not at the root of the program; only root loops "
                "can be run in parallel"
            )
        if loop.kind == LoopKind.SERIAL:
            self._counted_loop(loop, ir.Constant(I64, 0), ir.Constant(I64, loop.extent))
        elif loop.kind == LoopKind.UNROLLED:
            for value in range(loop.extent):
                self._enter(loop, value)
                self._nodes(loop.body)
            self._leave(loop)
        else:
            self._vectorized(loop)

    def _enter(self, loop: Loop, value: Scalar | _Lanes) -> None:
        self.env[loop.name] = value
        self.ranges[loop.name] = (0, loop.extent - 1)
        self.depth[loop.name] = len(self.depth)

    def _leave(self, loop: Loop) -> None:
        for table in (self.env, self.ranges, self.depth):
            table.pop(loop.name, None)

    def _counted_loop(self, loop: Loop, lo: ir.Value, hi: ir.Value) -> None:
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
        self._enter(loop, iv)
        self._nodes(loop.body)
        self._leave(loop)
        nxt = b.add(iv, ir.Constant(I64, 1), flags=["nuw", "nsw"])
        iv.add_incoming(nxt, b.block)
        b.cbranch(b.icmp_signed("<", nxt, hi), body, done)
        b.position_at_end(done)

    def _vectorized(self, loop: Loop) -> None:
        if self.vec is not None:
            raise BackendError(
                f"vectorized loop {loop.name} is inside vectorized loop {self.vec.name}")
        for blk in _blocks_under(loop):
            if blk.reduce is None:
                continue
            for axis in blk.axes:
                loops = [lp for lp, _ in blk.binding(axis.name).terms]
                if axis.kind == "reduce" and loop.name in loops:
                    raise BackendError(
                        f"vectorized loop {loop.name} binds reduce axis {axis.name} of "
                        f"accumulating block {blk.name}: its lanes would race on {blk.buffer}"
                    )
        self.vec = loop
        self._enter(loop, LANES)
        self._nodes(loop.body)
        self._leave(loop)
        self.vec = None

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
        self.ptrs[buf.name] = slot
        self._nodes(node.body)
        del self.ptrs[buf.name]

    # ---- blocks -----------------------------------------------------------------------------

    def _block(self, blk: Block) -> None:
        self.axes = {bd.axis: bd.expr() for bd in blk.bindings}
        missing = [a.name for a in blk.axes if a.name not in self.axes]
        if missing:
            raise BackendError(f"block {blk.name} has no binding for axes {missing}")
        addr = self._address(blk.buffer, blk.indices)
        if self.vec is not None and (addr.vector is not None or addr.stride != 1):
            stride = "a non-affine index" if addr.vector is not None else f"stride {addr.stride}"
            raise BackendError(
                f"vectorized loop {self.vec.name} needs unit-stride stores, but block {blk.name} "
                f"stores {blk.buffer} with {stride} in it"
            )
        ptr = self._gep(blk.buffer, addr.scalar)
        ty = ir.VectorType(F32, self.vec.extent) if self.vec is not None else F32
        if blk.reduce is None:
            value = self._widen(self._value(blk.value, None), ty)
        else:
            acc = self.b.load(ptr, typ=ty)
            acc.align = 4
            value = self._accumulate(blk.reduce, acc, blk.value)
        store = self.b.store(value, ptr)
        store.align = 4

    def _accumulate(self, op: str, acc: ir.Value, e: Expr) -> ir.Value:
        b = self.b
        if op == "sum" and isinstance(e, BinOp) and e.op == "*":
            x = self._widen(self._value(e.a, None), acc.type)
            y = self._widen(self._value(e.b, None), acc.type)
            return MathEmitter(b, acc.type).fma(x, y, acc)
        v = self._widen(self._value(e, None), acc.type)
        if op == "sum":
            return b.fadd(acc, v)
        return b.select(b.fcmp_ordered(">", acc, v), acc, v)

    # ---- addresses --------------------------------------------------------------------------

    def _loop_expr(self, e: Expr) -> Expr:
        """An expression over the block's axes, rewritten over the enclosing loops."""
        return substitute(e, self.axes)

    def _address(self, buffer: str, indices: tuple[Expr, ...]) -> _Address:
        shape = self.prog.buffer(buffer).shape
        if len(indices) != len(shape):
            raise BackendError(
                f"{buffer} has {len(shape)} dimensions but is indexed with {len(indices)}")
        strides = [prod(shape[d + 1:]) for d in range(len(shape))]
        loop_indices = [self._loop_expr(ix) for ix in indices]
        try:
            flat = Affine.of({})
            for ix, stride in zip(loop_indices, strides):
                flat = flat + to_affine(ix, self.ranges).scale(stride)
        except AffineError:
            return self._general_address(loop_indices, strides)
        return self._affine_address(flat)

    def _affine_address(self, flat: Affine) -> _Address:
        const, lane_stride, terms = self._split_affine(flat)
        return _Address(self._sum_terms(terms, const), lane_stride)

    def _split_affine(self, flat: Affine) -> tuple[int, int, list[tuple[ir.Value, int]]]:
        const, lane_stride = flat.const, 0
        terms: list[tuple[int, ir.Value, int]] = []
        for var, coeff in flat.terms:
            value = self._var(var)
            if value is LANES:
                lane_stride += coeff
            elif isinstance(value, int):
                const += coeff * value
            else:
                terms.append((self.depth[var], value, coeff))
        # Outer loops first: their partial sums are invariant in the inner loops (LICM hoists them).
        terms.sort(key=lambda t: t[0])
        return const, lane_stride, [(v, c) for _, v, c in terms]

    def _sum_terms(self, terms: list[tuple[ir.Value, int]], const: int) -> ir.Value:
        b = self.b
        total: ir.Value | None = None
        for value, coeff in terms:
            term = value if coeff == 1 else b.mul(value, ir.Constant(I64, coeff), flags=["nsw"])
            total = term if total is None else b.add(total, term, flags=["nsw"])
        if total is None:
            return ir.Constant(I64, const)
        return b.add(total, ir.Constant(I64, const), flags=["nsw"]) if const else total

    def _general_address(self, indices: list[Expr], strides: list[int]) -> _Address:
        total: Scalar = 0
        for ix, stride in zip(indices, strides):
            total = self._int_op("+", total, self._int_op("*", self._int(ix), stride))
        if isinstance(total, ir.Value) and isinstance(total.type, ir.VectorType):
            return _Address(ir.Constant(I64, 0), vector=total)
        return _Address(self._as_i64(total))

    def _var(self, name: str) -> Scalar | _Lanes:
        try:
            return self.env[name]
        except KeyError:
            raise BackendError(f"an index uses loop {name}, which does not enclose it") from None

    def _gep(self, buffer: str, offset: ir.Value) -> ir.Value:
        try:
            base = self.ptrs[buffer]
        except KeyError:
            raise BackendError(f"buffer {buffer} is used outside its alloc") from None
        gep = self.b.gep(base, [offset], inbounds=self.guarded == 0, source_etype=F32)
        if isinstance(offset.type, ir.VectorType):
            gep.type = ir.VectorType(PTR, offset.type.count)  # llvmlite types every GEP as `ptr`
        return gep

    # ---- integer expressions (indices in conditions, non-affine indices) ---------------------

    def _int(self, e: Expr) -> Scalar:
        """Value of an integer expression over loops: Python int, i64, or <L x i64> per lane."""
        try:
            const, lane_stride, terms = self._split_affine(to_affine(e, self.ranges))
        except AffineError:
            return self._int_tree(e)
        value: Scalar = const if not terms else self._sum_terms(terms, const)
        if lane_stride:
            lanes = self._lanes_i64()
            if lane_stride != 1:
                lanes = self.b.mul(lanes, self._splat_i64(lane_stride))
            value = self._int_op("+", value, lanes)
        return value

    def _int_tree(self, e: Expr) -> Scalar:
        if isinstance(e, Const):
            return int(e.value)
        if isinstance(e, Var):
            value = self._var(e.name)
            return self._lanes_i64() if value is LANES else value  # type: ignore[return-value]
        if isinstance(e, BinOp):
            return self._int_op(e.op, self._int_tree(e.a), self._int_tree(e.b))
        raise BackendError(f"not an integer index expression: {e}")

    def _int_op(self, op: str, x: Scalar, y: Scalar) -> Scalar:
        if isinstance(x, int) and isinstance(y, int):
            return _fold(op, x, y)
        b = self.b
        x, y = self._same_int_shape(x, y)
        if op == "+":
            return b.add(x, y)
        if op == "-":
            return b.sub(x, y)
        if op == "*":
            return b.mul(x, y)
        if op in ("max", "min"):
            return b.select(b.icmp_signed(">" if op == "max" else "<", x, y), x, y)
        # Floor division and modulo (Python semantics): adjust C's truncation when the signs differ.
        q, r = b.sdiv(x, y), b.srem(x, y)
        zero = ir.Constant(x.type, None)
        fix = b.and_(b.icmp_signed("!=", r, zero),
                     b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))
        if op == "//":
            return b.sub(q, b.zext(fix, x.type))
        if op == "%":
            return b.add(r, b.select(fix, y, zero))
        raise BackendError(f"unknown integer operator {op!r}")

    def _same_int_shape(self, x: Scalar, y: Scalar) -> tuple[ir.Value, ir.Value]:
        x, y = self._as_i64(x), self._as_i64(y)
        if isinstance(x.type, ir.VectorType) and not isinstance(y.type, ir.VectorType):
            y = self._broadcast(y, x.type)
        elif isinstance(y.type, ir.VectorType) and not isinstance(x.type, ir.VectorType):
            x = self._broadcast(x, y.type)
        return x, y

    def _cond(self, c: Expr) -> ir.Value | bool:
        if not isinstance(c, Cmp):
            raise BackendError(f"a select condition must be a comparison, got {c}")
        if c.op == "and":
            x, y = self._cond(c.a), self._cond(c.b)
            if isinstance(x, bool) or isinstance(y, bool):
                if x is False or y is False:
                    return False
                return y if x is True else x
            x, y = self._same_bool_shape(x, y)
            return self.b.and_(x, y)
        x, y = self._int(self._loop_expr(c.a)), self._int(self._loop_expr(c.b))
        if isinstance(x, int) and isinstance(y, int):
            return _compare(c.op, x, y)
        x, y = self._same_int_shape(x, y)
        return self.b.icmp_signed(c.op, x, y)

    def _same_bool_shape(self, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
        if isinstance(x.type, ir.VectorType) and not isinstance(y.type, ir.VectorType):
            y = self._broadcast(y, x.type)
        elif isinstance(y.type, ir.VectorType) and not isinstance(x.type, ir.VectorType):
            x = self._broadcast(x, y.type)
        return x, y

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
            x, y = self._same_float_shape(self._value(e.a, mask), self._value(e.b, mask))
            if e.op == "+":
                return b.fadd(x, y)
            if e.op == "-":
                return b.fsub(x, y)
            if e.op == "*":
                return b.fmul(x, y)
            if e.op == "/":
                return b.fdiv(x, y)
            if e.op in ("max", "min"):
                return b.select(b.fcmp_ordered(">" if e.op == "max" else "<", x, y), x, y)
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
        if fn in ("exp", "log", "tanh"):
            return getattr(math, fn)(x)
        raise BackendError(f"unknown math function {fn!r}")

    def _select(self, e: Select, mask: ir.Value | None) -> ir.Value:
        cond = self._cond(e.cond)
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
            x, y = self._same_float_shape(x, y)
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
                y = self._broadcast(y, x.type)
            else:
                b.position_at_end(x_end)
                x = self._broadcast(x, y.type)
        for end in (x_end, y_end):
            b.position_at_end(end)
            b.branch(merge_bb)
        b.position_at_end(merge_bb)
        phi = b.phi(x.type)
        phi.add_incoming(x, x_end)
        phi.add_incoming(y, y_end)
        return phi

    def _load(self, ld: Load, mask: ir.Value | None) -> ir.Value:
        b = self.b
        addr = self._address(ld.buffer, ld.indices)
        vec_ty = ir.VectorType(F32, self.vec.extent) if self.vec is not None else None
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
            return b.call(_masked_load(b.module, vec_ty), [ptr, ir.Constant(I32, 4), mask,
                                                           ir.Constant(vec_ty, None)])
        if addr.vector is not None:
            offsets = addr.vector
        else:
            offsets = self._broadcast(addr.scalar, ir.VectorType(I64, vec_ty.count))
            if addr.stride:
                lanes = b.mul(self._lanes_i64(), self._splat_i64(addr.stride))
                offsets = b.add(offsets, lanes)
        ptrs = self._gep(ld.buffer, offsets)
        if mask is None:
            mask = ir.Constant(ir.VectorType(I1, vec_ty.count), [1] * vec_ty.count)
        return b.call(_gather(b.module, vec_ty), [ptrs, ir.Constant(I32, 4), mask,
                                                  ir.Constant(vec_ty, None)])

    # ---- vector helpers ---------------------------------------------------------------------

    def _same_float_shape(self, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
        if isinstance(x.type, ir.VectorType) and not isinstance(y.type, ir.VectorType):
            y = self._broadcast(y, x.type)
        elif isinstance(y.type, ir.VectorType) and not isinstance(x.type, ir.VectorType):
            x = self._broadcast(x, y.type)
        return x, y

    def _widen(self, value: ir.Value, ty: ir.Type) -> ir.Value:
        return self._broadcast(value, ty) if value.type != ty else value

    def _broadcast(self, value: ir.Value, ty: ir.VectorType) -> ir.Value:
        if isinstance(value, ir.Constant):
            return ir.Constant(ty, [value.constant] * ty.count)
        one = self.b.insert_element(ir.Constant(ty, ir.Undefined), value, ir.Constant(I32, 0))
        zeros = ir.Constant(ir.VectorType(I32, ty.count), [0] * ty.count)
        return self.b.shuffle_vector(one, ir.Constant(ty, ir.Undefined), zeros)

    def _lanes_i64(self) -> ir.Constant:
        assert self.vec is not None
        return ir.Constant(ir.VectorType(I64, self.vec.extent), list(range(self.vec.extent)))

    def _splat_i64(self, value: int) -> ir.Constant:
        assert self.vec is not None
        return ir.Constant(ir.VectorType(I64, self.vec.extent), [value] * self.vec.extent)

    def _as_i64(self, value: Scalar) -> ir.Value:
        return ir.Constant(I64, value) if isinstance(value, int) else value


def _blocks_under(loop: Loop) -> list[Block]:
    out: list[Block] = []
    for n in loop.body:
        if isinstance(n, Block):
            out.append(n)
        else:
            out += _blocks_under(n)  # type: ignore[arg-type]
    return out


def _masked_load(module: ir.Module, ty: ir.VectorType) -> ir.Function:
    # The (ptr, i32 align, mask, passthru) form; LLVM's IR reader upgrades it to its current one.
    name = f"llvm.masked.load.v{ty.count}f32.p0"
    if name in module.globals:
        return module.globals[name]
    mask_ty = ir.VectorType(I1, ty.count)
    return ir.Function(module, ir.FunctionType(ty, [PTR, I32, mask_ty, ty]), name)


def _gather(module: ir.Module, ty: ir.VectorType) -> ir.Function:
    name = f"llvm.masked.gather.v{ty.count}f32.v{ty.count}p0"
    if name in module.globals:
        return module.globals[name]
    ptrs_ty = ir.VectorType(PTR, ty.count)
    mask_ty = ir.VectorType(I1, ty.count)
    return ir.Function(module, ir.FunctionType(ty, [ptrs_ty, I32, mask_ty, ty]), name)


def _fold(op: str, x: int, y: int) -> int:
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if op == "//":
        return x // y
    if op == "%":
        return x % y
    if op == "max":
        return max(x, y)
    if op == "min":
        return min(x, y)
    raise BackendError(f"unknown integer operator {op!r}")


def _compare(op: str, x: int, y: int) -> bool:
    return {"<": x < y, "<=": x <= y, "==": x == y, "!=": x != y, ">=": x >= y, ">": x > y}[op]


__all__ = ["Segment", "lower"]
