"""ReduceSum/Mean/Max, Softmax and LayerNormalization: each against its formula and through its te
stages."""

import numpy as np
import pytest
from model_checks import check_stages, one_node, random_inputs

from eqsched.model import ModelError
from eqsched.model.reduce import LayerNorm, Reduce, Softmax

FORMULAS = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max}


@pytest.mark.parametrize("kind", sorted(FORMULAS))
@pytest.mark.parametrize("axes,keepdims,out", [
    ((1,), True, (2, 1, 4)),
    ((-1, 0), False, (3,)),
    ((), True, (1, 1, 1)),
    ((), False, ()),
])
def test_reductions_over_axes_keep_or_drop_them(kind, axes, keepdims, out):
    model = one_node(Reduce(kind, axes, keepdims), (2, 3, 4))
    inputs = random_inputs(model, seed=1)
    y = model.evaluate(inputs)["y"]
    want = FORMULAS[kind](inputs["x0"].astype(np.float64), axis=axes or None, keepdims=keepdims)
    assert y.shape == out
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    check_stages(model, inputs)


def test_reductions_refuse_bad_axes():
    with pytest.raises(ModelError, match="^ReduceSum: axis 3 is out of range for rank 3$"):
        one_node(Reduce("ReduceSum", (3,)), (2, 3, 4))
    with pytest.raises(ModelError, match=r"^ReduceMax: axes \[1, -2\] repeat an axis$"):
        one_node(Reduce("ReduceMax", (1, -2)), (2, 3, 4))
    with pytest.raises(ModelError, match="unknown reduction 'ReduceProd'"):
        Reduce("ReduceProd")


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_along_an_axis(axis):
    model = one_node(Softmax(axis), (3, 4, 5))
    inputs = random_inputs(model, seed=2)
    x = inputs["x0"].astype(np.float64) * 4
    inputs["x0"] = x.astype(np.float32)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(model.evaluate(inputs)["y"], e / e.sum(axis=axis, keepdims=True),
                               rtol=1e-5, atol=1e-7)
    check_stages(model, inputs)


def test_softmax_of_a_vector_and_its_compiled_stages():
    model = one_node(Softmax(0), (37,))
    inputs = random_inputs(model, seed=3)
    np.testing.assert_allclose(model.evaluate(inputs)["y"].sum(), 1.0, rtol=1e-6)
    check_stages(model, inputs, backend=True)


@pytest.mark.parametrize("axis,bias", [(-1, True), (1, True), (2, False)])
def test_layer_norm_normalizes_the_trailing_axes(axis, bias):
    shape = (2, 3, 4)
    inner = shape[axis:]
    rng = np.random.default_rng(4)
    weights = {"scale": rng.normal(1, 0.1, inner[-1:])}  # broadcast over the normalized axes
    if bias:
        weights["bias"] = rng.normal(0, 0.1, inner)
    model = one_node(LayerNorm(axis, 1e-3), shape, weights=weights)
    inputs = random_inputs(model, seed=5)
    x = inputs["x0"].astype(np.float64)
    axes = tuple(range(axis % 3, 3))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    want = (x - mean) / np.sqrt(var + 1e-3) * weights["scale"] + weights.get("bias", 0)
    np.testing.assert_allclose(model.evaluate(inputs)["y"], want, rtol=1e-5, atol=1e-5)
    check_stages(model, inputs)


def test_layer_norm_refuses_a_scale_of_another_shape():
    with pytest.raises(ModelError, match=r"scale of shape \(3,\) does not broadcast to the "
                                         r"normalized shape \(4,\)"):
        one_node(LayerNorm(), (2, 4), (3,))
