"""Each built-in model written as ONNX with onnx.helper, checked by onnx.checker, imported back
(the same numbers, bit for bit) and run in onnxruntime (the same numbers within float32 rounding).

The exporter lives in the package, not in this test: the benchmarks run the built-in models in
onnxruntime through it, and users can hand their own models to onnxruntime the same way.
"""

import numpy as np
import pytest
from model_checks import random_inputs

from eqsched.model import ModelBuilder
from eqsched.model.builtin import get_model
from eqsched.model.onnx_export import OPSET, save_onnx, to_onnx
from eqsched.model.onnx_import import import_onnx
from eqsched.reference import compare

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")


def onnxruntime_outputs(proto, inputs):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, inputs)))


@pytest.mark.parametrize("name,params", [
    ("mlp", {"batch": 1}), ("mlp", {"batch": 64}), ("bert_layer", {}), ("resnet_block", {})])
def test_built_in_models_round_trip_through_onnx_and_agree_with_onnxruntime(name, params,
                                                                            tmp_path):
    model = get_model(name, **params)
    path = save_onnx(model, tmp_path / f"{name}.onnx")
    proto = onnx.load(str(path))
    assert proto.opset_import[0].version == OPSET
    back = import_onnx(path)
    assert [n.name for n in back.nodes] == [n.name for n in model.nodes]
    inputs = random_inputs(model, seed=1)
    ours = model.evaluate(inputs)
    for k, v in back.evaluate(inputs).items():
        np.testing.assert_array_equal(v, ours[k])
    theirs = onnxruntime_outputs(proto, inputs)
    ok, _, message = compare(theirs, {k: v.astype(np.float64) for k, v in ours.items()},
                             (1e-4, 1e-4))
    assert ok, message


def test_batch_norm_is_written_as_one_batch_normalization_node():
    b = ModelBuilder("bn")
    x = b.input("x", (1, 2, 3, 3))
    params = [b.weight(k, v) for k, v in (("g", [1.0, 2.0]), ("b", [0.0, 1.0]), ("m", [0.5, 0.0]),
                                          ("v", [1.0, 4.0]))]
    proto = to_onnx(b.build(b.batch_norm(x, *params, name="y")))
    assert [n.op_type for n in proto.graph.node] == ["BatchNormalization"]
    assert [n.name for n in proto.graph.node] == ["y"]
