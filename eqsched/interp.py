"""A slow, obviously faithful interpreter of loop programs: the oracle for schedules at tiny sizes.

Every expression is compiled once into a Python closure, then the tree runs point by point.
Loop kinds are ignored (vectorized, unrolled and parallel loops mean the same as serial ones).
Buffers the program allocates itself (intermediates, outputs, locals at each `Alloc`) start as
NaN, so a point read before it is written shows up in the result instead of passing silently.

See docs/ARCHITECTURE.md §6 Programs and schedules.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .expr import BinOp, Call, Cmp, Const, Expr, Load, Select, Var, to_str
from .ir import Alloc, Block, Loop, Node, Program, Scope

Env = dict[str, int]  # variable (axis or loop) -> value
Arrays = dict[str, np.ndarray]
Eval = Callable[[Env, Arrays], object]
Run = Callable[[Env, Arrays], None]


class InterpError(RuntimeError):
    """The program cannot run: a missing or misshapen input, or an out-of-bounds access."""


def run_program(prog: Program, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `prog` on float32 copies of `inputs`; return its output buffers by name."""
    arrays: Arrays = {}
    for buf in prog.inputs:
        if buf.name not in inputs:
            raise InterpError(f"input {buf.name} is missing")
        arr = np.array(inputs[buf.name], dtype=np.float32)
        if arr.shape != buf.shape:
            raise InterpError(f"input {buf.name} has shape {arr.shape}, expected {buf.shape}")
        arrays[buf.name] = arr
    for buf in prog.buffers:
        if buf.scope in (Scope.OUTPUT, Scope.GLOBAL):
            arrays[buf.name] = np.full(buf.shape, np.nan, dtype=np.float32)
    _compile_nodes(prog.body, prog)({}, arrays)
    return {buf.name: arrays[buf.name] for buf in prog.outputs}


def _compile_nodes(nodes: tuple[Node, ...], prog: Program) -> Run:
    steps = [_compile_node(n, prog) for n in nodes]

    def run(env: Env, arrays: Arrays) -> None:
        for step in steps:
            step(env, arrays)

    return run


def _compile_node(node: Node, prog: Program) -> Run:
    if isinstance(node, Loop):
        body = _compile_nodes(node.body, prog)
        name, extent = node.name, node.extent

        def run_loop(env: Env, arrays: Arrays) -> None:
            for v in range(extent):
                env[name] = v
                body(env, arrays)
            del env[name]

        return run_loop
    if isinstance(node, Alloc):
        body = _compile_nodes(node.body, prog)
        buf = prog.buffer(node.buffer)

        def run_alloc(env: Env, arrays: Arrays) -> None:
            arrays[buf.name] = np.full(buf.shape, np.nan, dtype=np.float32)
            body(env, arrays)
            del arrays[buf.name]

        return run_alloc
    return _compile_block(node, prog)


def _compile_block(blk: Block, prog: Program) -> Run:
    bindings = [(b.axis, b.offset, b.terms) for b in blk.bindings]
    extents = [(a.name, a.extent) for a in blk.axes]
    store = _compile_index(blk.buffer, blk.indices, prog, blk.name)
    value = _compile(blk.value, prog, blk.name)
    combine = {None: None, "sum": lambda a, b: a + b, "max": _fmax}[blk.reduce]
    buffer = blk.buffer

    def run_block(env: Env, arrays: Arrays) -> None:
        axes = {axis: off + sum(s * env[lp] for lp, s in terms) for axis, off, terms in bindings}
        if any(axes[axis] >= extent for axis, extent in extents):
            return  # past the end of a split that leaves a remainder: the point does not exist
        idx = store(axes)
        v = value(axes, arrays)
        arr = arrays[buffer]
        arr[idx] = v if combine is None else combine(arr.item(idx), v)

    return run_block


def _compile_index(buffer: str, indices: tuple[Expr, ...], prog: Program, where: str):
    shape = prog.buffer(buffer).shape
    evals = [_compile(ix, prog, where) for ix in indices]
    text = f"{buffer}[{', '.join(to_str(ix) for ix in indices)}]"

    def index(env: Env) -> tuple[int, ...]:
        idx = tuple(e(env, None) for e in evals)
        for i, n in zip(idx, shape):
            if not 0 <= i < n:
                raise InterpError(f"{where}: {text} = {list(idx)} is outside shape {list(shape)}")
        return idx

    return index


def _compile(e: Expr, prog: Program, where: str) -> Eval:
    if isinstance(e, Const):
        value = int(e.value) if e.dtype == "int" else float(e.value)
        return lambda env, arrays: value
    if isinstance(e, Var):
        name = e.name
        return lambda env, arrays: env[name]
    if isinstance(e, Load):
        index = _compile_index(e.buffer, e.indices, prog, where)
        buffer = e.buffer
        return lambda env, arrays: arrays[buffer].item(index(env))
    if isinstance(e, (BinOp, Cmp)):
        fn = (_INT_OPS if e.dtype == "int" else _FLOAT_OPS)[e.op] if isinstance(e, BinOp) \
            else _CMP_OPS[e.op]
        a, b = _compile(e.a, prog, where), _compile(e.b, prog, where)
        return lambda env, arrays: fn(a(env, arrays), b(env, arrays))
    if isinstance(e, Call):
        fn = _MATH[e.fn]
        arg = _compile(e.args[0], prog, where)
        return lambda env, arrays: fn(arg(env, arrays))
    if isinstance(e, Select):
        cond, a, b = (_compile(x, prog, where) for x in (e.cond, e.a, e.b))
        return lambda env, arrays: a(env, arrays) if cond(env, arrays) else b(env, arrays)
    raise InterpError(f"{where}: cannot evaluate {e!r}")


# Float semantics follow IEEE (inf/NaN results) rather than Python's exceptions, and max/min
# propagate NaN so that uninitialized reads stay visible.


def _fmax(a: float, b: float) -> float:
    return a if math.isnan(a) or a >= b else b


def _fmin(a: float, b: float) -> float:
    return a if math.isnan(a) or a <= b else b


def _fdiv(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1, b)
    return a / b


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _log(x: float) -> float:
    if x == 0:
        return -math.inf
    return math.log(x) if x > 0 else math.nan


def _sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 else math.nan


_FLOAT_OPS = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": _fdiv, "max": _fmax, "min": _fmin,
}
_INT_OPS = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "//": lambda a, b: a // b, "%": lambda a, b: a % b, "max": max, "min": min,
}
_CMP_OPS = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b, ">=": lambda a, b: a >= b, ">": lambda a, b: a > b,
    "and": lambda a, b: a and b,
}
_MATH = {"exp": _exp, "sqrt": _sqrt, "log": _log, "neg": lambda x: -x, "abs": abs,
         "tanh": math.tanh, "erf": math.erf}
