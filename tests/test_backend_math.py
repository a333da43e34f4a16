"""The backend's own exp/log/tanh/erf (and llvm.sqrt), scalar and vector, against float64 numpy."""

import math
import re
from dataclasses import replace

import numpy as np
import pytest

from eqsched import expr, te
from eqsched.backend import compile_program
from eqsched.ir import Binding, LoopKind, Program, naive_program, nest

LANES = 16


def unary_programs(fn: str, n: int) -> tuple[Program, Program]:
    """Y[i] = fn(X[i]) as the naive scalar loop and with i split into (n/16, 16 vectorized)."""
    x = te.placeholder((n,), "X")
    y = te.compute((n,), lambda i: getattr(expr, fn)(x[i]), "Y")
    scalar = naive_program(te.Computation(fn, [y]))
    block = replace(scalar.blocks()[0],
                    bindings=(Binding("i", (("Y.i.0", LANES), ("Y.i.1", 1))),))
    loops = [("Y.i.0", n // LANES, LoopKind.SERIAL), ("Y.i.1", LANES, LoopKind.VECTOR)]
    return scalar, scalar.with_body(nest(loops, (block,)))


def ulp_error(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Error in units of the float32 spacing at the exact result; matching inf/nan count as 0."""
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = exact.astype(np.float32)
        err = np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(rounded))
    err[(got == rounded) | (np.isnan(got) & np.isnan(exact))] = 0.0
    return err


def special(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


rng = np.random.default_rng(7)
INPUTS = {
    # Overflow to inf above 88.72, subnormal results below -87.3, zero below -103.97.
    "exp": np.concatenate([np.linspace(-110, 95, 20000, dtype=np.float32),
                           special(np.inf, -np.inf, np.nan, 0.0, 88.72, 88.73, -103.9, -104.5)]),
    # Positive floats from subnormal to near FLT_MAX, plus the special cases.
    "log": np.concatenate([np.exp(rng.uniform(-103, 88, 20000)).astype(np.float32),
                           special(0.0, -1.0, np.inf, np.nan, 1.0, 1e-45, 3.4e38, 0.70710677)]),
    # Both sides of the |x| = 0.625 switch between polynomial and exp formula; tiny values.
    "tanh": np.concatenate([rng.uniform(-12, 12, 10000).astype(np.float32),
                            np.exp(rng.uniform(-30, 0, 10000)).astype(np.float32),
                            special(0.0, np.inf, -np.inf, np.nan, 0.625, -0.625, 0.6249999)]),
    # Both sides of the clamp at |x| = 4, where erf is +-1 in float32; tiny values.
    "erf": np.concatenate([rng.uniform(-6, 6, 20000).astype(np.float32),
                           np.exp(rng.uniform(-30, 0, 10000)).astype(np.float32),
                           special(0.0, np.inf, -np.inf, np.nan, 4.0, -4.0, 3.9999998)]),
    "sqrt": np.concatenate([np.exp(rng.uniform(-103, 88, 20000)).astype(np.float32),
                            special(0.0, -1.0, np.inf, np.nan)]),
}
# erf's rational approximation is a few ulps off near 1 (an absolute error below 4e-7).
MAX_ULP = {"exp": 1.0, "log": 1.0, "tanh": 2.0, "sqrt": 0.5, "erf": 6.0}
EXACT = {"erf": np.vectorize(math.erf, otypes=[np.float64])}


@pytest.mark.parametrize("fn", sorted(INPUTS))
def test_math_function_is_within_ulps_of_numpy_scalar_and_vector(fn):
    x = INPUTS[fn]
    x = np.concatenate([x, np.ones(-len(x) % LANES, np.float32)])
    with np.errstate(divide="ignore", invalid="ignore"):
        exact = (EXACT.get(fn) or getattr(np, fn))(x.astype(np.float64))
    for prog in unary_programs(fn, len(x)):
        y = np.empty_like(x)
        compile_program(prog)(x, y)
        err = ulp_error(y, exact)
        worst = int(np.argmax(err))
        kind = prog.loops()[-1].kind.value
        assert err[worst] <= MAX_ULP[fn], f"{fn} ({kind}) at x={x[worst]!r}: {y[worst]!r}"
        assert np.array_equal(np.isnan(y), np.isnan(exact)), f"{fn} ({kind}) NaN mismatch"


@pytest.mark.parametrize("fn", sorted(INPUTS))
def test_math_functions_are_inline_code_not_libm_calls(fn):
    for prog in unary_programs(fn, 64):
        assert not re.search(r"\bcall", compile_program(prog).asm())
