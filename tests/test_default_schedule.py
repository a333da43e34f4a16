"""The default schedule of every task of the built-in models computes its computation, is built
by its own trace from the naive program, and vectorizes a matmul along its columns."""

import pytest
from conftest import SMALL_MODELS

from eqsched.backend import CompileOptions, compile_program
from eqsched.default_schedule import default_schedule
from eqsched.ir import LoopKind, naive_program
from eqsched.model import get_model
from eqsched.model.tasks import extract_tasks
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.schedule import Schedule

ONE_THREAD = CompileOptions(threads=1)


@pytest.mark.parametrize("name,params", SMALL_MODELS)
def test_every_task_s_default_schedule_computes_its_computation_and_replays(name, params):
    lanes = ONE_THREAD.target.vector_lanes
    for task in extract_tasks(get_model(name, **params)):
        comp = task.computation
        sch = default_schedule(comp, lanes)
        kernel = compile_program(sch.program, ONE_THREAD)
        inputs = random_inputs(comp, seed=1)
        ok, _, message = compare(kernel.run(inputs), reference(comp, inputs), tolerance(comp))
        assert ok, f"{task.name}: {message}"
        # Stored as a trial, it is rebuilt from its trace (as any tuned program is).
        assert sch.trace
        assert Schedule.replay(naive_program(comp), sch.trace).program.hash() == \
            sch.program.hash()


def test_the_default_schedule_vectorizes_a_matmul_along_its_columns():
    comp = extract_tasks(get_model("mlp"))[0].computation  # 1x784 @ 784x128, bias, relu
    program = default_schedule(comp, 16).program
    vector = [lp.name for lp in program.loops() if lp.kind == LoopKind.VECTOR]
    # The reduction moved out of the innermost place; every nest's columns run 16 wide.
    assert "t0.i1.1" in vector and len(vector) == 4
    assert all(lp.extent == 16 for lp in program.loops() if lp.kind == LoopKind.VECTOR)
