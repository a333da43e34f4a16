"""ONNX files written with onnx.helper: every supported operator imported and evaluated as
onnxruntime evaluates it, older opsets' forms, and every refusal in one line naming the node and
the operator (or the input)."""

import re
import sys

import numpy as np
import pytest
from model_checks import check_stages

from eqsched.model import ModelError
from eqsched.model.onnx_import import import_onnx
from eqsched.reference import compare

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
helper, numpy_helper, TensorProto = onnx.helper, onnx.numpy_helper, onnx.TensorProto
rng = np.random.default_rng(0)


def make_model(nodes, inputs, outputs, initializers=None, opset=20, elem_type=TensorProto.FLOAT):
    """A model of `nodes`; inputs: name -> shape (dims may be strings: symbolic); outputs: names."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, elem_type, s) for k, s in inputs.items()],
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def weights(*shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def onnxruntime_outputs(proto, inputs):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))


def agrees_with_onnxruntime(proto, inputs, tol=1e-5):
    """The imported model's outputs on `inputs` (named as in the file) are onnxruntime's."""
    model = import_onnx(proto)
    in_file = {**{k: k for k in [*model.inputs, *model.outputs]}, **model.source_names}
    ours = model.evaluate({k: inputs[in_file[k]] for k in model.inputs})
    theirs = onnxruntime_outputs(proto, inputs)
    ok, _, message = compare({k: np.atleast_1d(theirs[in_file[k]]) for k in model.outputs},
                             {k: np.atleast_1d(v).astype(np.float64) for k, v in ours.items()},
                             (tol, tol))
    assert ok, message
    return model


def every_operator():
    """One graph with each operator of the issue's list, in the forms exporters write."""
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "conv_w", "conv_b"], ["conv"], name="conv", pads=[1, 0, 1, 2],
          strides=[1, 2], kernel_shape=[3, 3]),
        n("BatchNormalization", ["conv", "bn_scale", "bn_b", "bn_mean", "bn_var"], ["bn"],
          name="bn", epsilon=1e-3),
        n("Relu", ["bn"], ["relu"], name="relu"),
        n("Flatten", ["relu"], ["flat"], name="flat", axis=1),
        n("Gemm", ["flat", "gemm_w", "gemm_c"], ["gemm"], name="gemm", alpha=0.5, beta=2.0,
          transB=1),
        n("Constant", [], ["shift"], name="shift",
          value=numpy_helper.from_array(weights(16), "shift")),
        n("Sub", ["gemm", "shift"], ["sub"], name="sub"),
        n("Tanh", ["sub"], ["tanh"], name="tanh"),
        n("Sigmoid", ["sub"], ["sigmoid"], name="sigmoid"),
        n("Mul", ["tanh", "sigmoid"], ["mul"], name="mul"),
        n("Constant", [], ["two"], name="two", value_float=2.0),
        n("Div", ["mul", "two"], ["div"], name="div"),
        n("Exp", ["div"], ["exp"], name="exp"),
        n("Sqrt", ["exp"], ["sqrt"], name="sqrt"),
        n("Reshape", ["sqrt", "new_shape"], ["reshaped"], name="reshape"),
        n("Transpose", ["reshaped"], ["transposed"], name="transpose", perm=[0, 2, 1]),
        n("MatMul", ["transposed", "mm_w"], ["mm"], name="mm"),
        # GELU as exporters expand it: x * 0.5 * (1 + erf(x / sqrt(2)))
        n("Div", ["mm", "sqrt2"], ["gelu_div"], name="gelu_div"),
        n("Erf", ["gelu_div"], ["gelu_erf"], name="gelu_erf"),
        n("Add", ["gelu_erf", "one"], ["gelu_add"], name="gelu_add"),
        n("Mul", ["mm", "gelu_add"], ["gelu_mul"], name="gelu_mul"),
        n("Mul", ["gelu_mul", "half"], ["gelu"], name="gelu"),
        n("Gelu", ["gelu"], ["gelu_tanh"], name="gelu_tanh", approximate="tanh"),
        n("Gelu", ["gelu_tanh"], ["gelu_exact"], name="gelu_exact"),
        n("Softmax", ["gelu_exact"], ["softmax"], name="softmax", axis=1),
        n("LayerNormalization", ["softmax", "ln_scale", "ln_b"], ["ln"], name="ln", axis=-1,
          epsilon=1e-4),
        n("ReduceMean", ["ln", "axes1"], ["mean"], name="mean", keepdims=1),
        n("ReduceSum", ["ln", "axes2"], ["sum"], name="sum", keepdims=0),
        n("ReduceMax", ["ln"], ["max"], name="max", keepdims=0),
    ]
    init = {
        "conv_w": weights(4, 3, 3, 3), "conv_b": weights(4),
        "bn_scale": weights(4) + 1, "bn_b": weights(4), "bn_mean": weights(4),
        "bn_var": np.abs(weights(4)) + 0.5, "gemm_w": weights(16, 128, scale=0.1),
        "gemm_c": weights(16), "new_shape": np.array([2, 4, -1], np.int64),
        "mm_w": weights(4, 6), "sqrt2": np.float32(np.sqrt(2)), "one": np.float32(1),
        "half": np.float32(0.5), "ln_scale": weights(6) + 1, "ln_b": weights(6),
        "axes1": np.array([1], np.int64), "axes2": np.array([-1], np.int64),
    }
    return make_model(nodes, {"x": [2, 3, 8, 8]}, ["ln", "mean", "sum", "max"], init)


def test_every_supported_operator_evaluates_as_onnxruntime_does():
    proto = every_operator()
    inputs = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    model = agrees_with_onnxruntime(proto, inputs)
    types = [node.op.op_type for node in model.nodes]
    assert types[:5] == ["Conv", "ScaleShift", "Relu", "Reshape", "Gemm"]
    assert {"Erf", "Gelu", "GeluTanh", "Softmax", "LayerNormalization", "Transpose"} <= set(types)
    assert "Constant" not in types and "shift" in model.weights
    check_stages(model, inputs, interpreter=False)


def test_older_opsets_take_reduction_axes_as_attributes_and_softmax_on_the_last_axis():
    n = helper.make_node
    nodes = [n("Softmax", ["x"], ["s"], name="s"),  # opset 11: axis 1 of a matrix is the last
             n("ReduceMean", ["s"], ["m"], name="m", axes=[0], keepdims=0)]
    proto = make_model(nodes, {"x": [3, 5]}, ["m"], opset=11)
    model = agrees_with_onnxruntime(proto, {"x": weights(3, 5)})
    assert model.node("m").op.axes == (0,)


def test_names_become_identifiers_and_same_padding_is_computed():
    nodes = [helper.make_node("Conv", ["input:0", "/conv/W"], ["/conv/out.0"], name="/conv",
                              auto_pad="SAME_UPPER", strides=[2, 2])]
    proto = make_model(nodes, {"input:0": [1, 2, 7, 6]}, ["/conv/out.0"],
                       {"/conv/W": weights(3, 2, 3, 3)})
    model = agrees_with_onnxruntime(proto, {"input:0": weights(1, 2, 7, 6)})
    assert list(model.inputs) == ["input_0"] and model.outputs == ("conv_out_0",)
    assert model.source_names == {"input_0": "input:0", "conv_out_0": "/conv/out.0"}
    assert model.node("conv_out_0").op.pads == (1, 0, 1, 1)


def save(tmp_path, proto, name="model.onnx"):
    path = tmp_path / name
    onnx.save(proto, str(path))
    return path


def refusal(tmp_path, proto) -> str:
    with pytest.raises(ModelError) as err:
        import_onnx(save(tmp_path, proto))
    assert "\n" not in str(err.value)
    return str(err.value)


def one_node(op_type, inputs=("x",), shapes=None, init=None, opset=20, domain="", **attrs):
    node = helper.make_node(op_type, list(inputs), ["y"], name=f"{op_type}_3", domain=domain,
                            **attrs)
    model = make_model([node], shapes or {"x": [1, 2, 5, 5]}, ["y"], init, opset)
    if domain:
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return model


CONV_W = {"w": weights(2, 2, 3, 3)}


@pytest.mark.parametrize("proto,message", [
    (one_node("Conv", ("x", "w"), init=CONV_W, group=2),
     r"node 'Conv_3' \(Conv\): group=2 is not supported$"),
    (one_node("Conv", ("x", "w"), init=CONV_W, dilations=[2, 2]),
     r"node 'Conv_3' \(Conv\): dilations=\[2, 2\] is not supported"),
    (one_node("Conv", ("x", "w"), init=CONV_W, kernel_shape=[2, 2]),
     r"node 'Conv_3' \(Conv\): kernel_shape=\[2, 2\] differs from the weights' \[3, 3\]"),
    (one_node("LSTM"), r"node 'LSTM_3' \(LSTM\): operator LSTM is not supported"),
    (one_node("FusedGemm", domain="com.microsoft"),
     r"node 'FusedGemm_3' \(FusedGemm\): operator FusedGemm of domain 'com.microsoft' is not"),
    (one_node("Relu", alpha=0.1), r"node 'Relu_3' \(Relu\): attribute 'alpha' is not supported"),
    (one_node("Softmax", opset=11, axis=1),
     r"node 'Softmax_3' \(Softmax\): axis=1 is not supported before opset 13"),
    (one_node("Gelu", approximate="fast"),
     r"node 'Gelu_3' \(Gelu\): approximate=fast is not supported"),
    (one_node("MatMul", ("x", "w"), init={"w": weights(4, 3)}),
     r"node 'MatMul_3' \(MatMul\): inner dimensions differ: \(1, 2, 5, 5\) @ \(4, 3\)"),
    (one_node("Reshape", ("x", "x")), r"node 'Reshape_3' \(Reshape\): input 1 \('x'\) must be"
                                      r" a constant"),
    (one_node("BatchNormalization", ("x", "s", "s", "s", "s"), init={"s": np.ones(2, np.float32)},
              training_mode=1),
     r"node 'BatchNormalization_3' \(BatchNormalization\): training_mode=1 is not supported"),
    (one_node("Relu", shapes={"x": ["batch", 3]}),
     "input 'x' has a symbolic dimension 'batch' .dimension 0.; eqsched needs "
     "static shapes"),
    (one_node("Relu", shapes={"x": [2, None]}),
     "input 'x' has an unknown dimension .dimension 1.; eqsched needs static shapes"),
])
def test_what_eqsched_cannot_import_is_refused_in_one_line(tmp_path, proto, message):
    assert re.match(f"model.onnx: {message}", refusal(tmp_path, proto))


def test_an_extra_output_in_use_is_refused():
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean"], name="ln")
    proto = make_model([node, helper.make_node("Relu", ["mean"], ["z"], name="r")],
                       {"x": [2, 3]}, ["y", "z"], {"s": np.ones(3, np.float32)})
    with pytest.raises(ModelError, match=r"node 'ln' \(LayerNormalization\): output 'mean' is "
                                         r"not supported \(only the first output\)"):
        import_onnx(proto)


def test_non_float_inputs_and_unreadable_files_are_refused(tmp_path):
    proto = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [3]}, ["y"],
                       elem_type=TensorProto.INT64)
    assert refusal(tmp_path, proto) == ("model.onnx: input 'x' has element type INT64; only "
                                        "floating-point inputs are supported")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\xffnot a model")
    with pytest.raises(ModelError, match="^bad.onnx: cannot read an ONNX model: "):
        import_onnx(bad)
    with pytest.raises(ModelError, match="^missing.onnx: cannot read an ONNX model: "):
        import_onnx(tmp_path / "missing.onnx")


def test_without_the_onnx_package_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ModelError, match=r"^reading ONNX files needs the onnx package "
                                         r"\(pip install 'eqsched\[onnx\]'\)$"):
        import_onnx("model.onnx")


def test_a_file_name_that_meets_a_folded_weight_gets_a_fresh_identifier():
    n = helper.make_node
    ones = np.ones(2, np.float32)
    nodes = [n("BatchNormalization", ["x", "s", "s", "s", "s"], ["y"], name="bn"),
             n("Mul", ["y", "y_scale"], ["z"], name="mul")]
    proto = make_model(nodes, {"x": [1, 2, 3]}, ["z"], {"s": ones, "y_scale": weights(3)})
    model = agrees_with_onnxruntime(proto, {"x": weights(1, 2, 3)})
    assert model.node("z").inputs == ("y", "y_scale_2")
