"""ModelBuilder: values and their names, operator arity, pruning at build."""

import numpy as np
import pytest

from eqsched.model import ModelBuilder, ModelError
from eqsched.model.elementwise import Unary


def test_nodes_are_named_by_operator_and_position_unless_named():
    b = ModelBuilder("m")
    x = b.input("x", (3,))
    assert b.relu(x).name == "relu_0"
    assert b.unary("Exp", x).name == "exp_1"
    assert b.unary("Tanh", x, name="t").name == "t"


@pytest.mark.parametrize("name", ["a b", "1x", "x__y", "", "relu_0"])
def test_value_names_are_unique_identifiers_without_a_double_underscore(name):
    b = ModelBuilder("m")
    b.relu(b.input("x", (3,)))
    with pytest.raises(ModelError, match="^m: (value name .* must be an identifier without '__'"
                                         "|two values are named 'relu_0')$"):
        b.input(name, (3,))


@pytest.mark.parametrize("shape", [(0, 3), (2, -1), (2.5,), (True,)])
def test_inputs_need_static_positive_shapes(shape):
    with pytest.raises(ModelError, match="needs a static shape of positive integers"):
        ModelBuilder("m").input("x", shape)


def test_weights_are_float32_and_read_only():
    b = ModelBuilder("m")
    w = b.weight("w", [[1, 2], [3, 4]])
    assert w.shape == (2, 2)
    model = b.build(b.relu(w))
    assert model.weights["w"].dtype == np.float32 and not model.weights["w"].flags.writeable
    with pytest.raises(ModelError, match="weight 'e' is empty"):
        b.weight("e", [])


def test_operators_check_their_arity_and_their_inputs():
    b = ModelBuilder("m")
    x = b.input("x", (3,))
    with pytest.raises(ModelError, match="^m: Relu takes 1 inputs, got 2$"):
        b.apply(Unary("Relu"), [x, x])
    other = ModelBuilder("other").input("z", (3,))
    with pytest.raises(ModelError, match="^m: Relu reads 'z', which is not a value of this model$"):
        b.relu(other)
    with pytest.raises(ModelError, match="gelu approximate must be 'none' or 'tanh'"):
        b.gelu(x, approximate="fast")


def test_build_keeps_only_what_the_outputs_need():
    b = ModelBuilder("m")
    x = b.input("x", (3,))
    unused = b.weight("unused", [1.0, 2.0, 3.0])
    b.add(x, unused, name="dead")
    model = b.build(b.relu(x, name="y"))
    assert [n.name for n in model.nodes] == ["y"] and not model.weights
    assert list(model.inputs) == ["x"]
    with pytest.raises(ModelError, match="a model needs at least one output"):
        b.build()
