"""Tensor-expression front end: write a computation once, in the spirit of TVM's `te.compute`.

    A = placeholder((M, K), "A")
    B = placeholder((K, N), "B")
    k = reduce_axis(K, "k")
    C = compute((M, N), lambda i, j: sum_(A[i, k] * B[k, j], axis=k), "C")
    comp = Computation("matmul", [C])

A computation is a list of stages in definition (topological) order. Each stage writes one buffer
over an iteration domain of named axes, spatial (one per output dimension) or reduce (accumulated
with `sum` or `max`).

See docs/ARCHITECTURE.md §6 Programs and schedules.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .expr import Const, Expr, ExprLike, Load, Var, as_expr, count_flops, free_vars, loads, to_str

REDUCERS = {"sum": 0.0, "max": -math.inf}


class WorkloadError(ValueError):
    """A computation is malformed (bad shape, unknown axis, wrong arity, cyclic use...)."""


@dataclass(frozen=True)
class Axis:
    name: str
    extent: int
    kind: str = "spatial"  # "spatial" or "reduce"

    @property
    def var(self) -> Var:
        return Var(self.name)


class ReduceAxis(Var):
    """A reduce axis, usable directly in index expressions (`A[i, k]`)."""

    __slots__ = ("extent",)

    def __init__(self, name: str, extent: int):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "extent", extent)

    @property
    def axis(self) -> Axis:
        return Axis(self.name, self.extent, "reduce")

    def __reduce__(self):
        return (ReduceAxis, (self.name, self.extent))


@dataclass(frozen=True)
class Reduce:
    """Marker returned by `sum_`/`max_`; only valid as the whole body of a compute."""

    op: str
    body: Expr
    axes: tuple[Axis, ...]


def reduce_axis(extent: int, name: str) -> ReduceAxis:
    _check_extent(extent, f"reduce axis {name}")
    return ReduceAxis(name, int(extent))


def _reduce(op: str, body: ExprLike, axis: ReduceAxis | Sequence[ReduceAxis]) -> Reduce:
    axes = (axis,) if isinstance(axis, ReduceAxis) else tuple(axis)
    if not axes or not all(isinstance(a, ReduceAxis) for a in axes):
        raise WorkloadError(f"{op} needs reduce axes made by reduce_axis(), got {axis!r}")
    return Reduce(op, as_expr(body, "float32"), tuple(a.axis for a in axes))


def sum_(body: ExprLike, axis: ReduceAxis | Sequence[ReduceAxis]) -> Reduce:
    return _reduce("sum", body, axis)


def max_(body: ExprLike, axis: ReduceAxis | Sequence[ReduceAxis]) -> Reduce:
    return _reduce("max", body, axis)


@dataclass(frozen=True)
class Stage:
    """One computed tensor: `name[spatial axes] (reduce)= body`."""

    name: str
    axes: tuple[Axis, ...]  # spatial axes (one per output dim, in order), then reduce axes
    body: Expr
    reduce: str | None = None  # None, "sum" or "max"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.extent for a in self.axes if a.kind == "spatial")

    @property
    def spatial(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == "spatial")

    @property
    def reduce_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == "reduce")

    @property
    def init_value(self) -> float:
        assert self.reduce is not None
        return REDUCERS[self.reduce]

    def inputs(self) -> list[str]:
        return sorted({ld.buffer for ld in loads(self.body)})

    def flops(self) -> int:
        points = math.prod(a.extent for a in self.axes)
        return points * (count_flops(self.body) + (1 if self.reduce else 0))

    def __str__(self) -> str:
        idx = ", ".join(a.name for a in self.spatial)
        if self.reduce:
            red = ", ".join(a.name for a in self.reduce_axes)
            return f"{self.name}[{idx}] = {self.reduce}({to_str(self.body)}) over {red}"
        return f"{self.name}[{idx}] = {to_str(self.body)}"


@dataclass(eq=False)
class Tensor:
    """A placeholder (input) or the output of a compute; index it to read it in a stage body."""

    name: str
    shape: tuple[int, ...]
    stage: Stage | None = None
    deps: tuple[Tensor, ...] = ()

    def __getitem__(self, idx) -> Load:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != len(self.shape):
            raise WorkloadError(
                f"{self.name} has {len(self.shape)} dimensions but is indexed with {len(idx)}"
            )
        if _capture:
            _capture[-1].append(self)
        exprs = tuple(as_expr(i) for i in idx)
        for e in exprs:
            if e.dtype != "int":
                raise WorkloadError(f"index of {self.name} is not an integer expression: {e}")
        return Load(self.name, exprs)


# Loads carry only buffer names; to build the dependence graph, `compute` records which tensors its
# body indexed while the lambda runs.
_capture: list[list[Tensor]] = []


def _check_extent(extent: object, what: str) -> None:
    if not isinstance(extent, int) or isinstance(extent, bool) or extent <= 0:
        raise WorkloadError(f"{what}: extent must be a positive integer, got {extent!r}")


def placeholder(shape: Sequence[int], name: str) -> Tensor:
    shape = tuple(shape)
    for d, s in enumerate(shape):
        _check_extent(s, f"placeholder {name} dimension {d}")
    return Tensor(name, shape)


def compute(
    shape: Sequence[int],
    fcompute: Callable[..., ExprLike | Reduce],
    name: str,
    axis_names: Sequence[str] | None = None,
) -> Tensor:
    """Define `name[axes] = fcompute(*axes)`; the lambda's parameter names name the axes."""
    shape = tuple(shape)
    for d, s in enumerate(shape):
        _check_extent(s, f"compute {name} dimension {d}")
    if axis_names is None:
        params = list(inspect.signature(fcompute).parameters)
        if len(params) != len(shape):
            raise WorkloadError(
                f"compute {name}: the lambda takes {len(params)} axes "
                f"but the shape has {len(shape)}"
            )
        axis_names = params
    spatial = tuple(Axis(n, e, "spatial") for n, e in zip(axis_names, shape))
    _capture.append([])
    try:
        result = fcompute(*(a.var for a in spatial))
    finally:
        used = _capture.pop()
    if isinstance(result, Reduce):
        body, red, raxes = result.body, result.op, result.axes
    else:
        body, red, raxes = as_expr(result, "float32"), None, ()
    if body.dtype != "float32":
        raise WorkloadError(f"compute {name}: the body is an index expression, not a value: {body}")
    axes = spatial + raxes
    names = [a.name for a in axes]
    if len(set(names)) != len(names):
        raise WorkloadError(f"compute {name}: axis names repeat: {names}")
    unknown = free_vars(body) - set(names)
    if unknown:
        raise WorkloadError(f"compute {name}: body uses axes not in this stage: {sorted(unknown)}")
    stage = Stage(name, axes, body, red)
    deps: dict[str, Tensor] = {}
    for u in used:
        if deps.setdefault(u.name, u) is not u:
            raise WorkloadError(f"compute {name}: two different tensors are both named {u.name!r}")
    return Tensor(name, shape, stage, tuple(deps[n] for n in sorted(deps)))


@dataclass
class Computation:
    """A tensor program: inputs, stages in topological order, outputs, FLOP count.

    `constants` names inputs that hold the same values on every call (a model's weights): a
    kernel bound to them runs the nests that read nothing else (a pack of a weight) once, when
    it is bound, not on each call (`Program.preparation`)."""

    name: str
    inputs: tuple[Tensor, ...]
    stages: tuple[Stage, ...]
    outputs: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    flops: int = 0
    constants: frozenset[str] = frozenset()

    def __init__(self, name: str, outputs: Sequence[Tensor], flops: int | None = None,
                 constants: Sequence[str] = ()):
        self.name = name
        order: list[Tensor] = []
        seen: set[int] = set()
        by_name: dict[str, Tensor] = {}

        def visit(t: Tensor, path: tuple[str, ...]) -> None:
            if t.name in path:
                raise WorkloadError(f"cyclic use of {t.name}")
            if id(t) in seen:
                return
            if t.name in by_name and by_name[t.name] is not t:
                raise WorkloadError(f"two different tensors are both named {t.name!r}")
            by_name[t.name] = t
            if t.stage is not None:
                for dep_name in t.stage.inputs():
                    dep = _find_dep(t, dep_name)
                    visit(dep, path + (t.name,))
            seen.add(id(t))
            order.append(t)

        for out in outputs:
            visit(out, ())
        self.inputs = tuple(t for t in order if t.stage is None)
        self.stages = tuple(t.stage for t in order if t.stage is not None)  # type: ignore[misc]
        self.outputs = tuple(t.name for t in outputs)
        self.shapes = {t.name: t.shape for t in order}
        self.constants = self._checked_constants(constants)
        self._check_bounds()
        self.flops = int(flops) if flops is not None else sum(s.flops() for s in self.stages)

    def with_constants(self, constants: Sequence[str]) -> Computation:
        """This computation with `constants` (names of its inputs) held fixed across calls:
        a layer's weights, when a workload is tuned as one layer of a model."""
        out = copy.copy(self)
        out.constants = self._checked_constants(constants)
        return out

    def _checked_constants(self, constants: Sequence[str]) -> frozenset[str]:
        names = {t.name for t in self.inputs}
        for c in constants:
            if c not in names:
                raise WorkloadError(f"constant {c!r} is not an input of {self.name} "
                                    f"(inputs: {', '.join(sorted(names))})")
        return frozenset(constants)

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def consumers(self, buffer: str) -> list[Stage]:
        return [s for s in self.stages if buffer in s.inputs()]

    def _check_bounds(self) -> None:
        """Every unconditional load stays inside its buffer (checked from affine index ranges)."""
        from .affine import AffineError, bounds_of

        for s in self.stages:
            ranges = {a.name: (0, a.extent - 1) for a in s.axes}
            for ld in _unguarded_loads(s.body):
                shape = self.shapes[ld.buffer]
                for d, (ix, ext) in enumerate(zip(ld.indices, shape)):
                    try:
                        lo, hi = bounds_of(ix, ranges)
                    except AffineError:
                        continue
                    if lo < 0 or hi >= ext:
                        raise WorkloadError(
                            f"stage {s.name} reads {ld.buffer} dimension {d} at {to_str(ix)} "
                            f"in [{lo}, {hi}], outside 0..{ext - 1}"
                        )

    def __str__(self) -> str:
        ins = ", ".join(f"{t.name}{list(t.shape)}" for t in self.inputs)
        return f"{self.name}({ins}):\n" + "\n".join(f"  {s}" for s in self.stages)


def _find_dep(t: Tensor, name: str) -> Tensor:
    for d in t.deps:
        if d.name == name:
            return d
    raise WorkloadError(f"stage {t.name} reads {name}, which is not a tensor it was defined from")


def _unguarded_loads(e: Expr) -> list[Load]:
    """Loads that execute unconditionally (those under a Select branch are guarded by it)."""
    from .expr import Select, children

    if isinstance(e, Select):
        return _unguarded_loads(e.cond)
    out = [e] if isinstance(e, Load) else []
    for k in children(e):
        out += _unguarded_loads(k)
    return out


__all__ = [
    "Axis", "Computation", "Const", "Reduce", "ReduceAxis", "Stage", "Tensor", "WorkloadError",
    "compute", "max_", "placeholder", "reduce_axis", "sum_",
]
