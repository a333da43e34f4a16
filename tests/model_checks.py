"""Shared checks of the model tests: a model's te stages compute what its numpy evaluation does."""

from __future__ import annotations

import numpy as np

from eqsched.backend import compile_program
from eqsched.interp import run_program
from eqsched.ir import naive_program
from eqsched.model import Model, ModelBuilder, Operator
from eqsched.reference import compare, reference, tolerance


def random_inputs(model: Model, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in model.inputs.items()}


def one_node(op: Operator, *shapes: tuple[int, ...], weights: dict | None = None) -> Model:
    """A model of one node applying `op` to inputs x0, x1, ... of `shapes`, then `weights`."""
    b = ModelBuilder(op.op_type.lower())
    args = [b.input(f"x{i}", s) for i, s in enumerate(shapes)]
    args += [b.weight(k, v) for k, v in (weights or {}).items()]
    return b.build(b.apply(op, args, name="y"))


def check_stages(model: Model, inputs: dict[str, np.ndarray], interpreter: bool = True,
                 backend: bool = False) -> None:
    """The model's te computation, evaluated by the float64 oracle, by the loop interpreter on the
    naive program, and (when asked) compiled, agrees with `model.evaluate`."""
    comp = model.computation()
    expected = model.evaluate(inputs)
    feeds = model.bind(comp, inputs)
    want = reference(comp, feeds)
    tol = tolerance(comp)
    ok, _, message = compare({k: v.reshape(want[k].shape) for k, v in expected.items()}, want,
                             tol)
    assert ok, f"numpy evaluation vs the te stages: {message}"
    runs = {}
    if interpreter:
        runs["interpreter"] = run_program(naive_program(comp), feeds)
    if backend:
        runs["backend"] = compile_program(naive_program(comp)).run(feeds)
    for how, got in runs.items():
        shaped = {k: v.reshape(want[k].shape) for k, v in got.items() if k in want}
        ok, _, message = compare(shaped, want, tol)
        assert ok, f"{how}: {message}"


def conv2d(x: np.ndarray, w: np.ndarray, pads: tuple[int, int, int, int] = (0, 0, 0, 0),
           strides: tuple[int, int] = (1, 1)) -> np.ndarray:
    """A convolution by its definition, one output pixel at a time, in float64."""
    top, left, bottom, right = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    k, _, r, s = w.shape
    p = (xp.shape[2] - r) // strides[0] + 1
    q = (xp.shape[3] - s) // strides[1] + 1
    y = np.zeros((x.shape[0], k, p, q))
    for i in range(p):
        for j in range(q):
            window = xp[:, :, i * strides[0]:i * strides[0] + r, j * strides[1]:j * strides[1] + s]
            y[:, :, i, j] = np.einsum("ncrs,kcrs->nk", window, w)
    return y
