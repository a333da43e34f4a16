"""Built-in models, registered by name like workloads: `get_model("bert_layer")`.

- `mlp`: the MLC course's MNIST perceptron, 784-128-10 with ReLU (`linear0`, `linear1`), at any
  batch (the course's 1, and 64).
- `bert_layer`: one BERT-base encoder layer: sequence 128, hidden 768, 12 heads, FFN 3072, GELU,
  post-LayerNorm, softmax attention without a mask.
- `resnet_block`: a ResNet-18 basic block: conv3x3-BN-ReLU-conv3x3-BN, plus the input, ReLU;
  64 channels, 56x56.

Weights are random from a fixed seed (no trained parameters ship with eqsched), scaled the way
the networks are initialized so activations keep their usual ranges.

See docs/ARCHITECTURE.md §18 Models.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral

import numpy as np

from .builder import ModelBuilder
from .graph import Model, Value
from .op import ModelError

SEED = 0


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    builder: Callable[..., Model]
    description: str

    @property
    def params(self) -> dict[str, int]:
        """The builder's size parameters and their defaults."""
        return {k: p.default for k, p in inspect.signature(self.builder).parameters.items()}

    def build(self, **params: int) -> Model:
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            raise ModelError(f"{self.name} has no parameter {unknown[0]!r} "
                             f"(parameters: {', '.join(self.params)})")
        for key, value in params.items():
            if not isinstance(value, Integral) or isinstance(value, bool) or value < 1:
                raise ModelError(f"{self.name}: {key} must be a positive integer, got {value!r}")
        return self.builder(**params)


_MODELS: dict[str, BuiltinModel] = {}


def builtin_model(fn: Callable[..., Model]) -> Callable[..., Model]:
    """Registers a builder (keyword size parameters with defaults -> Model) under its name."""
    doc = (fn.__doc__ or "").strip().splitlines()
    _MODELS[fn.__name__] = BuiltinModel(fn.__name__, fn, doc[0] if doc else "")
    return fn


def get_model(name: str, **params: int) -> Model:
    """The built-in model `name` at its default sizes, or at `params`."""
    if name not in _MODELS:
        raise ModelError(f"unknown model {name!r} (built-in: {', '.join(sorted(_MODELS))})")
    return _MODELS[name].build(**params)


def list_models() -> list[BuiltinModel]:
    return [_MODELS[n] for n in sorted(_MODELS)]


class _Weights:
    """Deterministic random parameters for a builder."""

    def __init__(self, b: ModelBuilder):
        self.b = b
        self.rng = np.random.default_rng(SEED)

    def normal(self, name: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> Value:
        return self.b.weight(name, self.rng.normal(mean, std, shape))

    def uniform(self, name: str, shape: tuple[int, ...], low: float, high: float) -> Value:
        return self.b.weight(name, self.rng.uniform(low, high, shape))


@builtin_model
def mlp(batch: int = 1, inputs: int = 784, hidden: int = 128, outputs: int = 10) -> Model:
    """The MLC course's MLP: relu(x @ W0 + b0) @ W1 + b1, 784-128-10."""
    b = ModelBuilder("mlp")
    w = _Weights(b)
    x = b.input("x", (batch, inputs))
    h = b.matmul(x, w.normal("w0", (inputs, hidden), math.sqrt(2 / inputs)), name="linear0")
    h = b.relu(b.add(h, w.normal("b0", (hidden,), 0.01), name="add0"), name="relu0")
    y = b.matmul(h, w.normal("w1", (hidden, outputs), math.sqrt(1 / hidden)), name="linear1")
    return b.build(b.add(y, w.normal("b1", (outputs,), 0.01), name="logits"))


@builtin_model
def bert_layer(batch: int = 1, seq: int = 128, hidden: int = 768, heads: int = 12,
               ffn: int = 3072) -> Model:
    """One BERT-base encoder layer: self-attention, add & LayerNorm, GELU FFN, add & LayerNorm."""
    if hidden % heads:
        raise ModelError(f"bert_layer: hidden {hidden} is not a multiple of heads {heads}")
    head = hidden // heads
    b = ModelBuilder("bert_layer")
    w = _Weights(b)
    x = b.input("x", (batch, seq, hidden))

    def dense(v: Value, n_in: int, n_out: int, name: str) -> Value:
        y = b.matmul(v, w.normal(f"{name}_w", (n_in, n_out), 0.02), name=f"{name}_mm")
        return b.add(y, w.normal(f"{name}_b", (n_out,), 0.02), name=name)

    def split_heads(v: Value, perm: tuple[int, ...], name: str) -> Value:
        return b.transpose(b.reshape(v, (batch, seq, heads, head), name=f"{name}_split"), perm,
                           name=f"{name}_heads")

    q = split_heads(dense(x, hidden, hidden, "query"), (0, 2, 1, 3), "query")
    k = split_heads(dense(x, hidden, hidden, "key"), (0, 2, 3, 1), "key")
    v = split_heads(dense(x, hidden, hidden, "value"), (0, 2, 1, 3), "value")
    scores = b.mul(b.matmul(q, k, name="scores_mm"), b.weight("scale", 1 / math.sqrt(head)),
                   name="scores")
    probs = b.softmax(scores, axis=-1, name="probs")
    context = b.transpose(b.matmul(probs, v, name="context_mm"), (0, 2, 1, 3),
                          name="context_heads")
    context = b.reshape(context, (batch, seq, hidden), name="context")
    attn = b.add(dense(context, hidden, hidden, "attn_out"), x, name="attn_residual")

    def layer_norm(v: Value, name: str) -> Value:
        return b.layer_norm(v, w.normal(f"{name}_gamma", (hidden,), 0.02, mean=1.0),
                            w.normal(f"{name}_beta", (hidden,), 0.02), epsilon=1e-12, name=name)

    h = layer_norm(attn, "attn_norm")
    f = b.gelu(dense(h, hidden, ffn, "ffn_in"), name="ffn_gelu")
    out = b.add(dense(f, ffn, hidden, "ffn_out"), h, name="ffn_residual")
    return b.build(layer_norm(out, "output"))


@builtin_model
def resnet_block(batch: int = 1, channels: int = 64, size: int = 56) -> Model:
    """A ResNet-18 basic block: relu(bn(conv3x3(relu(bn(conv3x3(x))))) + x)."""
    b = ModelBuilder("resnet_block")
    w = _Weights(b)
    x = b.input("x", (batch, channels, size, size))

    def conv_bn(v: Value, name: str) -> Value:
        kernel = w.normal(f"{name}_w", (channels, channels, 3, 3), math.sqrt(2 / (9 * channels)))
        y = b.conv(v, kernel, pads=(1, 1, 1, 1), name=name)
        per_channel = (channels,)
        return b.batch_norm(y, w.uniform(f"{name}_gamma", per_channel, 0.5, 1.5),
                            w.normal(f"{name}_beta", per_channel, 0.1),
                            w.normal(f"{name}_mean", per_channel, 0.1),
                            w.uniform(f"{name}_var", per_channel, 0.5, 1.5), name=f"{name}_bn")

    h = b.relu(conv_bn(x, "conv1"), name="relu1")
    y = b.add(conv_bn(h, "conv2"), x, name="residual")
    return b.build(b.relu(y, name="out"))


__all__ = ["BuiltinModel", "builtin_model", "get_model", "list_models"]
