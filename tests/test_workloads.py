"""Workload registry: built-ins, user-registered workloads, size validation, flop counts."""

import numpy as np
import pytest

from eqsched.interp import run_program
from eqsched.ir import naive_program
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.te import Computation, WorkloadError, compute, placeholder
from eqsched.workloads import get_workload, list_workloads, workload

BUILT_INS = ["batch_matmul", "conv2d_nchw", "elementwise_chain", "gemv", "matmul", "mlp",
             "mm_exp_mm", "softmax"]


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


@pytest.mark.parametrize("size", ["16", 16, {"M": 16}, None])
def test_a_size_that_is_not_a_list_is_refused_as_such(size):
    """A trace's `"size": "16"` was once read as the two sizes "1" and "6"."""
    with pytest.raises(WorkloadError, match="a size is a list of 3 integers"):
        get_workload("matmul").check_size(size)


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


def _prepared_agrees_on_every_call(name, size):
    """The prepared baseline agrees with the float64 reference, again after its output buffers
    are poisoned (every call rewrites them all), and after the inputs are refilled in place
    (every call reads them anew)."""
    wl = get_workload(name)
    comp = wl.build(*size)
    inputs = random_inputs(comp, seed=6)
    run = wl.numpy_baseline(inputs, *size)
    first = run()
    ok, _, message = compare(first, reference(comp, inputs), tolerance(comp))
    assert ok, message
    kept = {k: v.copy() for k, v in first.items()}
    for array in first.values():
        array.fill(np.nan)
    second = run()
    assert second.keys() == kept.keys()
    for k in kept:
        np.testing.assert_array_equal(second[k], kept[k])
    for k, v in random_inputs(comp, seed=7).items():
        inputs[k][...] = v
    ok, _, message = compare(run(), reference(comp, inputs), tolerance(comp))
    assert ok, f"after refilling the inputs: {message}"


@pytest.mark.parametrize("name", BUILT_INS)
def test_prepared_numpy_baseline_agrees_with_the_reference_call_after_call(name):
    wl = get_workload(name)
    assert wl.numpy_prepare is not None  # built-ins allocate their buffers once
    _prepared_agrees_on_every_call(name, wl.small_size)


@pytest.mark.parametrize("size", [(2, 3, 9, 8, 4, 3, 2, 2, 1), (1, 2, 7, 7, 3, 5, 3, 3, 2),
                                  (1, 2, 6, 5, 2, 3, 3, 1, 0), (1, 2, 1, 4, 2, 3, 3, 1, 1)])
def test_prepared_conv2d_baseline_handles_stride_and_padding(size):
    _prepared_agrees_on_every_call("conv2d_nchw", size)


def test_a_workload_with_only_numpy_fn_is_timed_through_it():
    calls = []

    def double(ins, n):
        calls.append(n)
        return {"Y": ins["X"] * 2}

    @workload("test_only_numpy_fn", params=("n",), default=(8,), small=(3,), numpy_fn=double)
    def only_numpy_fn(n):
        """Y = 2 X."""
        X = placeholder((n,), "X")
        return Computation("only_numpy_fn", [compute((n,), lambda i: X[i] * 2.0, "Y")])

    wl = get_workload("test_only_numpy_fn")
    inputs = {"X": np.arange(3, dtype=np.float32)}
    run = wl.numpy_baseline(inputs, 3)
    assert calls == []
    np.testing.assert_array_equal(run()["Y"], [0, 2, 4])
    assert calls == [3]
    with pytest.raises(WorkloadError, match="takes 1 sizes"):
        wl.numpy_baseline(inputs, 3, 4)

    @workload("test_no_numpy", params=("n",), default=(8,), small=(3,))
    def no_numpy(n):
        """Y = 2 X."""
        return only_numpy_fn(n)

    with pytest.raises(WorkloadError, match="test_no_numpy has no numpy implementation"):
        get_workload("test_no_numpy").numpy_baseline(inputs, 3)
