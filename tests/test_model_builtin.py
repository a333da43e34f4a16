"""The built-in models: the registry, their structure at the issue's sizes, each evaluated against
a hand-written numpy version of the network, and their te stages at small sizes."""

import math

import numpy as np
import pytest
from model_checks import check_stages, conv2d, random_inputs

from eqsched.model import ModelError
from eqsched.model.builtin import get_model, list_models

erf = np.vectorize(math.erf)


def test_the_registry_lists_the_three_models_with_their_sizes():
    models = {m.name: m for m in list_models()}
    assert {"mlp", "bert_layer", "resnet_block"} <= set(models)
    assert models["mlp"].params == {"batch": 1, "inputs": 784, "hidden": 128, "outputs": 10}
    assert models["bert_layer"].params == {"batch": 1, "seq": 128, "hidden": 768, "heads": 12,
                                           "ffn": 3072}
    assert models["resnet_block"].params == {"batch": 1, "channels": 64, "size": 56}
    assert all(m.description for m in models.values())


@pytest.mark.parametrize("call,message", [
    (lambda: get_model("vgg"), "unknown model 'vgg' .built-in: bert_layer, mlp, resnet_block"),
    (lambda: get_model("mlp", width=3), "mlp has no parameter 'width' .parameters: batch, inputs"),
    (lambda: get_model("mlp", batch=0), "mlp: batch must be a positive integer, got 0"),
    (lambda: get_model("bert_layer", hidden=10, heads=3),
     "bert_layer: hidden 10 is not a multiple of heads 3"),
])
def test_bad_names_and_sizes_are_one_line_errors(call, message):
    with pytest.raises(ModelError, match=f"^{message}"):
        call()


def test_weights_are_the_same_on_every_build():
    a, b = get_model("mlp"), get_model("mlp")
    assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)


@pytest.mark.parametrize("batch", [1, 64])
def test_mlp_is_the_course_network(batch):
    model = get_model("mlp", batch=batch)
    assert [n.name for n in model.nodes] == ["linear0", "add0", "relu0", "linear1", "logits"]
    assert model.inputs == {"x": (batch, 784)}
    w = {k: v.astype(np.float64) for k, v in model.weights.items()}
    assert w["w0"].shape == (784, 128) and w["w1"].shape == (128, 10)
    x = random_inputs(model)["x"]
    want = np.maximum(x @ w["w0"] + w["b0"], 0) @ w["w1"] + w["b1"]
    np.testing.assert_allclose(model.evaluate({"x": x})["logits"], want, rtol=1e-4, atol=1e-5)


def _bert(x, w, heads, eps=1e-12):
    """One post-LayerNorm BERT encoder layer in float64."""
    def dense(v, name):
        return v @ w[f"{name}_w"] + w[f"{name}_b"]

    def norm(v, name):
        mean = v.mean(-1, keepdims=True)
        var = ((v - mean) ** 2).mean(-1, keepdims=True)
        return (v - mean) / np.sqrt(var + eps) * w[f"{name}_gamma"] + w[f"{name}_beta"]

    batch, seq, hidden = x.shape
    def split(v):
        return v.reshape(batch, seq, heads, hidden // heads).transpose(0, 2, 1, 3)

    q, k, v = (split(dense(x, n)) for n in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hidden // heads)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    context = (p @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    h = norm(dense(context, "attn_out") + x, "attn_norm")
    f = dense(h, "ffn_in")
    f = 0.5 * f * (1 + erf(f / math.sqrt(2)))
    return norm(dense(f, "ffn_out") + h, "output")


def test_bert_layer_is_a_bert_base_encoder_layer():
    model = get_model("bert_layer")
    assert model.inputs == {"x": (1, 128, 768)}
    assert model.weights["ffn_in_w"].shape == (768, 3072)
    assert model.node("query_heads").shape == (1, 12, 128, 64)
    assert model.node("probs").op.op_type == "Softmax"
    assert model.node("ffn_gelu").op.op_type == "Gelu"
    x = random_inputs(model, seed=1)["x"]
    w = {k: v.astype(np.float64) for k, v in model.weights.items()}
    got = model.evaluate({"x": x})["output"]
    np.testing.assert_allclose(got, _bert(x.astype(np.float64), w, heads=12), rtol=1e-4,
                               atol=1e-4)


def test_resnet_block_is_a_basic_block():
    model = get_model("resnet_block")
    assert model.inputs == {"x": (1, 64, 56, 56)}
    assert [n.op.op_type for n in model.nodes] == [
        "Conv", "ScaleShift", "Relu", "Conv", "ScaleShift", "Add", "Relu"]
    x = random_inputs(model, seed=2)["x"].astype(np.float64)
    w = {k: v.astype(np.float64) for k, v in model.weights.items()}

    def conv_bn(v, name):
        per_channel = (1, -1, 1, 1)
        return (conv2d(v, w[f"{name}_w"], (1, 1, 1, 1)) * w[f"{name}_bn_scale"].reshape(
            per_channel) + w[f"{name}_bn_shift"].reshape(per_channel))

    h = np.maximum(conv_bn(x, "conv1"), 0)
    want = np.maximum(conv_bn(h, "conv2") + x, 0)
    np.testing.assert_allclose(model.evaluate({"x": x})["out"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name,params", [
    ("mlp", {"batch": 2, "inputs": 12, "hidden": 8, "outputs": 5}),
    ("bert_layer", {"seq": 4, "hidden": 8, "heads": 2, "ffn": 16}),
    ("resnet_block", {"channels": 3, "size": 5}),
])
def test_each_models_te_stages_compute_its_numpy_evaluation(name, params):
    model = get_model(name, **params)
    check_stages(model, random_inputs(model, seed=3))
