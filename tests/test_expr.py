"""Expressions: typing, operators, traversal, flop counting."""

import pytest

from eqsched.expr import (
    BinOp,
    Call,
    Const,
    Load,
    Var,
    count_flops,
    exp,
    free_vars,
    relu,
    select,
    substitute,
    to_str,
)


def test_python_numbers_take_the_other_operands_type():
    i = Var("i")
    assert (i + 1) == BinOp("+", i, Const(1, "int"))
    x = Load("A", (i,))
    assert (x * 2) == BinOp("*", x, Const(2.0, "float32"))
    assert (2 - x).a == Const(2.0, "float32")


def test_mixing_index_and_value_types_is_an_error():
    with pytest.raises(TypeError, match="cannot combine"):
        Var("i") + Load("A", (Var("i"),))


def test_floor_division_is_index_only_and_true_division_value_only():
    with pytest.raises(TypeError, match="not defined on float32"):
        Load("A", (Var("i"),)) // 2
    with pytest.raises(TypeError, match="not defined on int"):
        Var("i") / 2


def test_expressions_are_hashable_and_structural():
    a = exp(Load("A", (Var("i") + 1,)))
    b = exp(Load("A", (Var("i") + 1,)))
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1


def test_substitute_and_free_vars():
    e = Load("A", (Var("i") * 4 + Var("j"),)) + 1.0
    out = substitute(e, {"i": Var("x") + 1})
    assert free_vars(out) == {"x", "j"}
    assert to_str(out) == "A[(x + 1) * 4 + j] + 1.0"


def test_select_needs_a_comparison():
    i = Var("i")
    s = select(i >= 1, Load("A", (i - 1,)), 0.0)
    assert to_str(s) == "select(i >= 1, A[i - 1], 0.0)"
    with pytest.raises(TypeError, match="comparison"):
        select(i, 1.0, 0.0)


def test_count_flops_counts_value_arithmetic_and_math_calls():
    i = Var("i")
    body = relu(Load("A", (i * 2,)) * Load("B", (i,)) + 1.0)
    assert count_flops(body) == 3  # mul, add, max; the index product does not count
    assert count_flops(-exp(Load("A", (i,)))) == 1
    assert isinstance(-Load("A", (i,)), Call)


def test_a_select_counts_the_flops_of_its_costlier_branch_the_one_it_may_take():
    i, a, b = Var("i"), Load("A", (Var("i"),)), Load("B", (Var("i"),))
    assert count_flops(select(i < 2, a + b + a, a * b) + 1.0) == 3
    assert count_flops(select(i < 2, a, 0.0)) == 0  # padding
