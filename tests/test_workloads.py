"""Workload registry: built-ins, user-registered workloads, size validation, flop counts."""

import numpy as np
import pytest

from eqsched.interp import run_program
from eqsched.ir import naive_program
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.te import Computation, WorkloadError, compute, placeholder
from eqsched.workloads import get_workload, list_workloads, workload

BUILT_INS = ["batch_matmul", "conv2d_nchw", "elementwise_chain", "matmul", "mlp", "mm_exp_mm",
             "softmax"]


def test_built_ins_are_registered_with_sizes_matching_their_params():
    names = [w.name for w in list_workloads()]
    assert set(BUILT_INS) <= set(names)
    for name in BUILT_INS:
        wl = get_workload(name)
        assert len(wl.default_size) == len(wl.small_size) == len(wl.params)
        assert wl.numpy_fn is not None and wl.description


def test_conv2d_default_is_the_resnet_layer():
    wl = get_workload("conv2d_nchw")
    assert wl.default_size == (1, 64, 56, 56, 64, 3, 3, 1, 1)
    comp = wl.build(*wl.default_size)
    assert comp.shapes["Y"] == (1, 64, 56, 56)
    assert [s.name for s in comp.stages] == ["Xpad", "Y"]


def test_conv2d_without_padding_has_no_padding_stage():
    comp = get_workload("conv2d_nchw").build(1, 2, 9, 9, 3, 3, 3, 2, 0)
    assert [s.name for s in comp.stages] == ["Y"]
    assert comp.shapes["Y"] == (1, 3, 4, 4)


@pytest.mark.parametrize("name,size,flops", [
    ("matmul", (512, 512, 512), 2 * 512**3),
    ("batch_matmul", (4, 32, 16, 8), 2 * 4 * 32 * 16 * 8),
    ("conv2d_nchw", (1, 64, 56, 56, 64, 3, 3, 1, 1), 2 * 64 * 56 * 56 * 64 * 9),
    ("mm_exp_mm", (8, 6, 12, 10), 2 * 8 * 6 * 12 + 8 * 12 + 2 * 8 * 12 * 10),
    ("softmax", (5, 7), 5 * 35),  # max, subtract, exp, sum, divide
])
def test_flop_counts_follow_the_usual_formulas(name, size, flops):
    assert get_workload(name).flops(size) == flops


def test_unknown_workload_names_the_known_ones():
    with pytest.raises(WorkloadError, match="unknown workload 'nope'.*matmul"):
        get_workload("nope")


@pytest.mark.parametrize("size,message", [
    ((64, 64), "takes 3 sizes"),
    ((64, 0, 64), "N must be positive"),
    ((64, -3, 64), "N must be positive"),
    ((64, 2.5, 64), "N must be an integer"),
    ((64, True, 64), "N must be an integer"),
])
def test_bad_sizes_are_rejected_with_the_parameter_named(size, message):
    with pytest.raises(WorkloadError, match=message):
        get_workload("matmul").build(*size)


def test_conv2d_pad_may_be_zero_but_not_negative():
    wl = get_workload("conv2d_nchw")
    wl.build(1, 1, 4, 4, 1, 3, 3, 1, 0)
    with pytest.raises(WorkloadError, match="pad must be non-negative"):
        wl.build(1, 1, 4, 4, 1, 3, 3, 1, -1)
    with pytest.raises(WorkloadError, match="does not fit"):
        wl.build(1, 1, 2, 2, 1, 5, 5, 1, 0)


def test_users_register_their_own_workloads():
    @workload("test_scale_rows", params=("n", "m"), default=(64, 64), small=(3, 4),
              numpy_fn=lambda ins, n, m: {"Y": ins["X"] * ins["s"][:, None]})
    def scale_rows(n, m):
        """Y[i, j] = X[i, j] * s[i]."""
        X = placeholder((n, m), "X")
        s = placeholder((n,), "s")
        return Computation("scale_rows", [compute((n, m), lambda i, j: X[i, j] * s[i], "Y")])

    wl = get_workload("test_scale_rows")
    assert wl.description == "Y[i, j] = X[i, j] * s[i]."
    assert wl.build(3, 4).shapes["Y"] == (3, 4)
    assert wl.flops((3, 4)) == 12
    with pytest.raises(WorkloadError, match="already registered"):
        workload("test_scale_rows", params=("n",), default=(1,), small=(1,))(lambda n: None)


@pytest.mark.parametrize("name", BUILT_INS)
def test_numpy_fn_agrees_with_the_reference(name):
    wl = get_workload(name)
    comp = wl.build(*wl.small_size)
    inputs = random_inputs(comp, seed=3)
    fast = wl.numpy_fn(inputs, *wl.small_size)
    ok, _, message = compare(fast, reference(comp, inputs), tolerance(comp))
    assert ok, message


@pytest.mark.parametrize("name", BUILT_INS)
def test_naive_loops_agree_with_the_reference(name):
    wl = get_workload(name)
    comp = wl.build(*wl.small_size)
    inputs = random_inputs(comp, seed=4)
    outputs = run_program(naive_program(comp), inputs)
    ok, _, message = compare(outputs, reference(comp, inputs), tolerance(comp))
    assert ok, message


def test_strided_conv2d_numpy_fn_agrees_with_the_reference():
    wl = get_workload("conv2d_nchw")
    size = (2, 3, 9, 8, 4, 3, 2, 2, 1)
    comp = wl.build(*size)
    inputs = random_inputs(comp, seed=5)
    ok, _, message = compare(wl.numpy_fn(inputs, *size), reference(comp, inputs),
                             tolerance(comp))
    assert ok, message
    assert np.isfinite(reference(comp, inputs)["Y"]).all()
