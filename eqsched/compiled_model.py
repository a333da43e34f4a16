"""A whole model as one callable: each task's kernel (the best program the database holds for it,
else a default schedule) called at each place the task occurs, over buffers planned once.

    compiled = CompiledModel(get_model("mlp"), db="eqsched.db", options=CompileOptions(threads=1))
    compiled({"x": image})["logits"]           # numpy in, numpy out
    compiled.check()                           # against Model.evaluate: a Verdict
    compiled.check_onnxruntime()               # against onnxruntime, when installed
    compiled.time(repeats=20)                  # median seconds of one call
    compiled.kernels["matmul_add_relu"].source # "database" or "default"

Tasks come from `model.tasks.extract_tasks`. A task's program is looked up under `task_key` (the
key its tuning stores measurements under): the fastest correct record for the compile target and
thread count (`best_record`), its trace replayed on the task's naive program. A task never tuned
(or tuned for another target) runs its `default_schedule`: the naive program with each nest's
innermost stored axis moved innermost and vectorized where legality allows, so an untuned model
still runs, and runs sensibly. Task tuning measures that schedule as each task's first trial, so
a tuned task's best record is never slower than it.

Buffers: weights are bound once (aligned copies); each input, and each value computed by one
task and read by another, gets an aligned buffer at construction, and a buffer whose value has no
reader left is reused by a later value that fits in it (never by an output of the task reading
it: kernels' pointers are `noalias`). Model outputs get buffers of their own, and so does a
value the tasks store padded (`Occurrence.borders`): its buffer is zeroed here, its producer's
program is moved inside the border (`ir.embedded`, compiled once per set of borders) and its
readers' tasks read it as `model.tasks` built them: a convolution padding it, whole; any other
reader, its inside. Every kernel call is
bound to its buffers once, in a `backend.chain.Chain`: a model call runs the whole model by one
native call (on one thread; a parallel loop split among threads adds its own), reading each
large input where the caller keeps it (copied into the input's own buffer when it does not
start on a 64-byte boundary, as the kernels were tuned) and writing each large output into the
new array it returns; small ones are copied in and out of their own buffers (`IN_PLACE_BYTES`).
The threads and the target are the compile options', as everywhere in the backend.

See docs/ARCHITECTURE.md §19 Tasks and compiled models.
"""

from __future__ import annotations

import math
import statistics
import time as _time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .backend import (
    ALIGNMENT,
    CompileOptions,
    Kernel,
    aligned_copy,
    aligned_empty,
    aligned_empty_at,
    codegen,
    compile_program,
)
from .backend.chain import Chain
from .db import Database, Record
from .default_schedule import default_schedule
from .explore import computation_key
from .ir import Program, bordered_shape, embedded, naive_program
from .model.graph import Model
from .model.op import ModelError, f32
from .model.tasks import ModelTask, Occurrence, extract_tasks
from .reference import compare
from .schedule import Schedule
from .te import Computation

# rtol and atol (`reference.compare`, atol relative to each output's largest magnitude): float32
# kernels against float32 evaluations differ by summation order and erf's approximation; a wrong
# kernel is off by the values' own size.
TOLERANCE = 1e-4

# Inputs and outputs of at least this many bytes are read and written where the caller has them;
# smaller ones are copied through buffers bound once, which costs a call less than reaching a
# new array's address from Python (docs §17.7: the MLP at batch 1).
IN_PLACE_BYTES = 1 << 16


def task_key(comp: Computation) -> tuple[str, list[int]]:
    """The (workload, size) a task's measurements are stored under: its name with its naive
    program's hash, no size (`explore.computation_key`, which task tuning stores with)."""
    return computation_key(comp)


def best_record(database: Database, comp: Computation, options: CompileOptions
                ) -> Record | None:
    """The fastest correct measurement of the task on this machine for the options' target,
    among programs without parallel loops and those measured with the options' thread count
    (their measurement key says it: `<hash>/threads=<n>`); those timed as this backend compiles
    them (`backend.codegen`) when there are any, since another backend's timings rank its own
    code. The program is compiled by this backend and checked in any case."""
    workload, size = task_key(comp)
    threads = f"threads={options.thread_count}"
    usable = [r for r in database.records(workload, size, target=options.target.spec)
              if r.correct and r.error is None and r.median_s is not None
              and r.program_hash.partition("/")[2] in ("", threads)]
    current = [r for r in usable if r.settings.get("codegen") == codegen()]
    return min(current or usable, key=lambda r: r.median_s, default=None)


@dataclass(frozen=True)
class TaskKernel:
    """A task's compiled program and where it came from: "database" (with the stored median
    seconds of the record) or "default"."""

    task: ModelTask
    program: Program
    kernel: Kernel
    source: str
    stored_s: float | None = None


@dataclass(frozen=True)
class Verdict:
    """An end-to-end check: `correct` (None: not checked, `message` says why), the largest
    absolute error over the outputs, and one line saying what was compared."""

    correct: bool | None
    max_error: float
    message: str

    def __bool__(self) -> bool:
        return bool(self.correct)


class CompiledModel:
    """`model` compiled task by task (see the module docstring); call it on a mapping of input
    name to array. `db` (a path or an open Database) supplies tuned programs; without it every
    task runs its default schedule. Calls share the planned buffers: one call at a time."""

    def __init__(self, model: Model, *, db: str | Path | Database | None = None,
                 options: CompileOptions | None = None, tasks: list[ModelTask] | None = None):
        self.model = model
        self.options = options or CompileOptions()
        self.tasks = tasks if tasks is not None else extract_tasks(model)
        self.kernels: dict[str, TaskKernel] = {}
        database = Database(db, readonly=True) if isinstance(db, (str, Path)) else db
        try:
            for task in self.tasks:
                self.kernels[task.name] = self._kernel(task, database)
        finally:
            if database is not None and database is not db:
                database.close()
        self._weights = {k: aligned_copy(w.reshape(-1)) for k, w in model.weights.items()}
        # Where an input is copied when the caller's array is not aligned as the kernels were
        # tuned; the chain is bound to these, and a call passes its own arrays in their place.
        self._inputs = {k: aligned_empty(s) for k, s in model.inputs.items()}
        self._buffers: list[np.ndarray] = []  # every planned buffer, once
        self._call_tasks: list[str] = []  # the task of each call, in running order
        self._calls, self._outputs = self._plan()  # kernel calls in running order, with arrays
        # The weights are copies of the model's own, which no call writes: what a kernel makes
        # of them (a packed weight, `Program.preparation`) is made once, here, as onnxruntime
        # pre-packs its constant weights when a session loads.
        self._in_place = [k for k, a in self._inputs.items() if a.nbytes >= IN_PLACE_BYTES]
        self._copied_in = [k for k in self._inputs if k not in self._in_place]
        self._out_in_place = [k for k, a in self._outputs.items() if a.nbytes >= IN_PLACE_BYTES]
        self._chain = Chain(self._calls, prepared=True,
                            per_call=[*(self._inputs[k] for k in self._in_place),
                                      *(self._outputs[k] for k in self._out_in_place)])

    def _kernel(self, task: ModelTask, database: Database | None) -> TaskKernel:
        comp = task.computation
        record = best_record(database, comp, self.options) if database is not None else None
        if record is not None:
            program = Schedule.replay(naive_program(comp), record.trace).program
            if program.hash() != record.program_hash.partition("/")[0]:
                raise ModelError(f"{self.model.name}: task {task.name}: the stored trace of "
                                 f"{record.program_hash} rebuilds another program")
            return TaskKernel(task, program, compile_program(program, self.options), "database",
                              record.median_s)
        program = default_schedule(comp, self.options.target.vector_lanes).program
        return TaskKernel(task, program, compile_program(program, self.options), "default")

    def _plan(self) -> tuple[list[tuple[Kernel, list[np.ndarray]]], dict[str, np.ndarray]]:
        """The kernel calls in running order, each with its arrays, and the outputs' buffers."""
        steps = sorted(((occ, task) for task in self.tasks for occ in task.occurrences),
                       key=lambda step: step[0].position)
        last_read: dict[str, int] = {}
        for k, (occ, _) in enumerate(steps):
            for value in occ.inputs.values():
                last_read[value] = k
        planned: dict[str, np.ndarray] = {}  # value -> its flat view of a buffer
        owner: dict[str, np.ndarray] = {}  # value -> that whole buffer
        free: list[np.ndarray] = []
        calls = []
        for k, (occ, task) in enumerate(steps):
            for value in occ.outputs.values():
                border = occ.borders.get(value)
                shape = self.model.shape(value)
                size = max(math.prod(bordered_shape(shape, border) if border else shape), 1)
                # A bordered value's buffer is its own: zeroed here, its border never written.
                fits = [] if value in self.model.outputs or border else [
                    j for j, b in enumerate(free) if b.size >= size]
                if fits:
                    buffer = free.pop(min(fits, key=lambda j: free[j].size))
                else:
                    buffer = aligned_empty((size,))
                    if border:
                        buffer[:] = 0.0
                    self._buffers.append(buffer)
                owner[value], planned[value] = buffer, buffer[:size]
            kern = self._kernel_at(task, occ)
            self._call_tasks.append(task.name)
            names = {**occ.inputs, **occ.outputs}
            arrays = []
            for buf in (*kern.program.inputs, *kern.program.outputs):
                value = names[buf.name]
                source = planned.get(value, self._weights.get(value))
                arrays.append((self._inputs[value] if source is None else source)
                              .reshape(buf.shape))
            calls.append((kern, arrays))
            for value in set(occ.inputs.values()):
                if (last_read.get(value) == k and value in planned
                        and value not in self.model.outputs and value not in occ.borders):
                    free.append(owner[value])
        return calls, {o: planned[o].reshape(self.model.shape(o))
                       for o in self.model.outputs if o in planned}

    def _kernel_at(self, task: ModelTask, occ: Occurrence) -> Kernel:
        """The task's kernel as this occurrence calls it: writing each bordered output inside
        its border (`ir.embedded`; compiled once per distinct set of borders)."""
        compiled = self.kernels[task.name]
        program = compiled.program
        for name, value in occ.outputs.items():
            if value in occ.borders:
                program = embedded(program, name, occ.borders[value])
        if program is compiled.program:
            return compiled.kernel
        return compile_program(program, self.options)

    @property
    def buffer_bytes(self) -> int:
        """The bytes of the buffers planned for values computed by tasks (outputs included)."""
        return sum(b.nbytes for b in self._buffers)

    @property
    def native_calls(self) -> int:
        """Native calls one model call makes from the calling thread: one for the whole model,
        plus one per kernel function whose parallel loop is split among threads (and one for
        each run of serial functions between two such)."""
        return self._chain.native_calls

    # ---- calling ----------------------------------------------------------------------------

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs for `inputs` (name -> array of the input's shape), as new
        float32 arrays (a later call does not change them). An input of `IN_PLACE_BYTES` or
        more that starts on a 64-byte boundary (`backend.aligned_copy`) is read in place."""
        checked = self.model.checked_inputs(inputs)
        for name in self._copied_in:
            np.copyto(self._inputs[name], checked[name])
        addresses = [self._input_address(name, checked[name]) for name in self._in_place]
        computed = {}
        for name in self._out_in_place:
            computed[name], address = aligned_empty_at(self._outputs[name].shape)
            addresses.append(address)
        self._chain.run_at(addresses)
        return {o: computed[o] if o in computed else self._returned(o, checked)
                for o in self.model.outputs}

    def _input_address(self, name: str, array: np.ndarray) -> int:
        """Where the chain reads input `name`: the caller's array when aligned, else a copy."""
        address = array.ctypes.data
        if address % ALIGNMENT == 0:
            return address
        np.copyto(self._inputs[name], array)
        return self._inputs[name].ctypes.data

    def _returned(self, name: str, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """A copy of an output the chain wrote into its bound buffer, or of an input or weight
        of the model that no task computes."""
        if name in self._outputs:
            return self._outputs[name].copy()
        source = inputs[name] if name in inputs else self.model.weights[name]
        return f32(source).reshape(self.model.shape(name)).copy()

    # ---- checking and timing ----------------------------------------------------------------

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Standard normal inputs of the model's shapes, from `seed`, aligned (a call reads
        them in place)."""
        rng = np.random.default_rng(seed)
        return {k: aligned_copy(rng.standard_normal(s).astype(np.float32))
                for k, s in self.model.inputs.items()}

    def check(self, inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> Verdict:
        """This model's outputs against `Model.evaluate` (numpy, node by node) on `inputs`
        (random from `seed` by default)."""
        inputs = inputs if inputs is not None else self.random_inputs(seed)
        return _compare(self(inputs), self.model.evaluate(inputs), "numpy (Model.evaluate)")

    def check_onnxruntime(self, source: str | Path | Any | None = None,
                          inputs: Mapping[str, np.ndarray] | None = None,
                          seed: int = 0) -> Verdict:
        """This model's outputs against onnxruntime's on the ONNX form of the model: `source`
        (a file or an `onnx.ModelProto`, e.g. the one it was imported from), by default the
        model exported with `model.to_onnx`. Not checked (correct None) when onnxruntime is not
        installed."""
        try:
            import onnxruntime as ort
        except ImportError:
            return Verdict(None, math.nan, "not checked: onnxruntime is not installed")
        if source is None:
            from .model.onnx_export import to_onnx
            source = to_onnx(self.model)
        payload = str(source) if isinstance(source, (str, Path)) else source.SerializeToString()
        settings = ort.SessionOptions()
        settings.intra_op_num_threads = self.options.thread_count
        session = ort.InferenceSession(payload, settings, providers=["CPUExecutionProvider"])
        inputs = inputs if inputs is not None else self.random_inputs(seed)
        named = self.model.source_names
        feed = {named.get(k, k): f32(v) for k, v in inputs.items()}
        wanted = [named.get(o, o) for o in self.model.outputs]
        theirs = dict(zip(self.model.outputs, session.run(wanted, feed)))
        return _compare(self(inputs), theirs, "onnxruntime")

    def time(self, repeats: int = 10, inputs: Mapping[str, np.ndarray] | None = None,
             warmup: int = 1) -> float:
        """The median seconds of one end-to-end call, as a caller pays it (inputs checked,
        outputs written into new arrays), over `repeats` calls after `warmup`."""
        inputs = inputs if inputs is not None else self.random_inputs()
        return _median_seconds(lambda: self(inputs), repeats, warmup)

    def summary(self) -> list[dict[str, Any]]:
        """One row per task: name, weight, FLOPs, where its program came from, stored seconds."""
        return [{"task": k.task.name, "weight": k.task.weight, "flops": k.task.flops,
                 "source": k.source, "stored_s": k.stored_s} for k in self.kernels.values()]

    def time_tasks(self, repeats: int = 10, inputs: Mapping[str, np.ndarray] | None = None,
                   warmup: int = 1) -> dict[str, float]:
        """Each task's kernel alone, by task name: the median seconds of one call on the buffers
        planned for its first occurrence (one native call, as the model makes it), over
        `repeats` calls after `warmup`. Weight times this, summed over tasks, is the part of
        `time` spent in kernels."""
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        # One whole call on the bound buffers first, so every planned buffer holds the values a
        # real call gives (never uninitialized memory, whose NaNs and denormals would time
        # differently).
        checked = self.model.checked_inputs(inputs if inputs is not None
                                            else self.random_inputs())
        for name, buffer in self._inputs.items():
            np.copyto(buffer, checked[name])
        self._chain(*(self._inputs[k] for k in self._in_place),
                    *(self._outputs[k] for k in self._out_in_place))
        medians: dict[str, float] = {}
        for name in self.kernels:
            kernel, arrays = self._calls[self._call_tasks.index(name)]
            # One native call, as the model calls it (its preparation done, here, once).
            alone = Chain([(kernel, arrays)], prepared=True)
            medians[name] = _median_seconds(alone, repeats, warmup)
        return medians


def _median_seconds(call: Callable[[], object], repeats: int, warmup: int) -> float:
    """The median seconds of one `call`, over `repeats` calls after `warmup`."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = _time.perf_counter()
        call()
        times.append(_time.perf_counter() - start)
    return statistics.median(times)


def _compare(ours: Mapping[str, np.ndarray], theirs: Mapping[str, np.ndarray],
             against: str) -> Verdict:
    expected = {k: np.asarray(v, np.float64).reshape(ours[k].shape) for k, v in theirs.items()}
    ok, max_error, message = compare(ours, expected, (TOLERANCE, TOLERANCE))
    return Verdict(ok, max_error, f"{'correct' if ok else 'wrong'} against {against}: {message}")


__all__ = ["CompiledModel", "TaskKernel", "Verdict", "best_record", "task_key"]
