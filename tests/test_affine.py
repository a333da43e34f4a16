"""Affine index analysis: mixed-radix sums, packed layouts, non-affine rejection."""

import pytest

from eqsched.affine import Affine, AffineError, bounds_of, interval_of, to_affine
from eqsched.expr import Var

i0, i1, j = Var("i0"), Var("i1"), Var("j")
RANGES = {"i0": (0, 63), "i1": (0, 7), "j": (0, 511)}


def test_mixed_radix_sum_is_affine():
    a = to_affine(i0 * 8 + i1 + 3, RANGES)
    assert a == Affine.of({"i0": 8, "i1": 1}, 3)
    assert a.bounds(RANGES) == (3, 514)


def test_div_and_mod_of_a_split_axis_give_its_pieces():
    i = i0 * 8 + i1
    assert to_affine(i // 8, RANGES) == Affine.of({"i0": 1})
    assert to_affine(i % 8, RANGES) == Affine.of({"i1": 1})


def test_div_that_straddles_a_boundary_is_not_affine():
    with pytest.raises(AffineError, match="not affine"):
        to_affine((i0 * 8 + i1) // 3, RANGES)
    with pytest.raises(AffineError, match="not affine"):
        to_affine(j % 32, RANGES)


def test_products_of_variables_are_rejected():
    with pytest.raises(AffineError, match="product of two variables"):
        to_affine(i0 * i1, RANGES)


def test_bounds_with_negative_coefficients():
    assert bounds_of(j - i1 * 2 - 1, RANGES) == (-15, 510)


def test_round_trip_through_expr():
    a = Affine.of({"i0": 8, "i1": 1}, -2)
    assert to_affine(a.to_expr(), RANGES) == a
    assert str(a) == "8*i0 + i1 + -2"


def test_interval_bounds_what_affine_form_cannot():
    j = Var("j")
    assert interval_of(j // 4, {"j": (0, 11)}) == (0, 2)  # a packed panel index
    assert interval_of(j % 4, {"j": (0, 11)}) == (0, 3)
    assert interval_of(j % 16, {"j": (0, 11)}) == (0, 11)
    assert interval_of(j * 2 - 1, {"j": (0, 11)}) == (-1, 21)
