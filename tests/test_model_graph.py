"""The Model: numpy evaluation end to end, any set of nodes as one te computation (what a task
will be), and the arrays that computation reads."""

import numpy as np
import pytest
from model_checks import check_stages, random_inputs

from eqsched.backend import compile_program
from eqsched.egraph.derive import realize
from eqsched.egraph.space import build_space
from eqsched.ir import naive_program
from eqsched.model import Model, ModelBuilder, ModelError
from eqsched.reference import compare, reference, tolerance
from eqsched.rules import default_rules


def small_mlp() -> Model:
    b = ModelBuilder("mlp")
    x = b.input("x", (2, 6))
    h = b.matmul(x, b.weight("w0", np.linspace(-1, 1, 24).reshape(6, 4)), name="linear0")
    h = b.relu(b.add(h, b.weight("b0", [0.1, -0.2, 0.3, 0.0]), name="add0"), name="relu0")
    y = b.matmul(h, b.weight("w1", np.linspace(1, -1, 12).reshape(4, 3)), name="linear1")
    return b.build(b.add(y, b.weight("b1", [1.0, 2.0, 3.0]), name="y"))


def test_evaluate_runs_the_nodes_in_order_in_float32():
    model = small_mlp()
    inputs = random_inputs(model)
    x = inputs["x"]
    w = model.weights
    want = np.maximum(x @ w["w0"] + w["b0"], 0) @ w["w1"] + w["b1"]
    out = model.evaluate(inputs)
    assert list(out) == ["y"] and out["y"].dtype == np.float32
    np.testing.assert_allclose(out["y"], want, rtol=1e-6)


@pytest.mark.parametrize("inputs,message", [
    ({}, "mlp: input 'x' is missing"),
    ({"x": np.zeros((2, 5))}, r"mlp: input 'x' has shape \(2, 5\), expected \(2, 6\)"),
    ({"x": np.zeros((2, 6)), "z": np.zeros(1)}, r"mlp: unknown inputs \['z'\]"),
])
def test_evaluate_refuses_wrong_inputs(inputs, message):
    with pytest.raises(ModelError, match=f"^{message}"):
        small_mlp().evaluate(inputs)


def test_a_set_of_nodes_is_one_computation_over_what_it_reads():
    model = small_mlp()
    comp = model.computation(["linear0", "add0", "relu0"], name="task0")
    assert comp.name == "task0"
    assert sorted(t.name for t in comp.inputs) == ["b0", "w0", "x"]
    assert [s.name for s in comp.stages] == ["linear0", "add0", "relu0"]
    assert comp.outputs == ("relu0",)  # read by linear1, outside the set
    tail = model.computation(["linear1", "y"])
    assert sorted(t.name for t in tail.inputs) == ["b1", "relu0", "w1"]
    assert tail.outputs == ("y",)


def test_a_node_read_both_inside_and_outside_the_set_is_an_output():
    b = ModelBuilder("m")
    a = b.relu(b.input("x", (4,)), name="a")
    model = b.build(b.add(a, b.unary("Exp", a, name="e"), name="y"))
    assert model.computation(["a", "e"]).outputs == ("a", "e")


def test_bind_gives_a_computation_its_arrays():
    model = small_mlp()
    comp = model.computation(["linear1", "y"])
    h = np.ones((2, 4), np.float32)
    feeds = model.bind(comp, {"relu0": h})
    assert sorted(feeds) == ["b1", "relu0", "w1"]
    assert all(a.dtype == np.float32 for a in feeds.values())
    with pytest.raises(ModelError, match="no array for 'relu0', an input of mlp"):
        model.bind(comp, {})


def test_unknown_or_no_nodes_are_refused():
    model = small_mlp()
    with pytest.raises(ModelError, match=r"no nodes named \['nope'\]"):
        model.computation(["linear0", "nope"])
    with pytest.raises(ModelError, match="a computation needs at least one node"):
        model.computation([])


def test_the_whole_model_as_one_computation_agrees_with_evaluate():
    model = small_mlp()
    check_stages(model, random_inputs(model, seed=2), backend=True)


def test_a_model_is_immutable_and_prints_its_nodes():
    model = small_mlp()
    with pytest.raises(TypeError):
        model.weights["w0"] = np.zeros((6, 4))  # type: ignore[index]
    with pytest.raises(ValueError):
        model.weights["w0"][0, 0] = 1.0
    assert model.shape("relu0") == (2, 4)
    assert [n.name for n in model.consumers("relu0")] == ["linear1"]
    assert str(model).splitlines()[0] == "mlp(x[2, 6]) -> y"
    assert "  relu0[2, 4] = Relu(add0)" in str(model).splitlines()
    with pytest.raises(ModelError, match="no node named 'w0'"):
        model.node("w0")


def attention_scores() -> Model:
    """Two heads of attention scores: split q and k into heads, transpose, multiply."""
    b = ModelBuilder("scores")
    q, k = b.input("q", (4, 6)), b.input("k", (4, 6))
    qh = b.transpose(b.reshape(q, (4, 2, 3), name="q_split"), (1, 0, 2), name="q_heads")
    kh = b.transpose(b.reshape(k, (4, 2, 3), name="k_split"), (1, 2, 0), name="k_heads")
    return b.build(b.matmul(qh, kh, name="scores"))


def test_affine_layout_nodes_become_indexing_of_their_readers():
    model = attention_scores()
    comp = model.computation()
    assert [s.name for s in comp.stages] == ["scores"]
    assert str(comp.stages[0]) == ("scores[i0, i1, i2] = "
                                   "sum(q[i1, i0 * 3 + r0] * k[i2, i0 * 3 + r0]) over r0")
    assert {s.name for s in model.computation(fold_layout=False).stages} == {
        "q_split", "q_heads", "k_split", "k_heads", "scores"}
    check_stages(model, random_inputs(model, seed=3))


def test_a_layout_node_read_outside_the_set_or_needing_a_division_keeps_its_stage():
    model = attention_scores()
    assert [s.name for s in model.computation(["q_split", "q_heads"]).stages] == ["q_heads"]
    b = ModelBuilder("merge")
    x = b.input("x", (2, 3, 4))
    merged = b.reshape(b.transpose(x, (1, 0, 2), name="t"), (3, 8), name="merged")
    model = b.build(b.relu(merged, name="y"))
    comp = model.computation()
    assert [s.name for s in comp.stages] == ["merged", "y"]  # t folds into merged's read
    assert str(comp.stages[0]) == "merged[i0, i1] = x[i1 // 4, i0, i1 % 4]"
    check_stages(model, random_inputs(model, seed=4))


def test_a_computation_is_tunable_as_a_workload_is():
    """The space of a computation with folded layout nodes holds programs that compute it."""
    model = attention_scores()
    comp = model.computation()
    naive = naive_program(comp)
    space = build_space(naive, default_rules())
    assert space.count() > 1000
    feeds = model.bind(comp, random_inputs(model, seed=5))
    want = reference(comp, feeds)
    for term, sizes in space.sample(4, seed=1):
        ok, _, message = compare(compile_program(realize(term, sizes, naive)).run(feeds), want,
                                 tolerance(comp))
        assert ok, message
