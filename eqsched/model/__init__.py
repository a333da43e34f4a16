"""Whole models: a graph of tensor operators over named inputs and constant weights, evaluated with
numpy end to end and turned, a few nodes at a time, into te computations to tune (a model's tasks:
`extract_tasks`); ONNX import and export (they need the `onnx` extra only when called) and the
built-in models.

See docs/ARCHITECTURE.md §18 Models.
"""

from .builder import ModelBuilder
from .builtin import get_model, list_models
from .graph import Model, Node, Value
from .onnx_export import save_onnx, to_onnx
from .onnx_import import import_onnx
from .op import ModelError, Operand, Operator
from .tasks import ModelTask, Occurrence, extract_tasks, partition

__all__ = ["Model", "ModelBuilder", "ModelError", "ModelTask", "Node", "Occurrence", "Operand",
           "Operator", "Value", "extract_tasks", "get_model", "import_onnx", "list_models",
           "partition", "save_onnx", "to_onnx"]
