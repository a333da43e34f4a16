"""MatMul (batched, broadcast, 1-D), Gemm and Conv: each against its definition and through its te
stages."""

import numpy as np
import pytest
from model_checks import check_stages, conv2d, one_node, random_inputs

from eqsched.model import ModelBuilder, ModelError
from eqsched.model.linear import Conv, Gemm, MatMul


@pytest.mark.parametrize("a,b,out", [
    ((3, 4), (4, 5), (3, 5)),
    ((2, 3, 4), (4, 5), (2, 3, 5)),
    ((2, 1, 3, 4), (3, 4, 2), (2, 3, 3, 2)),
    ((4,), (2, 4, 3), (2, 3)),
    ((2, 3, 4), (4,), (2, 3)),
    ((4,), (4,), ()),
])
def test_matmul_is_numpys_with_batches_broadcast_and_vectors(a, b, out):
    model = one_node(MatMul(), a, b)
    inputs = random_inputs(model, seed=1)
    x, w = (inputs[k].astype(np.float64) for k in ("x0", "x1"))
    rows = x[None, :] if len(a) == 1 else x
    cols = w[:, None] if len(b) == 1 else w
    want = (rows[..., :, :, None] * cols[..., None, :, :]).sum(axis=-2)  # broadcast batches
    want = want[..., 0, :] if len(a) == 1 else want
    want = want[..., 0] if len(b) == 1 else want
    y = model.evaluate(inputs)["y"]
    assert y.shape == out
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    check_stages(model, inputs)


def test_matmul_refuses_mismatched_inner_dimensions():
    with pytest.raises(ModelError, match=r"^MatMul: inner dimensions differ: \(3, 4\) @ \(5, 2\)$"):
        one_node(MatMul(), (3, 4), (5, 2))


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True),
                                             (True, True)])
def test_gemm_scales_transposes_and_adds_a_broadcast_bias(trans_a, trans_b):
    a = (4, 3) if trans_a else (3, 4)
    b = (5, 4) if trans_b else (4, 5)
    model = one_node(Gemm(0.5, 2.0, trans_a, trans_b), a, b, (5,))
    inputs = random_inputs(model, seed=2)
    x, w, c = (inputs[k].astype(np.float64) for k in ("x0", "x1", "x2"))
    want = 0.5 * (x.T if trans_a else x) @ (w.T if trans_b else w) + 2.0 * c
    np.testing.assert_allclose(model.evaluate(inputs)["y"], want, rtol=1e-5, atol=1e-6)
    check_stages(model, inputs)


def test_gemm_without_bias_or_scale_is_one_stage():
    model = one_node(Gemm(), (3, 4), (4, 5))
    assert [s.name for s in model.computation().stages] == ["y"]
    assert [s.name for s in one_node(Gemm(), (3, 4), (4, 5), (3, 5)).computation().stages] == [
        "y__mm", "y"]


@pytest.mark.parametrize("pads,strides,bias", [
    ((0, 0, 0, 0), (1, 1), False),
    ((1, 1, 1, 1), (1, 1), True),
    ((1, 0, 2, 1), (2, 1), True),
    ((2, 2, 0, 1), (1, 3), False),
])
def test_conv_pads_and_strides_follow_the_definition(pads, strides, bias):
    shapes = [(2, 3, 7, 8), (4, 3, 3, 2)] + ([(4,)] if bias else [])
    model = one_node(Conv(pads, strides), *shapes)
    inputs = random_inputs(model, seed=3)
    want = conv2d(inputs["x0"], inputs["x1"], pads, strides)
    if bias:
        want = want + inputs["x2"].reshape(1, -1, 1, 1)
    y = model.evaluate(inputs)["y"]
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    check_stages(model, inputs)


def test_conv_stages_compile_and_agree():
    model = one_node(Conv((1, 1, 1, 1), (1, 1)), (1, 4, 6, 6), (8, 4, 3, 3), (8,))
    check_stages(model, random_inputs(model, seed=4), interpreter=False, backend=True)


@pytest.mark.parametrize("shapes,message", [
    (((1, 3, 8), (2, 3, 3)), r"only 2-D convolutions \(NCHW input, KCRS weights\)"),
    (((1, 3, 8, 8), (2, 4, 3, 3)), "input has 3 channels, weights expect 4"),
    (((1, 3, 2, 2), (2, 3, 3, 3)), "a 3x3 window does not fit the padded input"),
    (((1, 3, 8, 8), (2, 3, 3, 3), (3,)), r"bias of shape \(3,\), expected \(2,\)"),
])
def test_conv_refuses_what_it_does_not_compute(shapes, message):
    with pytest.raises(ModelError, match=f"^Conv: {message}"):
        one_node(Conv(), *shapes)


def test_conv_attributes_are_checked_when_made():
    with pytest.raises(ModelError, match="pads must be 4 non-negative integers"):
        Conv((1, 1), (1, 1))
    with pytest.raises(ModelError, match="strides must be 2 positive integers"):
        Conv((0, 0, 0, 0), (0, 1))


def test_the_builder_writes_a_linear_layer():
    b = ModelBuilder("linear")
    x = b.input("x", (2, 4))
    w = b.weight("w", np.arange(12).reshape(3, 4))
    model = b.build(b.gemm(x, w, b.weight("c", np.ones(3)), trans_b=True, name="y"))
    inputs = {"x": np.ones((2, 4), np.float32)}
    np.testing.assert_array_equal(model.evaluate(inputs)["y"], [[7, 23, 39], [7, 23, 39]])
