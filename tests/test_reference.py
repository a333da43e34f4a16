"""The numpy oracle: stage-by-stage evaluation, chunking, guarded loads, inputs and tolerances."""

import math

import numpy as np
import pytest

import eqsched.reference as ref_mod
from eqsched.expr import all_of, erf, exp, log, select, sqrt, tanh
from eqsched.interp import run_program
from eqsched.ir import naive_program
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.te import Computation, WorkloadError, compute, max_, placeholder, reduce_axis, sum_
from eqsched.workloads import get_workload


def _matmul(m, n, k):
    return get_workload("matmul").build(m, n, k)


def test_matmul_matches_numpy_in_float64():
    comp = _matmul(33, 17, 45)
    inputs = random_inputs(comp, seed=0)
    out = reference(comp, inputs)["C"]
    assert out.dtype == np.float64
    want = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_chunked_evaluation_equals_unchunked(monkeypatch):
    """A non-product reduction, forced into many boxes, gives the same result as one box."""
    A = placeholder((20, 30), "A")
    B = placeholder((30, 12), "B")
    k = reduce_axis(30, "k")
    C = compute((20, 12), lambda i, j: max_(A[i, k] + exp(B[k, j]), axis=k), "C")
    comp = Computation("maxplus", [C])
    inputs = random_inputs(comp, seed=1)
    whole = reference(comp, inputs)["C"]
    monkeypatch.setattr(ref_mod, "_ELEMENTS", 50)
    assert len(ref_mod._boxes(comp.stages[0], lambda c: np.prod(list(c.values())))) > 10
    np.testing.assert_array_equal(reference(comp, inputs)["C"], whole)
    a, b = inputs["A"].astype(np.float64), np.exp(inputs["B"].astype(np.float64))
    np.testing.assert_allclose(whole, (a[:, :, None] + b[None]).max(axis=1), rtol=1e-12)


def test_chunked_contraction_equals_numpy(monkeypatch):
    monkeypatch.setattr(ref_mod, "_ELEMENTS", 64)
    comp = _matmul(24, 10, 40)
    inputs = random_inputs(comp, seed=2)
    want = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)
    np.testing.assert_allclose(reference(comp, inputs)["C"], want, rtol=1e-12, atol=1e-12)


def test_sum_over_an_axis_the_body_ignores_counts_each_point():
    X = placeholder((4,), "X")
    Y = placeholder((4,), "Y")
    r = reduce_axis(5, "r")
    C = compute((4,), lambda i: sum_(X[i] * Y[i], axis=r), "C")
    comp = Computation("repeat", [C])
    inputs = random_inputs(comp, seed=0)
    want = 5 * inputs["X"].astype(np.float64) * inputs["Y"]
    np.testing.assert_allclose(reference(comp, inputs)["C"], want, rtol=1e-12)


def test_select_guards_out_of_bounds_loads():
    X = placeholder((5,), "X")
    P = compute((9,), lambda i: select(all_of(i >= 2, i < 7), X[i - 2], -1.0), "P")
    comp = Computation("pad", [P])
    x = np.arange(5, dtype=np.float32)
    out = reference(comp, {"X": x})["P"]
    np.testing.assert_array_equal(out, [-1, -1, 0, 1, 2, 3, 4, -1, -1])


def test_math_functions_and_index_arithmetic():
    X = placeholder((12,), "X")
    Y = compute((6, 2), lambda i, j: tanh(sqrt(exp(X[i * 2 + j])) + log(X[(i * 2 + j) % 12]))
                + X[(i + 6) // 2 - 3 + j], "Y")
    comp = Computation("fns", [Y])
    x = np.linspace(0.5, 2.0, 12).astype(np.float32)
    xd = x.astype(np.float64)
    i, j = np.meshgrid(np.arange(6), np.arange(2), indexing="ij")
    flat = i * 2 + j
    want = np.tanh(np.sqrt(np.exp(xd[flat])) + np.log(xd[flat % 12])) + xd[(i + 6) // 2 - 3 + j]
    np.testing.assert_allclose(reference(comp, {"X": x})["Y"], want, rtol=1e-12)


def test_erf_is_exact_in_the_reference_and_the_interpreter():
    """numpy has no erf: the oracle takes math.erf per element (GELU's exact form needs it)."""
    X = placeholder((7,), "X")
    comp = Computation("erf", [compute((7,), lambda i: erf(X[i]), "Y")])
    x = np.array([-3.0, -1.0, -0.1, 0.0, 1e-6, 0.7, 5.0], np.float32)
    want = [math.erf(float(v)) for v in x]
    np.testing.assert_allclose(reference(comp, {"X": x})["Y"], want, rtol=1e-15)
    np.testing.assert_allclose(run_program(naive_program(comp), {"X": x})["Y"], want, rtol=1e-6)


def test_intermediates_stay_in_float64():
    """exp(100) overflows float32 but not float64; the reference must not round in between."""
    X = placeholder((3,), "X")
    E = compute((3,), lambda i: exp(X[i] * 100.0), "E")
    L = compute((3,), lambda i: log(E[i]), "L")
    out = reference(Computation("roundtrip", [L]), {"X": np.ones(3, np.float32)})["L"]
    np.testing.assert_allclose(out, 100.0)


def test_missing_or_misshapen_inputs_are_errors():
    comp = _matmul(4, 4, 4)
    with pytest.raises(WorkloadError, match="input B is missing"):
        reference(comp, {"A": np.zeros((4, 4), np.float32)})
    with pytest.raises(WorkloadError, match=r"A has shape \(4, 5\)"):
        reference(comp, {"A": np.zeros((4, 5)), "B": np.zeros((4, 4))})


def test_random_inputs_are_float32_seeded_and_scaled_by_reduction_length():
    comp = _matmul(8, 8, 256)
    a = random_inputs(comp, seed=7)
    b = random_inputs(comp, seed=7)
    assert all(v.dtype == np.float32 for v in a.values())
    np.testing.assert_array_equal(a["A"], b["A"])
    assert not np.array_equal(a["A"], random_inputs(comp, seed=8)["A"])
    assert np.abs(a["A"]).max() <= 256 ** -0.25
    assert np.abs(a["A"]).max() > 0.5 * 256 ** -0.25


def test_mm_exp_mm_default_inputs_do_not_overflow_exp():
    comp = get_workload("mm_exp_mm").build(16, 4096, 8, 4)
    out = reference(comp, random_inputs(comp, seed=0))["F"]
    assert np.isfinite(out).all()


def test_tolerance_grows_with_summed_reduction_length_but_not_with_max():
    small, big = tolerance(_matmul(8, 8, 16)), tolerance(_matmul(8, 8, 4096))
    assert small[0] < big[0] and small[1] < big[1]
    assert big[0] == pytest.approx(16 * small[0])
    assert tolerance(get_workload("elementwise_chain").build(100)) == (1e-5, 1e-5)
    softmax = tolerance(get_workload("softmax").build(4, 400))
    assert softmax[0] == pytest.approx(1e-5 * 20)  # only the row sum counts, not the row max


def test_compare_accepts_rounding_and_reports_real_errors():
    want = {"C": np.linspace(-1, 1, 12).reshape(3, 4)}
    ok, err, _ = compare({"C": (want["C"] + 1e-7).astype(np.float32)}, want, (1e-5, 1e-5))
    assert ok and err < 1e-6
    wrong = want["C"].copy()
    wrong[1, 2] += 0.5
    ok, err, message = compare({"C": wrong}, want, (1e-5, 1e-5))
    assert not ok and err == pytest.approx(0.5)
    assert "1 of 12 elements off" in message and "(1, 2)" in message


def test_compare_scales_atol_to_the_outputs_magnitude():
    want = {"Y": np.full(1000, 1e-3) + np.linspace(0, 1e-4, 1000)}
    uniform = {"Y": np.full(1000, 1.05e-3)}
    ok, _, _ = compare(uniform, want, (1e-4, 1e-4))
    assert not ok


def test_compare_flags_nan_missing_and_misshapen_outputs():
    want = {"C": np.zeros((2, 2))}
    assert not compare({"C": np.full((2, 2), np.nan)}, want, (1e-5, 1e-5))[0]
    assert "missing" in compare({}, want, (1e-5, 1e-5))[2]
    assert "shape" in compare({"C": np.zeros(4)}, want, (1e-5, 1e-5))[2]


def test_loads_of_the_same_axis_twice_use_the_gather_path():
    X = placeholder((4, 4), "X")
    D = compute((4,), lambda i: X[i, i] * 2.0, "D")
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(reference(Computation("diag", [D]), {"X": x})["D"],
                                  2 * np.diag(x))

