"""The numpy oracle: evaluate a computation's stages directly, in float64, with broadcasting.

It reads the `Computation`, never a loop program, so every schedule is checked against the meaning
the user wrote. Each stage is evaluated over boxes of its iteration domain (axis i of the box is
array dimension i); reductions are cut into boxes along their axes so no intermediate exceeds
`BUDGET_BYTES`. A sum of a product (matmul, conv2d) is contracted with `np.einsum` instead of
materializing the product; matmul-shaped ones run in BLAS (docs/ARCHITECTURE.md §17.5).

See docs/ARCHITECTURE.md §6 Programs and schedules.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from .expr import BinOp, Call, Cmp, Const, Expr, Load, Select, Var, free_vars
from .te import Computation, Stage, WorkloadError

_erf = np.frompyfunc(math.erf, 1, 1)

BUDGET_BYTES = 64 << 20
_ELEMENTS = BUDGET_BYTES // 8  # float64

_FLOAT_OPS: dict[str, Callable] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide,
    "max": np.maximum, "min": np.minimum, "//": np.floor_divide, "%": np.mod,
}
_CMP_OPS: dict[str, Callable] = {
    "<": np.less, "<=": np.less_equal, "==": np.equal, "!=": np.not_equal,
    ">=": np.greater_equal, ">": np.greater, "and": np.logical_and,
}
_CALLS: dict[str, Callable] = {
    "exp": np.exp, "sqrt": np.sqrt, "log": np.log, "neg": np.negative, "abs": np.abs,
    "tanh": np.tanh,
    # numpy has no erf ufunc; math.erf per element is exact in float64 and fast enough here.
    "erf": lambda x: np.asarray(_erf(x), np.float64),
}


@dataclass(frozen=True)
class _Box:
    """A rectangular piece of a stage's iteration domain: axis names with [start, stop) ranges."""

    axes: tuple[str, ...]
    starts: tuple[int, ...]
    stops: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.starts, self.stops))

    def grid(self, axis: str) -> np.ndarray:
        """The axis' values, shaped to broadcast along its own dimension."""
        d = self.axes.index(axis)
        shape = [1] * len(self.axes)
        shape[d] = -1
        return np.arange(self.starts[d], self.stops[d]).reshape(shape)


class _Evaluator:
    def __init__(self, buffers: Mapping[str, np.ndarray], box: _Box):
        self.buffers = buffers
        self.box = box

    def eval(self, e: Expr, guarded: bool = False):
        if isinstance(e, Const):
            return e.value
        if isinstance(e, Var):
            return self.box.grid(e.name)
        if isinstance(e, Load):
            return self.load(e, guarded)
        if isinstance(e, BinOp):
            return _FLOAT_OPS[e.op](self.eval(e.a, guarded), self.eval(e.b, guarded))
        if isinstance(e, Call):
            return _CALLS[e.fn](self.eval(e.args[0], guarded))
        if isinstance(e, Cmp):
            return _CMP_OPS[e.op](self.eval(e.a, guarded), self.eval(e.b, guarded))
        if isinstance(e, Select):
            # Both branches are computed for every point; the untaken one may index out of
            # bounds (that is what the select guards), so its loads clamp their indices.
            cond = self.eval(e.cond, guarded)
            return np.where(cond, self.eval(e.a, True), self.eval(e.b, True))
        raise TypeError(f"cannot evaluate {e!r}")

    def load(self, e: Load, guarded: bool):
        data = self.buffers[e.buffer]
        sliced = self._sliced_load(e, data)
        if sliced is not None:
            return sliced
        idx = [self.eval(ix, guarded) for ix in e.indices]
        if guarded:
            idx = [np.clip(ix, 0, n - 1) for ix, n in zip(idx, data.shape)]
        return data[tuple(idx)]

    def _sliced_load(self, e: Load, data: np.ndarray) -> np.ndarray | None:
        """A view for the common case of indices that are distinct axes (no gather, no copy)."""
        box, picks, dims = self.box, [], []
        for ix, n in zip(e.indices, data.shape):
            if not isinstance(ix, Var) or ix.name in dims:
                return None
            d = box.axes.index(ix.name)
            if box.stops[d] > n:
                return None
            picks.append(slice(box.starts[d], box.stops[d]))
            dims.append(ix.name)
        order = sorted(range(len(dims)), key=lambda p: box.axes.index(dims[p]))
        view = data[tuple(picks)].transpose(order)
        shape = [ext if a in dims else 1 for a, ext in zip(box.axes, box.shape)]
        return view.reshape(shape)


def _boxes(stage: Stage, elements: Callable[[dict[str, int]], int]) -> list[_Box]:
    """Cut the stage's domain into boxes of at most `_ELEMENTS` working elements each.

    Reduce axes are cut first (outermost first), then spatial axes: halving one axis at a time
    until `elements(chunk sizes)` fits the budget.
    """
    axes = stage.axes
    chunk = {a.name: a.extent for a in axes}
    for a in list(stage.reduce_axes) + list(stage.spatial):
        while elements(chunk) > _ELEMENTS and chunk[a.name] > 1:
            chunk[a.name] = -(-chunk[a.name] // 2)
    ranges = [
        [(s, min(s + chunk[a.name], a.extent)) for s in range(0, a.extent, chunk[a.name])]
        for a in axes
    ]
    names = tuple(a.name for a in axes)
    return [
        _Box(names, tuple(r[0] for r in combo), tuple(r[1] for r in combo))
        for combo in itertools.product(*ranges)
    ]


def _contraction(stage: Stage) -> tuple[Expr, Expr] | None:
    """The two factors when the stage is a sum of a product, else None."""
    body = stage.body
    if stage.reduce == "sum" and isinstance(body, BinOp) and body.op == "*":
        return body.a, body.b
    return None


def _contract(stage: Stage, ev: _Evaluator, factors: tuple[Expr, Expr]) -> np.ndarray:
    """sum over the box's reduce axes of a*b, via einsum (BLAS for matmul-shaped contractions)."""
    box = ev.box
    letters = {name: chr(ord("a") + d) for d, name in enumerate(box.axes)}
    operands, subscripts = [], []
    used: set[str] = set()
    for f in factors:
        deps = [a for a in box.axes if a in free_vars(f)]
        value = np.asarray(ev.eval(f), dtype=np.float64)
        full = [ext if a in deps else 1 for a, ext in zip(box.axes, box.shape)]
        operands.append(np.broadcast_to(value, full).reshape([box.shape[box.axes.index(a)]
                                                              for a in deps]))
        subscripts.append("".join(letters[a] for a in deps))
        used.update(deps)
    spatial = [a.name for a in stage.spatial]
    out_axes = [a for a in spatial if a in used]
    result = np.einsum(f"{','.join(subscripts)}->{''.join(letters[a] for a in out_axes)}",
                       *operands, optimize=True)
    # Reduce axes neither factor depends on multiply the sum by their length.
    for a in stage.reduce_axes:
        if a.name not in used:
            result = result * box.shape[box.axes.index(a.name)]
    shape = [box.shape[box.axes.index(a)] if a in used else 1 for a in spatial]
    return result.reshape(shape)


def _evaluate_stage(stage: Stage, buffers: Mapping[str, np.ndarray]) -> np.ndarray:
    out = np.empty(stage.shape, dtype=np.float64)
    n_spatial = len(stage.spatial)
    if stage.reduce is not None:
        out.fill(stage.init_value)
    factors = _contraction(stage)
    if factors is not None:
        deps = [free_vars(f) for f in factors]

        def elements(chunk: dict[str, int]) -> int:
            return max(math.prod(chunk[a] for a in d if a in chunk) for d in deps)
    else:
        def elements(chunk: dict[str, int]) -> int:
            return math.prod(chunk.values())

    for box in _boxes(stage, elements):
        ev = _Evaluator(buffers, box)
        target = tuple(slice(a, b) for a, b in zip(box.starts, box.stops))[:n_spatial]
        if factors is not None:
            out[target] += _contract(stage, ev, factors)
            continue
        value = np.broadcast_to(np.asarray(ev.eval(stage.body), dtype=np.float64), box.shape)
        red = tuple(range(n_spatial, len(box.axes)))
        if stage.reduce is None:
            out[target] = value
        elif stage.reduce == "sum":
            out[target] += value.sum(axis=red)
        else:
            out[target] = np.maximum(out[target], value.max(axis=red))
    return out


def reference(comp: Computation, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The computation's outputs (float64) for the given inputs."""
    buffers: dict[str, np.ndarray] = {}
    for t in comp.inputs:
        if t.name not in inputs:
            raise WorkloadError(f"reference: input {t.name} is missing")
        arr = np.asarray(inputs[t.name], dtype=np.float64)
        if arr.shape != t.shape:
            raise WorkloadError(f"reference: input {t.name} has shape {arr.shape}, "
                                f"expected {t.shape}")
        buffers[t.name] = arr
    with np.errstate(all="ignore"):  # overflow to inf is a result to compare, not a warning
        for stage in comp.stages:
            buffers[stage.name] = _evaluate_stage(stage, buffers)
    return {name: buffers[name] for name in comp.outputs}


def _sum_lengths(comp: Computation) -> dict[str, int]:
    """For each input, the longest sum-reduction that reads it directly."""
    out: dict[str, int] = {}
    for s in comp.stages:
        if s.reduce == "sum":
            length = math.prod(a.extent for a in s.reduce_axes)
            for name in s.inputs():
                out[name] = max(out.get(name, 1), length)
    return out


def random_inputs(comp: Computation, seed: int = 0) -> dict[str, np.ndarray]:
    """float32 inputs, U(-1, 1), each scaled by R^(-1/4) when a sum over R terms reads it.

    A sum of R products of two such inputs then stays O(1) whatever R is, so exp of it cannot
    overflow and one absolute tolerance fits all sizes.
    """
    rng = np.random.default_rng(seed)
    lengths = _sum_lengths(comp)
    out = {}
    for t in comp.inputs:
        scale = lengths.get(t.name, 1) ** -0.25
        out[t.name] = (rng.uniform(-1.0, 1.0, t.shape) * scale).astype(np.float32)
    return out


def tolerance(comp: Computation) -> tuple[float, float]:
    """(rtol, atol) for float32 results: 1e-5, growing with sqrt of the summed reduction lengths.

    float32 rounding in a sum of R terms grows like sqrt(R) * eps on average; chained sums
    (mm_exp_mm) pass their error on, so their lengths add up. A max rounds nothing.
    """
    total = sum(math.prod(a.extent for a in s.reduce_axes)
                for s in comp.stages if s.reduce == "sum")
    tol = 1e-5 * math.sqrt(max(total, 1))
    return tol, tol


def compare(outputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
            tol: tuple[float, float]) -> tuple[bool, float, str]:
    """(ok, max |error|, message): ok when every element is within atol*scale + rtol*|expected|.

    `scale` is the output's largest expected magnitude (1 if it is all zeros), so atol keeps its
    meaning for outputs much smaller than 1, such as a softmax over many columns.
    """
    rtol, atol = tol
    max_err = 0.0
    problems = []
    for name, want in expected.items():
        got = outputs.get(name)
        if got is None:
            problems.append(f"output {name} is missing")
            continue
        got = np.asarray(got, dtype=np.float64)
        if got.shape != want.shape:
            problems.append(f"{name} has shape {got.shape}, expected {want.shape}")
            continue
        err = np.abs(got - want)
        both_inf = np.isinf(want) & (got == want)
        err[both_inf] = 0.0
        err[np.isnan(err)] = np.inf  # NaN where a number was expected (or the reverse)
        finite = np.abs(want[np.isfinite(want)])
        scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        bad = err > atol * scale + rtol * np.abs(want)
        if err.size:
            max_err = max(max_err, float(err.max()))
        if bad.any():
            at = np.unravel_index(int(np.argmax(np.where(bad, err, -1.0))), err.shape)
            where = tuple(int(x) for x in at)
            problems.append(f"{name}: {int(bad.sum())} of {bad.size} elements off, e.g. at "
                            f"{where} got {got[at]:.6g} expected {want[at]:.6g}")
    if problems:
        return False, max_err, "; ".join(problems) + f" (rtol={rtol:.2g}, atol={atol:.2g})"
    return True, max_err, f"max |error| {max_err:.3g} within rtol={rtol:.2g}, atol={atol:.2g}"
