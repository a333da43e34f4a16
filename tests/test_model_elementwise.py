"""Elementwise operators: numpy broadcasting, the unary functions (GELU exact and tanh), and the
folded BatchNormalization; each against its formula and through its te stages."""

import math

import numpy as np
import pytest
from model_checks import check_stages, one_node, random_inputs

from eqsched.model import ModelBuilder, ModelError
from eqsched.model.elementwise import Binary, Unary

erf = np.vectorize(math.erf)


@pytest.mark.parametrize("kind,formula", [
    ("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide)])
def test_binary_operators_broadcast_as_numpy_does(kind, formula):
    model = one_node(Binary(kind), (2, 1, 3), (4, 1))
    inputs = random_inputs(model, seed=1)
    y = model.evaluate(inputs)["y"]
    assert y.shape == (2, 4, 3) and y.dtype == np.float32
    np.testing.assert_allclose(y, formula(inputs["x0"], inputs["x1"]), rtol=1e-6)
    check_stages(model, inputs)


def test_a_one_element_weight_is_folded_into_the_stage_as_a_constant():
    b = ModelBuilder("scale")
    y = b.mul(b.input("x", (3, 4)), b.weight("half", 0.5), name="y")
    model = b.build(y)
    comp = model.computation()
    assert [t.name for t in comp.inputs] == ["x"]
    assert str(comp.stages[0]) == "y[i0, i1] = x[i0, i1] * 0.5"
    assert [t.name for t in model.computation(fold_scalars=False).inputs] == ["half", "x"]
    check_stages(model, random_inputs(model))


def test_shapes_that_do_not_broadcast_are_refused_in_one_line():
    with pytest.raises(ModelError, match=r"^Add: shapes \(2, 3\), \(4,\) do not broadcast$"):
        one_node(Binary("Add"), (2, 3), (4,))


def _gelu(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("kind,formula", [
    ("Relu", lambda x: np.where(x > 0, x, 0)), ("Tanh", np.tanh), ("Exp", np.exp),
    ("Erf", erf), ("Sqrt", lambda x: np.sqrt(x)), ("Sigmoid", lambda x: 1 / (1 + np.exp(-x))),
    ("Gelu", _gelu), ("GeluTanh", _gelu_tanh)])
def test_unary_operators_follow_their_formulas(kind, formula):
    model = one_node(Unary(kind), (3, 5))
    inputs = random_inputs(model, seed=2)
    if kind == "Sqrt":
        inputs["x0"] = np.abs(inputs["x0"])
    x = inputs["x0"].astype(np.float64)
    np.testing.assert_allclose(model.evaluate(inputs)["y"], formula(x), rtol=2e-6, atol=1e-7)
    check_stages(model, inputs)


@pytest.mark.parametrize("kind", ["Gelu", "GeluTanh", "Sigmoid"])
def test_unary_stages_compile_and_agree(kind):
    model = one_node(Unary(kind), (4, 33))
    check_stages(model, random_inputs(model, seed=3), interpreter=False, backend=True)


def test_unknown_elementwise_operators_name_the_known_ones():
    with pytest.raises(ModelError, match="unknown elementwise operator 'Softplus' .known: Relu"):
        Unary("Softplus")
    with pytest.raises(ModelError, match="unknown binary operator 'Pow'"):
        Binary("Pow")


def test_batch_norm_is_folded_into_one_scale_and_shift_per_channel():
    rng = np.random.default_rng(4)
    gamma, beta, mean = rng.normal(size=(3, 3))
    var = rng.uniform(0.5, 2.0, 3)
    b = ModelBuilder("bn")
    x = b.input("x", (2, 3, 4, 5))
    params = [b.weight(k, v) for k, v in zip(("gamma", "beta", "mean", "var"),
                                            (gamma, beta, mean, var))]
    model = b.build(b.batch_norm(x, *params, epsilon=1e-3, name="y"))
    assert [n.op.op_type for n in model.nodes] == ["ScaleShift"]
    assert set(model.weights) == {"y_scale", "y_shift"}
    inputs = random_inputs(model, seed=5)
    c = (1, 3, 1, 1)
    want = ((inputs["x"] - mean.reshape(c)) / np.sqrt(var.reshape(c) + 1e-3) * gamma.reshape(c)
            + beta.reshape(c))
    np.testing.assert_allclose(model.evaluate(inputs)["y"], want, rtol=1e-5, atol=1e-6)
    check_stages(model, inputs)


def test_batch_norm_parameters_must_be_weights():
    b = ModelBuilder("bn")
    x = b.input("x", (1, 2, 3, 3))
    scale = b.input("scale", (2,))
    rest = [b.weight(k, np.ones(2)) for k in ("beta", "mean", "var")]
    with pytest.raises(ModelError, match=r"batch_norm needs weights as parameters, \['scale'\]"):
        b.batch_norm(x, scale, *rest)
