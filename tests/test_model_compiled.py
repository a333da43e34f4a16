"""A model compiled end to end: every task's default schedule computes its computation; the
composed model equals `Model.evaluate` (and onnxruntime for an ONNX file built here with
onnx.helper); a task tuned into the database runs its stored program; buffers are planned once."""

import dataclasses
import math
import random

import numpy as np
import pytest
from conftest import SMALL_MODELS
from model_checks import random_inputs as model_inputs

from eqsched.backend import CompileOptions, aligned_copy, aligned_empty
from eqsched.compiled_model import CompiledModel, best_record, task_key
from eqsched.db import Database
from eqsched.egraph.derive import DeriveError, derive, realize
from eqsched.egraph.saturate import Limits, saturate
from eqsched.egraph.space import Space
from eqsched.egraph.term import show, vector_lanes
from eqsched.ir import naive_program
from eqsched.model import ModelBuilder, ModelError, get_model, import_onnx, save_onnx
from eqsched.model.tasks import extract_tasks
from eqsched.reference import compare
from eqsched.rules import resolve
from eqsched.schedule import Schedule, ScheduleError
from eqsched.trials import Settings, measurement_key, record_of

ONE_THREAD = CompileOptions(threads=1)


@pytest.mark.parametrize("name,params", SMALL_MODELS)
def test_a_compiled_built_in_model_equals_model_evaluate(name, params):
    model = get_model(name, **params)
    compiled = CompiledModel(model, options=ONE_THREAD)
    assert all(k.source == "default" for k in compiled.kernels.values())
    verdict = compiled.check(seed=2)
    assert verdict.correct, verdict.message
    inputs = model_inputs(model, seed=5)
    ok, _, message = compare(compiled(inputs), {k: v.astype(np.float64) for k, v in
                                                model.evaluate(inputs).items()}, (1e-4, 1e-4))
    assert ok, message


def test_buffers_are_planned_once_and_shared_by_values_that_do_not_live_together():
    model = get_model("bert_layer", seq=8, hidden=16, heads=2, ffn=32)
    compiled = CompiledModel(model, options=ONE_THREAD)
    computed = {v for t in compiled.tasks for o in t.occurrences for v in o.outputs.values()}
    every_value = sum(4 * math.prod(model.shape(v)) for v in computed)
    assert 0 < compiled.buffer_bytes < every_value
    inputs = model_inputs(model, seed=1)
    first = compiled(inputs)
    first["output"][...] = 0  # the caller's copy, not the planned buffer
    np.testing.assert_array_equal(compiled(inputs)["output"], compiled(inputs)["output"])
    assert np.abs(compiled(inputs)["output"]).max() > 0
    assert compiled.time(repeats=2) > 0


def test_one_native_call_runs_the_model_and_each_call_returns_outputs_of_its_own():
    model = get_model("bert_layer", seq=8, hidden=16, heads=2, ffn=32)
    compiled = CompiledModel(model, options=ONE_THREAD)
    assert len(compiled.tasks) > 1 and compiled.native_calls == 1
    calls = []
    for seed in range(3):
        inputs = model_inputs(model, seed=seed)
        # Any float array of the input's shape: a float64 copy in Fortran order here.
        given = {k: np.asfortranarray(v, np.float64) for k, v in inputs.items()}
        calls.append((inputs, compiled(given)))
    for inputs, outputs in calls:  # a later call changed none of an earlier call's outputs
        expected = {k: v.astype(np.float64) for k, v in model.evaluate(inputs).items()}
        ok, _, message = compare(outputs, expected, (1e-4, 1e-4))
        assert ok, message
    assert not np.may_share_memory(calls[0][1]["output"], calls[1][1]["output"])


def test_large_aligned_inputs_are_read_in_place_and_others_from_a_copy(monkeypatch):
    model = get_model("mlp", batch=128, inputs=128, hidden=8, outputs=4)  # x: 64 KiB
    compiled = CompiledModel(model, options=ONE_THREAD)
    (name, shape), = model.inputs.items()
    values = model_inputs(model, seed=4)[name]
    aligned = aligned_copy(values)
    shifted = aligned_empty((values.size + 1,))[1:].reshape(shape)  # 4 bytes past a boundary
    shifted[...] = values
    copied = []
    copyto = np.copyto
    monkeypatch.setattr(np, "copyto", lambda dst, src: (copied.append(src), copyto(dst, src)))
    expected = {k: v.astype(np.float64) for k, v in model.evaluate({name: values}).items()}
    for given in (aligned, shifted):
        ok, _, message = compare(compiled({name: given}), expected, (1e-4, 1e-4))
        assert ok, message
    assert len(copied) == 1 and copied[0] is shifted
    small = get_model("mlp", batch=3, inputs=16, hidden=8, outputs=4)
    compiled = CompiledModel(small, options=ONE_THREAD)
    given = aligned_copy(model_inputs(small, seed=4)[name])
    expected = {k: v.astype(np.float64) for k, v in small.evaluate({name: given}).items()}
    ok, _, message = compare(compiled({name: given}), expected, (1e-4, 1e-4))
    assert ok, message
    assert copied[-1] is given  # a small one is copied, aligned or not


def _tune(comp, db_path, trials: int, settings: Settings) -> int:
    """A few trials of the task's space, measured in the worker and stored under `task_key` as
    task tuning stores them: programs drawn from the saturated space, derived, measured."""
    naive = naive_program(comp)
    space = Space(saturate(naive, resolve(None), Limits(iterations=3)),
                  vector_lanes(settings.options().target.vector_lanes))
    rng, stored = random.Random(0), 0
    workload, size = task_key(comp)
    with Database(db_path) as db:
        while stored < trials:
            term, sizes = space.program(rng.randrange(space.count()))
            try:
                program = realize(term, sizes, naive)
                trace = derive(term, sizes, naive)
            except (DeriveError, ScheduleError):
                continue
            m = settings.measure(program)
            db.add(record_of(workload, size, measurement_key(program, settings), show(term), sizes,
                             trace, m, settings))
            stored += 1
    return stored


def test_a_task_tuned_into_the_database_runs_its_best_stored_program(tmp_path):
    model = get_model("mlp", inputs=12, hidden=8, outputs=5)
    tuned, untuned = extract_tasks(model)
    settings = Settings(threads=1, repeats=2, min_repeats=1, time_budget_s=0.05)
    db_path = tmp_path / "tuned.db"
    assert _tune(tuned.computation, db_path, 3, settings) == 3
    compiled = CompiledModel(model, db=db_path, options=ONE_THREAD)
    kernel = compiled.kernels[tuned.name]
    with Database(db_path, readonly=True) as db:
        best = db.best(*task_key(tuned.computation))
        # A parallel program timed on one thread says nothing of its time on two.
        for_two = best_record(db, tuned.computation, CompileOptions(threads=2))
        assert len({r.program_hash for r in db.records()}) == 3
    assert kernel.source == "database" and kernel.stored_s == best.median_s
    assert kernel.program.hash() == best.program_hash.partition("/")[0]
    assert for_two is None or "/threads=1" not in for_two.program_hash
    assert compiled.kernels[untuned.name].source == "default"
    verdict = compiled.check()
    assert verdict.correct, verdict.message



def test_a_task_takes_the_best_program_as_this_backend_timed_it(tmp_path):
    model = get_model("mlp", inputs=12, hidden=8, outputs=5)
    tuned = extract_tasks(model)[0]
    settings = Settings(threads=1, repeats=2, min_repeats=1, time_budget_s=0.05)
    _tune(tuned.computation, tmp_path / "tuned.db", 3, settings)
    with Database(tmp_path / "tuned.db") as db, Database(tmp_path / "older.db") as older:
        mine = sorted(db.records(*task_key(tuned.computation)), key=lambda r: r.median_s)
        assert mine[0].program_hash != mine[-1].program_hash
        # An older backend timed the slowest of them ten times faster than our fastest.
        stale = dataclasses.replace(mine[-1], median_s=mine[0].median_s / 10,
                                    settings={**mine[-1].settings, "codegen": "0/llvm-1"})
        db.add(stale)
        older.add(stale)
        assert best_record(db, tuned.computation, ONE_THREAD).median_s == mine[0].median_s
        # Where only another backend's timings are stored, they are what there is.
        assert best_record(older, tuned.computation, ONE_THREAD).median_s == stale.median_s

def test_inputs_are_checked_in_one_line():
    compiled = CompiledModel(get_model("mlp", inputs=12, hidden=8, outputs=5),
                             options=ONE_THREAD)
    with pytest.raises(ModelError, match=r"input 'x' has shape \(2, 12\), expected \(1, 12\)"):
        compiled({"x": np.zeros((2, 12))})
    with pytest.raises(ModelError, match="input 'x' is missing"):
        compiled({})
    with pytest.raises(ModelError, match=r"unknown inputs \['y'\]"):
        compiled({"x": np.zeros((1, 12)), "y": np.zeros(1)})


def _onnx_model(onnx, scale: float):
    """A small attention-like graph written with onnx.helper: Gemm, Relu, Reshape, Transpose,
    MatMul, Mul by a constant, Softmax, and names that are no Python identifiers."""
    h = onnx.helper
    rng = np.random.default_rng(0)

    def init(name, array):
        return h.make_tensor(name, onnx.TensorProto.FLOAT, array.shape,
                             array.astype(np.float32).ravel())

    nodes = [
        h.make_node("Gemm", ["input:0", "w", "b"], ["proj"], transB=1),
        h.make_node("Relu", ["proj"], ["act"]),
        h.make_node("Reshape", ["act", "shape"], ["heads"]),
        h.make_node("Transpose", ["heads"], ["heads_t"], perm=[1, 0, 2]),
        h.make_node("Transpose", ["heads"], ["heads_k"], perm=[1, 2, 0]),
        h.make_node("MatMul", ["heads_t", "heads_k"], ["scores"]),
        h.make_node("Mul", ["scores", "scale"], ["scaled"]),
        h.make_node("Softmax", ["scaled"], ["probs:out"], axis=-1),
    ]
    graph = h.make_graph(
        nodes, "tiny_attention",
        [h.make_tensor_value_info("input:0", onnx.TensorProto.FLOAT, [6, 8])],
        [h.make_tensor_value_info("probs:out", onnx.TensorProto.FLOAT, [2, 6, 6])],
        [init("w", rng.standard_normal((8, 8))), init("b", rng.standard_normal(8)),
         h.make_tensor("shape", onnx.TensorProto.INT64, [3], [6, 2, 4]),
         init("scale", np.array(scale))])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_an_imported_onnx_model_runs_end_to_end_and_agrees_with_onnxruntime(tmp_path):
    onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    path = tmp_path / "tiny_attention.onnx"
    onnx.save(_onnx_model(onnx, 0.5), str(path))
    model = import_onnx(path)
    compiled = CompiledModel(model, options=ONE_THREAD)
    assert [t.name for t in compiled.tasks] == ["gemm_relu", "matmul_mul", "softmax"]
    for verdict in (compiled.check(), compiled.check_onnxruntime(path)):
        assert verdict.correct, verdict.message
    # Another model's numbers (a different constant) are caught, naming the output.
    other = tmp_path / "other.onnx"
    onnx.save(_onnx_model(onnx, 2.0), str(other))
    verdict = compiled.check_onnxruntime(other)
    assert verdict.correct is False and "probs_out" in verdict.message


@pytest.mark.parametrize("name,params", SMALL_MODELS)
def test_a_built_in_model_exported_to_onnx_and_imported_agrees_with_onnxruntime(name, params,
                                                                               tmp_path):
    pytest.importorskip("onnx", reason="the onnx extra is not installed")
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    path = save_onnx(get_model(name, **params), tmp_path / f"{name}.onnx")
    compiled = CompiledModel(import_onnx(path), options=ONE_THREAD)
    for verdict in (compiled.check(seed=4), compiled.check_onnxruntime(path, seed=4),
                    compiled.check_onnxruntime(seed=4)):  # the file, and the model's export
        assert verdict.correct, verdict.message


def test_a_model_whose_output_is_read_by_another_task_keeps_its_own_buffer():
    b = ModelBuilder("two_outputs")
    x = b.input("x", (2, 3))
    h = b.matmul(x, b.weight("w", np.arange(12.0).reshape(3, 4)), name="h")
    model = b.build(h, b.softmax(h, name="p"))
    compiled = CompiledModel(model, options=ONE_THREAD)
    verdict = compiled.check()
    assert verdict.correct, verdict.message


def test_an_output_that_is_an_input_of_the_model_is_returned_as_given():
    b = ModelBuilder("passthrough")
    x = b.input("x", (3,))
    compiled = CompiledModel(b.build(b.relu(x, name="r"), x), options=ONE_THREAD)
    out = compiled({"x": np.array([-1.0, 0.5, 2.0])})
    np.testing.assert_array_equal(out["x"], np.array([-1.0, 0.5, 2.0], np.float32))
    np.testing.assert_array_equal(out["r"], np.array([0.0, 0.5, 2.0], np.float32))


def test_a_model_that_computes_nothing_returns_its_input():
    b = ModelBuilder("identity")
    compiled = CompiledModel(b.build(b.input("x", (3,))), options=ONE_THREAD)
    assert compiled.tasks == [] and compiled.native_calls == 0
    out = compiled({"x": np.array([-1.0, 0.5, 2.0])})
    np.testing.assert_array_equal(out["x"], np.array([-1.0, 0.5, 2.0], np.float32))


def test_each_task_s_kernel_is_timed_alone_once_however_often_it_occurs():
    model = get_model("bert_layer", seq=8, hidden=16, heads=2, ffn=32)
    compiled = CompiledModel(model, options=ONE_THREAD)
    times = compiled.time_tasks(repeats=2)
    assert list(times) == [t.name for t in compiled.tasks]  # the projections' task once
    assert max(t.weight for t in compiled.tasks) == 3 and all(s > 0 for s in times.values())
    verdict = compiled.check(seed=3)  # the timing calls left the planned buffers usable
    assert verdict.correct, verdict.message
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        compiled.time_tasks(repeats=0)


def test_a_stored_program_that_packs_a_weight_packs_each_occurrence_s_weight_once(tmp_path):
    b = ModelBuilder("three_projections")
    x = b.input("x", (4, 16))
    rng = np.random.default_rng(0)
    model = b.build(*(b.matmul(x, b.weight(f"w{n}", rng.standard_normal((16, 24))), name=f"y{n}")
                      for n in range(3)))
    (projection,) = extract_tasks(model)
    assert len(projection.occurrences) == 3  # one kernel, three weights
    naive = naive_program(projection.computation)
    schedule = Schedule(naive)
    schedule.pack(next(b for b in naive.blocks() if b.reduce).name, "in1", 1, 8)  # in1: w
    program = schedule.program
    assert program.preparation
    settings = Settings(threads=1, repeats=2, min_repeats=1, time_budget_s=0.05)
    measured = settings.measure(program)
    assert measured.correct
    with Database(tmp_path / "packed.db") as db:
        db.add(record_of(*task_key(projection.computation), measurement_key(program, settings),
                         "pack", {}, schedule.trace, measured, settings))
    compiled = CompiledModel(model, db=tmp_path / "packed.db", options=ONE_THREAD)
    assert compiled.kernels[projection.name].program.hash() == program.hash()
    inputs = model_inputs(model, seed=3)
    outputs = compiled(inputs)
    for n in range(3):
        np.testing.assert_allclose(outputs[f"y{n}"], inputs["x"] @ model.weights[f"w{n}"],
                                   rtol=1e-5, atol=1e-5)
    assert compiled.time_tasks(repeats=1)[projection.name] > 0


def test_a_chain_of_convolutions_reads_values_stored_padded_by_their_producers(tmp_path):
    b = ModelBuilder("conv_chain")
    rng = np.random.default_rng(0)
    h = b.input("x", (1, 3, 9, 9))
    for k, (pads, strides) in enumerate([((1, 1, 1, 1), (1, 1)), ((0, 1, 2, 1), (2, 1)),
                                         ((1, 1, 1, 1), (1, 1)), ((2, 0, 1, 1), (1, 2))]):
        w = b.weight(f"w{k}", rng.standard_normal((3, 3, 3, 3)))
        h = b.relu(b.conv(h, w, pads=pads, strides=strides, name=f"c{k}"), name=f"r{k}")
    model = b.build(h)
    tasks = extract_tasks(model)
    assert sum(len(o.borders) for t in tasks for o in t.occurrences) == 6  # r0, r1, r2 twice
    # The first task tuned: its stored program is moved inside the border where it runs.
    first = tasks[0]
    settings = Settings(threads=1, repeats=2, min_repeats=1, time_budget_s=0.05)
    assert _tune(first.computation, tmp_path / "chain.db", 2, settings) == 2
    for db in (None, tmp_path / "chain.db"):
        compiled = CompiledModel(model, db=db, options=ONE_THREAD)
        assert compiled.kernels[first.name].source == ("default" if db is None else "database")
        for seed in (1, 2):  # the borders stay zero from one call to the next
            verdict = compiled.check(seed=seed)
            assert verdict.correct, verdict.message
        assert set(compiled.time_tasks(repeats=1)) == {t.name for t in tasks}
        verdict = compiled.check(seed=3)
        assert verdict.correct, verdict.message


@pytest.mark.parametrize("second", ["conv", "unpadded_conv", "residual"])
def test_a_value_stored_padded_is_read_whole_by_convolutions_and_inside_by_others(second):
    b = ModelBuilder("two_readers")
    rng = np.random.default_rng(1)
    x = b.input("x", (1, 2, 6, 6))
    h = b.relu(b.conv(x, b.weight("w0", rng.standard_normal((2, 2, 3, 3))), name="c0"),
               name="h")
    y = b.conv(h, b.weight("w1", rng.standard_normal((2, 2, 3, 3))), pads=(1, 1, 1, 1),
               name="c1")
    other = {"conv": lambda: b.conv(h, b.weight("w2", rng.standard_normal((2, 2, 3, 3))),
                                    pads=(1, 1, 1, 1), name="c2"),
             "unpadded_conv": lambda: b.conv(h, b.weight("w2", rng.standard_normal(
                 (2, 2, 1, 1))), name="c2"),
             "residual": lambda: h}[second]()
    compiled = CompiledModel(b.build(b.add(y, other, name="y")), options=ONE_THREAD)
    assert {v for t in compiled.tasks for o in t.occurrences for v in o.borders} == {"h"}
    for seed in (2, 3):
        verdict = compiled.check(seed=seed)
        assert verdict.correct, verdict.message


def test_blocks_of_one_structure_stay_one_task_whether_their_output_is_stored_padded_or_not():
    # Two residual blocks: each reads its input stored padded (its convolution whole, its
    # residual the inside); the first block's output is stored padded for the second, the
    # second's is the model's. One task of weight 2, its kernel compiled once per border.
    b = ModelBuilder("two_blocks")
    rng = np.random.default_rng(4)
    h = b.relu(b.conv(b.input("x", (1, 4, 6, 6)), b.weight("w0", rng.standard_normal(
        (4, 4, 1, 1))), name="c0"), name="h0")
    for k in (1, 2):
        conv = b.conv(h, b.weight(f"w{k}", rng.standard_normal((4, 4, 3, 3))),
                      pads=(1, 1, 1, 1), name=f"c{k}")
        h = b.relu(b.add(conv, h, name=f"a{k}"), name=f"h{k}")
    compiled = CompiledModel(b.build(h), options=ONE_THREAD)
    (block,) = [t for t in compiled.tasks if t.weight == 2]
    assert [dict(o.borders) for o in block.occurrences] == [
        {"h0": ((0, 0), (0, 0), (1, 1), (1, 1)), "h1": ((0, 0), (0, 0), (1, 1), (1, 1))},
        {"h1": ((0, 0), (0, 0), (1, 1), (1, 1))}]
    first, second = (kernel for kernel, _ in compiled._calls[1:])
    assert first is not second  # one writes inside a border, the other a plain output
    verdict = compiled.check(seed=5)
    assert verdict.correct, verdict.message
