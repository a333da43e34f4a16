"""A model's tasks: its nodes partitioned into fused subgraphs, each one te computation to tune,
structurally equal subgraphs deduplicated and weighted by how often the model runs them.

    tasks = extract_tasks(get_model("bert_layer"))
    [(t.name, t.weight, t.flops) for t in tasks]     # ("matmul_add", 3, ...): Q, K and V
    t.computation                                    # tune it (its placeholders: in0, in1, ...)
    t.occurrences[0].inputs                          # {"in0": "x", "in1": "query_w", ...}

The partition follows TVM's FuseOps in a simpler form. An *anchor* is an operator that reduces
(MatMul, Gemm, Conv, the reductions, Softmax, LayerNormalization); elementwise and layout
operators are not. (1) Each anchor takes its elementwise consumers, one after the other, while
the value it has so far is read by that one node only and is no output of the model (an epilogue:
bias, scale, activation, residual). (2) In reverse topological order, a node left over joins the
group of its readers when they are all in one group (a prologue: a layout node becomes indexing
there, `Model.computation`'s `fold_layout`, and an elementwise producer a stage the schedule may
inline); otherwise it starts a group of its own, which its own producers may join: a chain of
elementwise nodes with no anchor is one task. Two reductions never share a task.

Each group becomes `Model.computation(nodes)` renamed canonically: placeholders `in0, in1, ...`
and stages `t0, t1, ...` (with their `__part` suffix) in the order a depth-first walk from the
outputs meets them through each body's reads, a walk that names do not steer. Two groups are the
same task when their canonical computations have the same text (shapes, indices, bodies, folded
constants) and the same placeholders stand for the model's weights (the computation's
`constants`: a kernel prepares what it makes of them once, not on each call). A task's weight
is its number of occurrences, and each occurrence maps the task's placeholder and output names
to the model's values, so a compiled model can call one kernel at each place.

A value that convolutions of other tasks read, all padding it alike, is stored padded
(`bordered_values`): its producer writes the inside of a buffer whose zero border is written
once, the tasks of those convolutions read that buffer without a padding stage, and its other
readers read the inside (the pass onnxruntime and TVM pay once per model, when they change the
layout, a chain of tasks would otherwise pay per convolution).

See docs/ARCHITECTURE.md §19 Tasks and compiled models.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..expr import Expr, Load, loads, to_str, transform
from ..ir import Border, bordered_shape
from ..te import Computation, Stage, Tensor
from .elementwise import Binary, ScaleShift, Unary
from .graph import Model, Node
from .layout import Inside
from .linear import Conv


@dataclass(frozen=True)
class Occurrence:
    """One place a task runs in the model: its nodes, the model value each of the task's
    placeholders (`inputs`) and outputs (`outputs`) stands for, and its `position` in the order
    the model runs its groups (each after the groups it reads)."""

    position: int
    nodes: tuple[str, ...]
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]
    # The model values among its inputs and outputs stored inside a zero border (see
    # `bordered_values`): the task reads such an input whole, border included, and writes such
    # an output inside the border, which is zeroed once and never written.
    borders: Mapping[str, Border] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelTask:
    """A fused subgraph of a model as one canonical computation, `weight` times in the model
    (task tuning takes `task_tuning.Task(t.name, t.computation, t.weight)`)."""

    name: str
    computation: Computation
    key: str  # the canonical computation's text, hashed: equal for structurally equal groups
    occurrences: tuple[Occurrence, ...]

    @property
    def weight(self) -> int:
        return len(self.occurrences)

    @property
    def flops(self) -> int:
        """FLOPs of one occurrence."""
        return self.computation.flops


def is_anchor(node: Node) -> bool:
    """Whether a node reduces (and so anchors a task) rather than maps elements."""
    return not (node.op.layout or isinstance(node.op, (Binary, Unary, ScaleShift)))


def partition(model: Model) -> list[tuple[str, ...]]:
    """The model's nodes in fused groups, each in the model's order, the groups in an order that
    runs each after the groups it reads."""
    order = {n.name: k for k, n in enumerate(model.nodes)}
    readers = {n.name: [c.name for c in model.consumers(n.name)] for n in model.nodes}
    group: dict[str, int] = {}
    members: list[list[str]] = []
    for n in model.nodes:  # (1) anchors and their epilogues
        if not is_anchor(n):
            continue
        group[n.name] = len(members)
        members.append([n.name])
        last = n.name
        while (len(readers[last]) == 1 and last not in model.outputs
               and readers[last][0] not in group  # an earlier anchor's epilogue already
               and not is_anchor(model.node(readers[last][0]))
               and not model.node(readers[last][0]).op.layout):
            last = readers[last][0]
            group[last] = group[n.name]
            members[group[n.name]].append(last)
    # (2) prologues, and groups without an anchor. No join makes a cycle between groups: only a
    # group's last node has readers outside it, and every other member is its ancestor.
    for n in reversed(model.nodes):
        if n.name in group:
            continue
        joined = {group[r] for r in readers[n.name]}  # later nodes: all placed already
        group[n.name] = joined.pop() if len(joined) == 1 else len(members)
        if group[n.name] == len(members):
            members.append([])
        members[group[n.name]].append(n.name)
    groups = [tuple(sorted(m, key=order.__getitem__)) for m in members]
    return _topological(model, groups, group, order)


def bordered_values(model: Model, groups: Sequence[tuple[str, ...]]) -> dict[str, Border]:
    """Values to store inside a zero border: each computed by a task, no output of the model,
    and read by convolutions of other tasks that all pad it alike. Their producer writes the
    inside of the padded buffer and those convolutions read it as it is, without a pass that
    pads it (onnxruntime and TVM pay that pass once per model, when they change the layout);
    any other reader (a residual add, a convolution padding nothing) reads the inside."""
    group = {name: k for k, g in enumerate(groups) for name in g}
    chosen: dict[str, Border] = {}
    for n in model.nodes:
        if n.name in model.outputs:
            continue
        padding = {r.op.pads for r in model.consumers(n.name)
                   if _pads(r, n.name) and group[r.name] != group[n.name]}
        if len(padding) == 1:
            top, left, bottom, right = padding.pop()
            chosen[n.name] = ((0, 0), (0, 0), (top, bottom), (left, right))
    return chosen


def _pads(node: Node, value: str) -> bool:
    """Whether `node` is a convolution that pads `value`, its input (and reads it once)."""
    return (isinstance(node.op, Conv) and any(node.op.pads) and node.inputs[0] == value
            and node.inputs.count(value) == 1)


def extract_tasks(model: Model, fold_layout: bool = True,
                  padded_storage: bool = True) -> list[ModelTask]:
    """The model's tasks, in the order the model first runs them. With `padded_storage`, a
    value `bordered_values` chooses is stored padded: the convolutions reading it are tasks
    without padding over its padded shape (its producer's task is the same either way)."""
    keyed: dict[str, tuple[Computation, list[Occurrence], str]] = {}
    groups = partition(model)
    borders = bordered_values(model, groups) if padded_storage else {}
    reading, reading_groups = _reading_padded(model, groups, borders)
    for position, (nodes, read) in enumerate(zip(groups, reading_groups)):
        comp = reading.computation(read, fold_layout=fold_layout)
        outputs, names = _canonical(comp)
        base = _base_name(model, nodes)
        inputs = _input_names(comp)
        constants = sorted(new for old, new in names.items()
                           if old in model.weights and old in inputs)
        text = _text(outputs) + "\nconstant " + " ".join(constants)
        key = hashlib.sha256(text.encode()).hexdigest()[:16]
        if key not in keyed:
            keyed[key] = (Computation(base, outputs, constants=constants), [], base)
        keyed[key][1].append(Occurrence(
            position, nodes, {new: old for old, new in names.items() if old in inputs},
            {names[o]: o for o in comp.outputs},
            {v: borders[v] for v in (*inputs, *comp.outputs) if v in borders}))
    tasks, used = [], set()
    for key, (comp, occurrences, base) in keyed.items():
        name, k = base, 1
        while name in used:
            k += 1
            name = f"{base}_{k}"
        used.add(name)
        tasks.append(ModelTask(name, comp, key, tuple(occurrences)))
    return tasks


def _reading_padded(model: Model, groups: Sequence[tuple[str, ...]],
                    borders: Mapping[str, Border]) -> tuple[Model, list[tuple[str, ...]]]:
    """The model as the readers of bordered values see it, and its groups: each such value of
    its padded shape, each convolution padding it alike reading it without padding of its own,
    and every other reader reading an `Inside` node of its group's own (a view, folded into
    its indexing). The producer's node keeps the value's own shape, so the producer's
    computation is the same as without borders."""
    if not borders:
        return model, list(groups)
    group = {name: k for k, g in enumerate(groups) for name in g}
    shapes = dict(model._shapes)
    members = [list(g) for g in groups]
    nodes: list[Node] = []
    for n in model.nodes:
        padded = n.inputs[0] if (n.inputs and n.inputs[0] in borders and _pads(n, n.inputs[0])
                                 and group[n.name] != group[n.inputs[0]]) else None
        if padded:  # all such convolutions pad alike: the border is their padding
            n = replace(n, op=replace(n.op, pads=(0, 0, 0, 0)))
        # `__` keeps the name off every model value's (graph.py reserves it for inner stages).
        inside = {v: f"{v}_{group[n.name]}__inside" for v in n.inputs
                  if v in borders and v != padded and group[v] != group[n.name]}
        for v, name in inside.items():
            if name not in shapes:
                shapes[name] = model.shape(v)
                nodes.append(Node(name, Inside(borders[v]), (v,), model.shape(v)))
                members[group[n.name]].insert(0, name)
        nodes.append(replace(n, inputs=tuple(inside.get(v, v) for v in n.inputs)))
    shapes.update({v: bordered_shape(model.shape(v), border) for v, border in borders.items()})
    order = {n.name: k for k, n in enumerate(nodes)}
    return (replace(model, nodes=tuple(nodes), _shapes=shapes),
            [tuple(sorted(m, key=order.__getitem__)) for m in members])


def _input_names(comp: Computation) -> set[str]:
    return {t.name for t in comp.inputs}


def _topological(model: Model, groups: list[tuple[str, ...]], group: Mapping[str, int],
                 order: Mapping[str, int]) -> list[tuple[str, ...]]:
    """The groups in an order that runs each after those it reads (ties: the model's order of
    their first nodes; each group lists its nodes in the model's order)."""
    needs = [{group[i] for name in g for i in model.node(name).inputs if i in group} - {k}
             for k, g in enumerate(groups)]
    first = {k: order[g[0]] for k, g in enumerate(groups)}
    done: list[int] = []
    while len(done) < len(groups):
        ready = [k for k in range(len(groups)) if k not in done and needs[k] <= set(done)]
        assert ready, "the fusion rules keep the groups acyclic"
        done.append(min(ready, key=first.__getitem__))
    return [groups[k] for k in done]


def _base_name(model: Model, nodes: Sequence[str]) -> str:
    """The operator types of the group's nodes that compute (layout nodes left out), in
    order: `matmul_add_gelu`."""
    kinds = [model.node(n).op.op_type.lower() for n in nodes if not model.node(n).op.layout]
    kinds = kinds or [model.node(n).op.op_type.lower() for n in nodes]
    return "_".join(kinds)


def _canonical(comp: Computation) -> tuple[list[Tensor], dict[str, str]]:
    """The computation's outputs rebuilt under canonical names, and the renaming (old -> new):
    placeholders `in<k>` and stages `t<k>` (keeping an inner stage's `__part`), numbered in the
    order a depth-first walk from the outputs reaches them through each body's reads."""
    stages = {s.name: s for s in comp.stages}
    names: dict[str, str] = {}
    counts = {"in": 0, "t": 0}

    def visit(buffer: str) -> None:
        if buffer in names:
            return
        stage = stages.get(buffer)
        if stage is None:
            names[buffer] = f"in{counts['in']}"
            counts["in"] += 1
            return
        for ld in loads(stage.body):
            visit(ld.buffer)
        part = buffer.partition("__")[2]
        names[buffer] = f"t{counts['t']}" + (f"__{part}" if part else "")
        counts["t"] += 1

    for out in comp.outputs:
        visit(out)
    tensors: dict[str, Tensor] = {t.name: Tensor(names[t.name], t.shape) for t in comp.inputs}

    def rename(e: Expr) -> Expr:
        return transform(e, lambda n: Load(names[n.buffer], n.indices)
                         if isinstance(n, Load) else None)

    for s in comp.stages:  # already in topological order
        body = rename(s.body)
        deps = tuple(tensors[b] for b in sorted({ld.buffer for ld in loads(s.body)}))
        tensors[s.name] = Tensor(names[s.name], comp.shapes[s.name],
                                 Stage(names[s.name], s.axes, body, s.reduce), deps)
    return [tensors[o] for o in comp.outputs], names


def _text(outputs: Sequence[Tensor]) -> str:
    """A canonical computation as text: every input's and stage's shape, every stage's axes
    (extents and kinds), reducer and body, and the outputs."""
    comp = Computation("task", outputs)
    lines = [f"{t.name}{list(t.shape)}" for t in comp.inputs]
    for s in comp.stages:
        axes = ", ".join(f"{a.name}:{a.extent}:{a.kind}" for a in s.axes)
        lines.append(f"{s.name}[{axes}] {s.reduce or '='} {to_str(s.body)}")
    lines.append(" ".join(comp.outputs))
    return "\n".join(lines)


__all__ = ["Border", "ModelTask", "Occurrence", "bordered_values", "extract_tasks", "is_anchor",
           "partition"]
