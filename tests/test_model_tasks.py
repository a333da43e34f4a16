"""A model's tasks: the partition of each built-in model into fused subgraphs (anchors with their
epilogues, layout nodes folded into their readers), structurally equal subgraphs deduplicated and
weighted, and each occurrence's names mapping the task's computation onto the model's values."""

import numpy as np
import pytest
from model_checks import random_inputs

from eqsched.expr import to_str
from eqsched.model import ModelBuilder
from eqsched.model.builtin import get_model
from eqsched.model.tasks import extract_tasks, partition
from eqsched.reference import compare, reference, tolerance

SMALL_BERT = {"seq": 8, "hidden": 16, "heads": 2, "ffn": 32}
SMALL_RESNET = {"channels": 4, "size": 6}


def by_name(tasks):
    return {t.name: t for t in tasks}


def all_values(model, inputs):
    """Every value of the model (inputs, weights, every node's output), numpy node by node."""
    env = {**model.weights, **inputs}
    for n in model.nodes:
        env[n.name] = n.op.evaluate(*(env[i] for i in n.inputs))
    return env


def test_the_mlp_is_two_tasks_each_a_matmul_with_its_epilogue():
    tasks = extract_tasks(get_model("mlp"))
    assert [(t.name, t.weight) for t in tasks] == [("matmul_add_relu", 1), ("matmul_add", 1)]
    first, second = tasks
    assert first.occurrences[0].nodes == ("linear0", "add0", "relu0")
    assert dict(first.occurrences[0].inputs) == {"in0": "x", "in1": "w0", "in2": "b0"}
    assert list(first.occurrences[0].outputs.values()) == ["relu0"]
    assert second.occurrences[0].inputs["in0"] == "relu0"
    assert first.flops == 2 * 784 * 128 + 2 * 128  # the matmul, the bias and the relu


def test_bert_s_query_key_and_value_projections_are_one_task_of_weight_three():
    model = get_model("bert_layer", **SMALL_BERT)
    tasks = by_name(extract_tasks(model))
    assert sorted((name, t.weight) for name, t in tasks.items()) == [
        ("layernormalization", 2), ("matmul", 1), ("matmul_add", 3), ("matmul_add_add", 1),
        ("matmul_add_add_2", 1), ("matmul_add_gelu", 1), ("matmul_mul", 1), ("softmax", 1)]
    qkv = tasks["matmul_add"]
    assert [o.nodes for o in qkv.occurrences] == [
        ("query_mm", "query"), ("key_mm", "key"), ("value_mm", "value")]
    assert [o.inputs["in1"] for o in qkv.occurrences] == ["query_w", "key_w", "value_w"]
    # The output projection adds the residual and reads the merged heads: another task.
    attn_out = tasks["matmul_add_add"].occurrences[0]
    assert attn_out.nodes == ("context_heads", "context", "attn_out_mm", "attn_out",
                              "attn_residual")
    assert [o.nodes for o in tasks["layernormalization"].occurrences] == [("attn_norm",),
                                                                         ("output",)]
    assert sum(t.weight for t in tasks.values()) == len(partition(model)) == 11


def test_attention_scores_read_the_projections_through_folded_layout():
    tasks = by_name(extract_tasks(get_model("bert_layer", **SMALL_BERT)))
    scores = tasks["matmul_mul"]
    assert set(scores.occurrences[0].inputs.values()) == {"query", "key"}
    # Reshape and transpose wrote no stage: the batched matmul, then the scale.
    assert [s.reduce for s in scores.computation.stages] == ["sum", None]


def test_the_resnet_block_s_convolutions_differ_by_their_epilogues():
    tasks = extract_tasks(get_model("resnet_block", **SMALL_RESNET))
    assert [(t.name, t.weight) for t in tasks] == [("conv_scaleshift_relu", 1),
                                                   ("conv_scaleshift_add_relu", 1)]
    assert tasks[1].occurrences[0].inputs["in4"] == "x"  # the residual


def test_a_value_only_convolutions_read_is_stored_padded_and_they_do_not_pad_it():
    model = get_model("resnet_block", **SMALL_RESNET)
    first, second = extract_tasks(model)
    border = ((0, 0), (0, 0), (1, 1), (1, 1))
    assert first.occurrences[0].borders == {"relu1": border}  # it writes inside the border
    assert second.occurrences[0].borders == {"relu1": border}  # it reads the whole
    assert second.computation.shapes["in0"] == (1, 4, 8, 8)
    pads = [[s.name for s in t.computation.stages if s.name.endswith("__pad")]
            for t in (first, second)]
    assert pads == [["t0__pad"], []]  # the block's input is the caller's: padded in the task
    unpadded = extract_tasks(model, padded_storage=False)
    assert [t.key for t in unpadded][0] == first.key and unpadded[1].key != second.key
    assert all(not o.borders for t in unpadded for o in t.occurrences)


def _two_readers(second_reader: str, pads=(1, 1, 1, 1)):
    b = ModelBuilder("two_readers")
    x = b.input("x", (1, 2, 5, 5))
    w = b.weight("w", np.ones((2, 2, 3, 3)))
    h = b.relu(b.conv(x, w, name="c0"), name="h")
    if second_reader == "conv":
        return b.build(b.add(b.conv(h, w, pads=(1, 1, 1, 1), name="c1"),
                             b.conv(h, w, pads=pads, name="c2"), name="y"))
    if second_reader == "add":
        return b.build(b.add(b.conv(h, w, pads=(1, 1, 1, 1), name="c1"), h, name="y"))
    return b.build(b.conv(h, w, pads=(1, 1, 1, 1), name="c1"), h)  # h: an output as well


@pytest.mark.parametrize("model,bordered", [
    (_two_readers("conv"), {"h"}),                         # two convolutions padding alike
    (_two_readers("conv", pads=(0, 0, 0, 0)), {"h"}),      # one padding, one reading the inside
    (_two_readers("add"), {"h"}),                          # a residual reading the inside
    (_two_readers("conv", pads=(0, 1, 0, 1)), set()),      # two paddings
    (_two_readers("output"), set()),                       # the caller's array
])
def test_a_value_is_stored_padded_when_the_convolutions_padding_it_pad_it_alike(model, bordered):
    tasks = extract_tasks(model)
    assert {v for t in tasks for o in t.occurrences for v in o.borders} == bordered
    pad_stages = [s.name for t in tasks for s in t.computation.stages if "__pad" in s.name]
    assert (not pad_stages) == bool(bordered)  # c0 reads the caller's x and pads nothing


def test_a_task_reads_the_inside_of_a_padded_value_through_its_indexing():
    residual = next(t for t in extract_tasks(_two_readers("add")) if t.name == "conv_add")
    comp = residual.computation  # y = c1(h) + h, h (3x3) stored padded to 5x5
    assert comp.shapes["in0"] == (1, 2, 5, 5) and [s.name for s in comp.stages] == ["t0", "t1"]
    assert [to_str(s.body) for s in comp.stages] == [
        "in0[i0, r0, i2 + r1, i3 + r2] * in1[i1, r0, r1, r2]",  # the whole, as padded
        "t0[i0, i1, i2, i3] + in0[i0, i1, i2 + 1, i3 + 1]"]     # the inside


def test_two_anchors_meeting_in_one_elementwise_node_give_it_to_the_first():
    model = _two_readers("conv")  # y = c1 + c2, as a ResNet block with a downsampling branch
    assert partition(model) == [("c0", "h"), ("c2",), ("c1", "y")]  # c2 runs before it is added


def test_elementwise_nodes_without_an_anchor_are_a_task_of_their_own():
    b = ModelBuilder("chain")
    x, y = b.input("x", (4, 8)), b.input("y", (4, 8))
    z = b.relu(b.add(x, y, name="s"), name="r")
    model = b.build(b.softmax(z, name="p"), b.unary("Exp", z, name="e"))
    groups = partition(model)
    # z is read by the softmax and by e: it cannot join either, so s and r make one task.
    assert groups == [("s", "r"), ("p",), ("e",)]
    assert [t.name for t in extract_tasks(model)] == ["add_relu", "softmax", "exp"]


def test_an_anchor_that_is_an_output_keeps_its_readers_out_of_its_task():
    b = ModelBuilder("two_outputs")
    x = b.input("x", (2, 3))
    h = b.matmul(x, b.weight("w", np.ones((3, 4))), name="h")
    model = b.build(h, b.relu(h, name="r"))
    assert partition(model) == [("h",), ("r",)]


def test_equal_structure_under_other_names_is_the_same_task_and_other_shapes_are_not():
    def dense(name, n, scale):
        b = ModelBuilder(name)
        x = b.input(f"{name}_in", (2, n))
        y = b.mul(b.matmul(x, b.weight(f"{name}_w", np.ones((n, 3)))),
                  b.weight(f"{name}_s", scale), name=f"{name}_out")
        return extract_tasks(b.build(y))[0]

    assert dense("a", 5, 0.5).key == dense("b", 5, 0.5).key
    assert dense("a", 5, 0.5).computation.name == dense("b", 5, 0.5).computation.name
    assert dense("a", 5, 0.5).key != dense("a", 6, 0.5).key
    assert dense("a", 5, 0.5).key != dense("a", 5, 0.25).key  # a folded constant is structure


def test_a_task_s_constants_are_the_placeholders_of_weights_and_part_of_its_identity():
    tasks = by_name(extract_tasks(get_model("bert_layer", **SMALL_BERT)))
    projection, scores = tasks["matmul_add"], tasks["matmul_mul"]
    weights = get_model("bert_layer", **SMALL_BERT).weights
    for occurrence in projection.occurrences:  # x, then the weight and bias of Q, K and V
        assert {c for c, value in occurrence.inputs.items() if value in weights} == \
            projection.computation.constants == {"in1", "in2"}
    assert scores.computation.constants == frozenset()  # query x key: no weights

    b = ModelBuilder("same_matmul_twice")
    x, y = b.input("x", (2, 3)), b.input("y", (3, 4))
    w = b.weight("w", np.ones((3, 4)))
    model = b.build(b.matmul(x, y, name="xy"), b.matmul(x, w, name="xw"))
    (varying, weighted) = sorted(extract_tasks(model), key=lambda t: t.occurrences[0].position)
    assert varying.key != weighted.key  # one text, but a weight in one of them
    assert (varying.computation.constants, weighted.computation.constants) == (
        frozenset(), {"in1"})


@pytest.mark.parametrize("name,params", [("mlp", {"inputs": 12, "hidden": 8, "outputs": 5}),
                                         ("bert_layer", SMALL_BERT),
                                         ("resnet_block", SMALL_RESNET)])
def test_every_occurrence_computes_its_model_values(name, params):
    """Each task's computation, given the model values its occurrence names, computes (in the
    float64 oracle) the values the model's nodes compute."""
    model = get_model(name, **params)
    env = all_values(model, random_inputs(model, seed=3))
    for task in extract_tasks(model):
        for occ in task.occurrences:
            args = {k: np.pad(np.asarray(env[v], np.float64), occ.borders.get(v, 0)).reshape(
                task.computation.shapes[k]) for k, v in occ.inputs.items()}
            got = reference(task.computation, args)
            expected = {k: np.asarray(env[v], np.float64).reshape(got[k].shape)
                        for k, v in occ.outputs.items()}
            rtol, atol = tolerance(task.computation)
            ok, _, message = compare(got, expected, (10 * rtol, 10 * atol))
            assert ok, f"{task.name} at {occ.nodes}: {message}"
