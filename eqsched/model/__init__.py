"""Whole models: a graph of tensor operators over named inputs and constant weights, evaluated with
numpy end to end and turned, a few nodes at a time, into te computations to tune; the ONNX
importer (`eqsched.model.onnx_import`, needs the `onnx` extra) and the built-in models.

See docs/ARCHITECTURE.md §16b Models.
"""

from .builder import ModelBuilder
from .graph import Model, Node, Value
from .op import ModelError, Operand, Operator

__all__ = ["Model", "ModelBuilder", "ModelError", "Node", "Operand", "Operator", "Value"]
