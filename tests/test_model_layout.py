"""Transpose, Reshape and Flatten: element moves whose stage is one re-indexed read (what a
consumer can take over), against numpy and through the te stages."""

import numpy as np
import pytest
from model_checks import check_stages, one_node, random_inputs

from eqsched.expr import Var, to_str
from eqsched.model import ModelBuilder, ModelError
from eqsched.model.layout import Inside, Reshape, Transpose


@pytest.mark.parametrize("perm", [(), (0, 2, 1, 3), (2, 0, 3, 1)])
def test_transpose_permutes_dimensions(perm):
    model = one_node(Transpose(perm), (2, 3, 4, 5))
    inputs = random_inputs(model, seed=1)
    np.testing.assert_array_equal(model.evaluate(inputs)["y"],
                                  np.transpose(inputs["x0"], perm or None))
    check_stages(model, inputs)


def test_transpose_refuses_a_non_permutation():
    with pytest.raises(ModelError, match=r"perm \[0, 0, 1\] is not a permutation of 3"):
        one_node(Transpose((0, 0, 1)), (2, 3, 4))


@pytest.mark.parametrize("old,new", [
    ((2, 12), (2, 3, 4)), ((2, 3, 4), (6, 4)), ((2, 3, 4), (4, 6)), ((1, 6), (3, 1, 2)),
    ((4, 6), (24,)), ((5,), (1, 5, 1)),
])
def test_reshape_keeps_the_row_major_order(old, new):
    model = one_node(Reshape(new), old)
    inputs = random_inputs(model, seed=2)
    np.testing.assert_array_equal(model.evaluate(inputs)["y"], inputs["x0"].reshape(new))
    check_stages(model, inputs)


def test_a_split_of_the_last_dimension_is_an_affine_read():
    """BERT's heads: (128, 768) -> (128, 12, 64) reads x[i0, 64*i1 + i2], no division."""
    index = Reshape((128, 12, 64)).index_map((128, 768), (Var("i0"), Var("i1"), Var("i2")))
    assert [to_str(e) for e in index] == ["i0", "i1 * 64 + i2"]
    merged = Reshape((128, 768)).index_map((128, 12, 64), (Var("i0"), Var("i1")))
    assert [to_str(e) for e in merged] == ["i0", "i1 // 64", "i1 % 64"]


def test_layout_operators_are_marked_so():
    assert Transpose().layout and Reshape((1,)).layout and Inside(((0, 0),)).layout


def test_inside_leaves_the_border_out_and_reads_past_the_befores():
    model = one_node(Inside(((0, 0), (1, 2), (2, 0))), (2, 6, 5))
    inputs = random_inputs(model, seed=3)
    np.testing.assert_array_equal(model.evaluate(inputs)["y"], inputs["x0"][:, 1:4, 2:])
    check_stages(model, inputs)
    index = Inside(((0, 0), (1, 2))).index_map((2, 6), (Var("i0"), Var("i1")))
    assert [to_str(e) for e in index] == ["i0", "i1 + 1"]
    with pytest.raises(ModelError, match=r"Inside: border .* does not fit in \(2, 3\)"):
        one_node(Inside(((0, 0), (2, 1))), (2, 3))


def test_builder_reshape_infers_one_dimension_and_flatten_is_a_reshape():
    b = ModelBuilder("shapes")
    x = b.input("x", (2, 3, 4))
    assert b.reshape(x, (-1, 4)).shape == (6, 4)
    assert [b.flatten(x, axis).shape for axis in (0, 1, 2, 3, -1)] == [
        (1, 24), (2, 12), (6, 4), (24, 1), (6, 4)]
    with pytest.raises(ModelError, match=r"cannot reshape \(2, 3, 4\) to \(5, -1\)"):
        b.reshape(x, (5, -1))
    with pytest.raises(ModelError, match="dimensions must be positive, one may be -1"):
        b.reshape(x, (-1, -1))
    with pytest.raises(ModelError, match=r"Reshape: cannot reshape \(2, 3, 4\) to \(5, 5\)"):
        b.reshape(x, (5, 5))
