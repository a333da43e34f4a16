"""Front end: stages, reductions, dependences, FLOP counts and malformed input."""

import pytest

from eqsched.expr import exp, relu
from eqsched.te import Computation, WorkloadError, compute, max_, placeholder, reduce_axis, sum_


def matmul(m=4, n=5, k=6):
    A = placeholder((m, k), "A")
    B = placeholder((k, n), "B")
    r = reduce_axis(k, "k")
    return A, B, compute((m, n), lambda i, j: sum_(A[i, r] * B[r, j], axis=r), "C")


def test_matmul_stage_has_spatial_then_reduce_axes_and_2mnk_flops():
    *_, C = matmul()
    comp = Computation("mm", [C])
    (stage,) = comp.stages
    assert [(a.name, a.extent, a.kind) for a in stage.axes] == [
        ("i", 4, "spatial"), ("j", 5, "spatial"), ("k", 6, "reduce")]
    assert stage.reduce == "sum" and stage.init_value == 0.0
    assert comp.flops == 2 * 4 * 5 * 6
    assert [t.name for t in comp.inputs] == ["A", "B"]
    assert comp.outputs == ("C",)


def test_multi_stage_chain_is_topologically_ordered():
    A, _, C = matmul()
    r = reduce_axis(5, "l")
    D = compute((4, 5), lambda i, j: exp(C[i, j]), "D")
    M = compute((4,), lambda i: max_(D[i, r], axis=r), "M")
    E = compute((4, 5), lambda i, j: relu(D[i, j] - M[i]), "E")
    comp = Computation("chain", [E])
    assert [s.name for s in comp.stages] == ["C", "D", "M", "E"]
    assert [s.name for s in comp.consumers("D")] == ["M", "E"]
    assert comp.stage("M").init_value == float("-inf")


def test_out_of_bounds_read_is_rejected_with_the_range():
    X = placeholder((8,), "X")
    Y = compute((8,), lambda i: X[i + 1], "Y")
    with pytest.raises(WorkloadError, match=r"reads X dimension 0 at i \+ 1 in \[1, 8\]"):
        Computation("shift", [Y])


def test_wrong_arity_and_bad_extents():
    X = placeholder((8, 8), "X")
    with pytest.raises(WorkloadError, match="indexed with 1"):
        compute((8,), lambda i: X[i], "Y")
    with pytest.raises(WorkloadError, match="lambda takes 1 axes but the shape has 2"):
        compute((8, 8), lambda i: X[i, i], "Y")
    with pytest.raises(WorkloadError, match="positive integer"):
        placeholder((0, 3), "Z")
    with pytest.raises(WorkloadError, match="positive integer"):
        reduce_axis(2.5, "k")


def test_body_must_use_only_its_own_axes():
    X = placeholder((8,), "X")
    k = reduce_axis(8, "k")
    with pytest.raises(WorkloadError, match=r"axes not in this stage: \['k'\]"):
        compute((8,), lambda i: X[k], "Y")


def test_two_tensors_with_one_name_are_rejected():
    X1 = placeholder((4,), "X")
    X2 = placeholder((4,), "X")
    with pytest.raises(WorkloadError, match="both named 'X'"):
        compute((4,), lambda i: X1[i] + X2[i], "Y")
    Y1 = compute((4,), lambda i: X1[i], "Y1")
    Y2 = compute((4,), lambda i: X2[i] + Y1[i], "Y2")
    with pytest.raises(WorkloadError, match="both named 'X'"):
        Computation("dup", [Y2])
