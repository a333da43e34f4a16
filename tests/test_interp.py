"""The IR interpreter: naive programs of real workloads against the reference, NaN for points read
before they are written, and clear errors for bad inputs or out-of-bounds accesses."""

from dataclasses import replace

import numpy as np
import pytest

from eqsched.expr import Load, Var
from eqsched.interp import InterpError, run_program
from eqsched.ir import Alloc, Block, map_nodes, naive_program
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload


def test_naive_matmul_8x8x8_equals_numpy():
    prog = naive_program(get_workload("matmul").build(8, 8, 8))
    rng = np.random.default_rng(0)
    a, b = rng.random((8, 8), np.float32), rng.random((8, 8), np.float32)
    out = run_program(prog, {"A": a, "B": b})
    np.testing.assert_allclose(out["C"], a @ b, rtol=1e-5)
    assert list(out) == ["C"]


@pytest.mark.parametrize("name", ["softmax", "conv2d_nchw", "mm_exp_mm", "mlp"])
def test_naive_programs_match_the_reference(name):
    wl = get_workload(name)
    comp = wl.build(*wl.small_size)
    inputs = random_inputs(comp, seed=3)
    ok, _, msg = compare(run_program(naive_program(comp), inputs), reference(comp, inputs),
                         tolerance(comp))
    assert ok, msg


def test_the_untaken_select_branch_is_never_evaluated():
    # conv2d's padding stage reads X[h - 1, ...] only where h >= 1.
    comp = get_workload("conv2d_nchw").build(1, 1, 3, 3, 1, 3, 3, 1, 1)
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    out = run_program(naive_program(comp), {"X": x, "W": np.ones((1, 1, 3, 3), np.float32)})
    assert out["Y"][0, 0, 0, 0] == 0 + 1 + 3 + 4


def test_reading_before_writing_gives_nan():
    prog = naive_program(get_workload("matmul").build(4, 4, 4))
    without_init = prog.with_body(prog.body[1:])
    out = run_program(without_init, {"A": np.ones((4, 4)), "B": np.ones((4, 4))})
    assert np.isnan(out["C"]).all()


def test_local_buffers_start_as_nan_at_their_alloc():
    sch = Schedule(naive_program(get_workload("matmul").build(4, 4, 4)))
    sch.fuse("C.init", at="C.i")
    sch.cache_write("C.update", at="C.i")
    prog = sch.program
    alloc = prog.loop("C.i").body[0]
    assert isinstance(alloc, Alloc)
    skip_init = replace(alloc, body=alloc.body[1:])  # the tile is never zeroed
    broken = prog.with_body((replace(prog.loop("C.i"), body=(skip_init,)),))
    out = run_program(broken, {"A": np.ones((4, 4)), "B": np.ones((4, 4))})
    assert np.isnan(out["C"]).all()


def test_out_of_bounds_access_is_an_error_naming_block_and_buffer():
    prog = naive_program(get_workload("elementwise_chain").build(5))
    shifted = Load("X", (Var("i") + 1,))
    bad = prog.with_body(map_nodes(
        prog.body, lambda n: replace(n, value=shifted) if isinstance(n, Block) else None))
    ins = {"X": np.ones(5), "Y": np.ones(5)}
    with pytest.raises(InterpError, match=r"T: X\[i \+ 1\] = \[5\] is outside shape \[5\]"):
        run_program(bad, ins)


def test_missing_or_misshapen_inputs_are_errors():
    prog = naive_program(get_workload("matmul").build(4, 4, 4))
    with pytest.raises(InterpError, match="input B is missing"):
        run_program(prog, {"A": np.ones((4, 4))})
    with pytest.raises(InterpError, match=r"input A has shape \(4, 5\), expected \(4, 4\)"):
        run_program(prog, {"A": np.ones((4, 5)), "B": np.ones((4, 4))})


def test_a_padded_pack_copies_the_buffer_and_the_reader_never_reaches_the_pad():
    comp = get_workload("matmul").build(3, 11, 4)
    sch = Schedule(naive_program(comp))
    sch.pack("C.update", "B", dim=1, factor=8)  # 2 panels hold 11 columns; the pad stays NaN
    sch.split("C.j", [-1, 8])
    inputs = random_inputs(comp, seed=2)
    out = run_program(sch.program, inputs)["C"]
    assert not np.isnan(out).any()
    ok, _, msg = compare({"C": out}, reference(comp, inputs), tolerance(comp))
    assert ok, msg


def test_points_past_a_remainder_do_not_run():
    comp = get_workload("matmul").build(7, 5, 3)
    sch = Schedule(naive_program(comp))
    sch.split("C.i", [-1, 4])
    sch.split("C.init.j", [-1, 4])
    inputs = random_inputs(comp, seed=3)
    ok, _, msg = compare(run_program(sch.program, inputs), reference(comp, inputs), tolerance(comp))
    assert ok, msg
