"""Winograd F(2x2, 3x3): the transform tables against the direct convolution, the stages through
the oracle, the interpreter and the backend, and the model rewrite."""

import numpy as np
import pytest
from model_checks import check_stages, conv2d, random_inputs

from eqsched.compiled_model import CompiledModel
from eqsched.model import ModelBuilder, ModelError, get_model
from eqsched.model.linear import Conv
from eqsched.model.tasks import extract_tasks
from eqsched.model.winograd import A_T, B_T, filter_transform, winograd


def _matrix(rows, width: int) -> np.ndarray:
    out = np.zeros((len(rows), width))
    for i, row in enumerate(rows):
        for col, sign in row:
            out[i, col] = sign
    return out


def test_the_tables_compute_one_tile_of_the_convolution():
    rng = np.random.default_rng(0)
    d, g = rng.standard_normal((4, 4)), rng.standard_normal((3, 3))
    b_t, a_t = _matrix(B_T, 4), _matrix(A_T, 4)
    u = filter_transform(g[None, None].astype(np.float32))[:, 0, 0].reshape(4, 4)
    y = a_t @ (u * (b_t @ d @ b_t.T)) @ a_t.T
    want = [[(d[i:i + 3, j:j + 3] * g).sum() for j in range(2)] for i in range(2)]
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def _model(x_shape, k, pads, bias):
    rng = np.random.default_rng(3)
    b = ModelBuilder("wino")
    x = b.input("x", x_shape)
    w = b.weight("w", rng.standard_normal((k, x_shape[1], 3, 3)).astype(np.float32))
    args = [x, w] + ([b.weight("bias", rng.standard_normal(k).astype(np.float32))]
                     if bias else [])
    return b.build(b.apply(Conv(pads), args, name="y"))


@pytest.mark.parametrize("x_shape,pads,bias", [
    ((1, 3, 6, 6), (1, 1, 1, 1), False),   # even output: whole tiles
    ((2, 2, 5, 7), (1, 1, 1, 1), True),    # odd rows and columns: the last tiles in part
    ((1, 2, 7, 6), (0, 0, 0, 0), False),   # no padding
    ((1, 2, 5, 5), (2, 0, 1, 1), True),    # uneven padding
])
def test_the_stages_compute_the_direct_convolution(x_shape, pads, bias):
    direct = _model(x_shape, 4, pads, bias)
    model = winograd(direct)
    assert [(n.name, n.op.op_type) for n in model.nodes] == [
        ("y_tiles", "WinogradInput"), ("y_products", "MatMul"), ("y", "WinogradOutput")]
    inputs = random_inputs(model, seed=1)
    want = conv2d(inputs["x"], model.weights["w"], pads)
    if bias:
        want = want + model.weights["bias"].reshape(1, -1, 1, 1)
    np.testing.assert_allclose(direct.evaluate(inputs)["y"], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(model.evaluate(inputs)["y"], direct.evaluate(inputs)["y"])
    # Each node's stages compute its numpy evaluation: the transforms theirs, the output node the
    # direct convolution from the products.
    check_stages(model, inputs, backend=True)
    assert [s.name for s in model.computation().stages] == [
        "y_tiles__split", "y_tiles", "y_products", "y__tiles", "y"]


def test_its_products_are_four_ninths_of_the_direct_forms():
    model = _model((1, 8, 8, 8), 8, (1, 1, 1, 1), False)
    stages = {s.name: s for s in winograd(model).computation().stages}
    assert stages["y_products"].flops() * 9 == model.computation().flops * 4


def test_the_rewrite_takes_3x3_stride_1_convolutions_of_a_weight_only():
    rng = np.random.default_rng(0)
    b = ModelBuilder("mixed")
    x = b.input("x", (1, 4, 8, 8))
    w3 = b.weight("w3", rng.standard_normal((4, 4, 3, 3)).astype(np.float32))
    w1 = b.weight("w1", rng.standard_normal((4, 4, 1, 1)).astype(np.float32))
    h = b.apply(Conv((1, 1, 1, 1)), [x, w3], name="three")
    h = b.apply(Conv((1, 1, 1, 1), (2, 2)), [h, w3], name="strided")
    y = b.apply(Conv(), [h, w1], name="one")
    model = b.build(y)
    fast = winograd(model)
    assert [n.op.op_type for n in fast.nodes] == [
        "WinogradInput", "MatMul", "WinogradOutput", "Conv", "Conv"]
    assert fast.node("three_products").inputs == ("w3_winograd", "three_tiles")
    assert fast.node("three").inputs == ("three_products", "x", "w3")
    inputs = random_inputs(model)
    np.testing.assert_array_equal(fast.evaluate(inputs)["one"], model.evaluate(inputs)["one"])
    with pytest.raises(ModelError, match=r"^mlp: no convolution Winograd F\(2x2, 3x3\) "
                                         r"computes \(it needs a 3x3 filter held as a weight, "
                                         r"stride 1\)$"):
        winograd(get_model("mlp"))


def test_a_blocks_convolutions_share_their_transform_and_product_tasks():
    tasks = extract_tasks(winograd(get_model("resnet_block")))
    assert [(t.name, t.weight) for t in tasks] == [
        ("winogradinput", 2), ("matmul", 2), ("winogradoutput_scaleshift_relu", 1),
        ("winogradoutput_scaleshift_add_relu", 1)]
    assert tasks[1].computation.constants == {"in0"}  # the filters' transform


def test_the_resnet_block_by_winograd_is_correct_end_to_end():
    model = winograd(get_model("resnet_block"))
    compiled = CompiledModel(model)  # default schedules
    assert compiled.check()
    assert compiled.check_onnxruntime().correct in (True, None)


def test_it_exports_as_the_convolution_it_computes():
    onnx = pytest.importorskip("onnx")
    from eqsched.model import to_onnx

    proto = to_onnx(winograd(_model((1, 2, 6, 6), 3, (1, 1, 1, 1), True)))
    assert [n.op_type for n in proto.graph.node] == ["Conv"]  # the transforms left out
    assert list(proto.graph.node[0].input) == ["x", "w", "bias"]
    assert sorted(i.name for i in proto.graph.initializer) == ["bias", "w"]
    assert onnx is not None
