"""Schedule primitives: each transformed program is executed (interpreter and LLVM backend) and
compared with the numpy reference; each illegal use is rejected with a message naming the cause."""

import json

import pytest

from eqsched.backend import compile_program
from eqsched.interp import run_program
from eqsched.ir import LoopKind, Program, naive_program, parallel_nest
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.schedule import Schedule, ScheduleError, load_trace, save_trace
from eqsched.te import Computation, compute, placeholder
from eqsched.workloads import get_workload


def build(name: str, *size: int) -> tuple[Computation, Schedule]:
    comp = get_workload(name).build(*size)
    return comp, Schedule(naive_program(comp))


def assert_computes(prog: Program, comp: Computation) -> None:
    """The program gives the reference's outputs, both interpreted and compiled."""
    inputs = random_inputs(comp, seed=1)
    want = reference(comp, inputs)
    ok, _, msg = compare(run_program(prog, inputs), want, tolerance(comp))
    assert ok, f"interpreter: {msg}\n{prog.text()}"
    ok, _, msg = compare(compile_program(prog).run(inputs), want, tolerance(comp))
    assert ok, f"backend: {msg}\n{prog.text()}"


def binding_text(prog: Program, block: str) -> dict[str, str]:
    return {b.axis: str(b.expr()) for b in prog.block(block).bindings}


# ---- split / reorder --------------------------------------------------------------------------


def test_split_names_pieces_and_rebinds_the_axis_mixed_radix():
    comp, sch = build("matmul", 16, 24, 8)
    assert sch.split("C.i", [2, -1, 4]) == ["C.i.0", "C.i.1", "C.i.2"]
    assert [lp.extent for lp in sch.program.enclosing("C.update")][:3] == [2, 2, 4]
    assert binding_text(sch.program, "C.update")["i"] == "C.i.0 * 8 + C.i.1 * 4 + C.i.2"
    assert sch.trace == [{"op": "split", "args": {"loop": "C.i", "factors": [2, 2, 4]}}]
    assert_computes(sch.program, comp)


def test_split_rejects_a_factor_that_does_not_divide_the_extent():
    _, sch = build("matmul", 100, 8, 8)
    with pytest.raises(ScheduleError, match=r"split of C.i \(extent 100\) by \[7\]: "
                                            r"7 does not divide 100"):
        sch.split("C.i", [7])
    with pytest.raises(ScheduleError, match="multiply to 50, not 100"):
        sch.split("C.i", [5, 10])
    with pytest.raises(ScheduleError, match="at most one -1"):
        sch.split("C.i", [-1, -1])
    with pytest.raises(ScheduleError, match="no loop named 'C.x'"):
        sch.split("C.x", [2, 50])
    sch.unroll("C.k")
    with pytest.raises(ScheduleError, match="split of C.k: it is unrolled"):
        sch.split("C.k", [2, 4])
    assert [s["op"] for s in sch.trace] == ["unroll"]  # rejected steps leave no trace


def test_a_split_may_leave_a_remainder_in_its_outermost_piece():
    comp, sch = build("matmul", 127, 13, 7)
    assert sch.split("C.i", [-1, 16]) == ["C.i.0", "C.i.1"]
    assert [lp.extent for lp in sch.program.enclosing("C.update")][:2] == [8, 16]
    assert sch.trace[-1]["args"]["factors"] == [8, 16]
    sch.split("C.i.0", [-1, 3])  # the outermost piece again: 3 x 3 of 8
    sch.split("C.j", [4, -1])  # 13 = 4 steps of 4, the last with 1
    sch.split("C.k", [2, 4])  # no -1: 2 x 4 covers 7 with one step to spare
    sch.unroll("C.k.1")
    assert_computes(sch.program, comp)


def test_a_remainder_is_refused_where_it_would_overlap_or_be_empty():
    _, sch = build("matmul", 127, 13, 7)
    sch.split("C.i", [-1, 16])
    with pytest.raises(ScheduleError, match=r"split of C.i.1 \(extent 16\) by \[-1, 5\]: C.i.1 "
                                            r"is an inner piece of axis i of C.update"):
        sch.split("C.i.1", [-1, 5])
    with pytest.raises(ScheduleError, match="20 does not divide 13"):
        sch.split("C.j", [10, 2])  # 20 > 13, but the second step of 10 would be empty
    with pytest.raises(ScheduleError, match="pieces must nest outer to inner, but C.i.1 "
                                            "encloses C.i.0"):
        sch.reorder("C.i.1", "C.i.0")


def test_reorder_permutes_a_chain_of_loops():
    comp, sch = build("matmul", 16, 24, 8)
    sch.split("C.j", [3, 8])
    sch.reorder("C.j.0", "C.k", "C.i", "C.j.1")
    names = [lp.name for lp in sch.program.enclosing("C.update")]
    assert names == ["C.j.0", "C.k", "C.i", "C.j.1"]
    assert_computes(sch.program, comp)


def test_reorder_keeps_unnamed_chain_loops_in_place():
    _, sch = build("matmul", 16, 24, 8)
    sch.reorder("C.k", "C.i")
    assert [lp.name for lp in sch.program.enclosing("C.update")] == ["C.k", "C.j", "C.i"]


def test_reorder_rejects_loops_off_one_chain():
    _, sch = build("matmul", 16, 24, 8)
    with pytest.raises(ScheduleError, match="needs two or more distinct loops"):
        sch.reorder("C.i", "C.i")
    with pytest.raises(ScheduleError, match="C.init.i is not nested in C.i"):
        sch.reorder("C.i", "C.init.i")
    sch.fuse("C.init", at="C.i")
    with pytest.raises(ScheduleError, match="C.i has 2 children"):
        sch.reorder("C.j", "C.i")


# ---- fuse ---------------------------------------------------------------------------------


def test_fuse_init_into_a_tiled_update_mirrors_its_remaining_pieces():
    comp, sch = build("matmul", 16, 24, 8)
    sch.split("C.i", [2, 8])
    sch.split("C.j", [3, 8])
    sch.reorder("C.i.0", "C.j.0", "C.k", "C.i.1", "C.j.1")
    sch.fuse("C.init", at="C.j.0")
    prog = sch.program
    assert [lp.name for lp in prog.enclosing("C.init")] == ["C.i.0", "C.j.0", "C.init.i.1",
                                                             "C.init.j.1"]
    assert binding_text(prog, "C.init") == {"i": "C.i.0 * 8 + C.init.i.1",
                                            "j": "C.j.0 * 8 + C.init.j.1"}
    assert prog.loop("C.j.0").body[0].name == "C.init.i.1"  # a producer goes first
    assert_computes(prog, comp)


def test_fuse_init_inside_the_reduction_is_rejected():
    _, sch = build("matmul", 16, 24, 8)
    with pytest.raises(ScheduleError, match="would put C.init inside C.update.s reduce loop C.k"):
        sch.fuse("C.init", at="C.k")


def test_fuse_consumer_after_the_producer_at_a_spatial_tile():
    comp, sch = build("mm_exp_mm", 8, 6, 12, 10)
    sch.split("C.j", [3, 4])
    sch.reorder("C.i", "C.j.0", "C.k", "C.j.1")
    sch.fuse("C.init", at="C.j.0")
    sch.fuse("D", at="C.j.0")
    prog = sch.program
    assert prog.loop("C.j.0").body[-1].name == "D.j.1"  # a consumer goes last
    assert binding_text(prog, "D") == {"i": "C.i", "j": "C.j.0 * 4 + D.j.1"}
    assert_computes(prog, comp)


def test_fuse_consumer_after_a_register_tiled_producer():
    comp, sch = build("mm_exp_mm", 16, 8, 32, 12)
    sch.split("C.i", [2, 8])
    sch.split("C.j", [2, 16])
    sch.reorder("C.i.0", "C.j.0", "C.k", "C.i.1", "C.j.1")
    sch.fuse("C.init", at="C.j.0")
    sch.cache_write("C.update", at="C.j.0")
    sch.fuse("D", at="C.j.0")  # reads what C.write copied out in the same iteration
    for loop in ("C.j.1", "C.init.j.1", "C.write.j.1", "D.j.1"):
        sch.vectorize(loop)
    sch.parallel("C.i.0")
    assert [lp.name for lp in sch.program.enclosing("D")] == ["C.i.0", "C.j.0", "D.i.1", "D.j.1"]
    assert_computes(sch.program, comp)


def test_fuse_consumer_inside_the_producers_reduction_is_rejected():
    _, sch = build("mm_exp_mm", 8, 6, 12, 10)
    with pytest.raises(ScheduleError, match="inside C.update's reduce loop C.k"):
        sch.fuse("D", at="C.k")


def neighbour_chain() -> Computation:
    A = placeholder((8, 8), "A")
    C = compute((8, 8), lambda i, j: A[i, j] * 2.0, "C")
    D = compute((8, 7), lambda i, m: C[i, m + 1] - C[i, m], "D")
    return Computation("neighbours", [D])


def test_fuse_a_neighbour_reading_consumer_only_where_rows_are_independent():
    comp = neighbour_chain()
    sch = Schedule(naive_program(comp))
    with pytest.raises(ScheduleError, match=r"D accesses C\[i, m \+ 1\], not elementwise"):
        sch.fuse("D", at="C.j")
    sch.fuse("D", at="C.i")  # a whole row of C is ready before D reads it
    assert_computes(sch.program, comp)


def test_fuse_needs_a_block_alone_in_its_nest_and_a_relation():
    _, sch = build("mm_exp_mm", 8, 6, 12, 10)
    sch.fuse("C.init", at="C.i")
    with pytest.raises(ScheduleError, match="C.update is not alone in its root-level nest"):
        sch.fuse("C.update", at="D.i")
    with pytest.raises(ScheduleError, match="no block under C.i reads or writes what F.init uses"):
        sch.fuse("F.init", at="C.i")


def test_fuse_producer_of_a_convolution_at_the_batch_loop():
    comp, sch = build("conv2d_nchw", 2, 3, 5, 4, 2, 3, 3, 1, 1)
    with pytest.raises(ScheduleError, match="loop Y.k has no corresponding axis of Xpad"):
        sch.fuse("Xpad", at="Y.k")
    sch.fuse("Xpad", at="Y.n")
    assert sch.program.loop("Y.n").body[0].name == "Xpad.c"
    assert_computes(sch.program, comp)


def test_fuse_a_softmax_chain_with_a_max_reduction():
    comp, sch = build("softmax", 5, 17)
    sch.fuse("M.init", at="M.i")
    sch.fuse("E", at="M.i")
    sch.fuse("S.init", at="S.i")
    sch.vectorize("E.j")
    assert [lp.name for lp in sch.program.enclosing("E")] == ["M.i", "E.j"]
    assert_computes(sch.program, comp)


# ---- inline -------------------------------------------------------------------------------


def test_inline_padding_into_the_convolution():
    comp, sch = build("conv2d_nchw", 1, 3, 5, 4, 2, 3, 3, 1, 1)
    sch.inline("Xpad")
    prog = sch.program
    assert "Xpad" not in {b.name for b in prog.buffers}
    assert "select(" in str(prog.block("Y.update").value)
    assert_computes(prog, comp)


def test_inline_an_elementwise_stage_between_two_matmuls():
    comp, sch = build("mm_exp_mm", 8, 6, 12, 10)
    sch.inline("D")
    assert str(sch.program.block("F.update").value) == "exp(C[i, l]) * E[l, j]"
    assert_computes(sch.program, comp)


def test_inline_rejects_reductions_and_outputs():
    _, sch = build("mm_exp_mm", 8, 6, 12, 10)
    with pytest.raises(ScheduleError, match="inline C.update: C is a reduction"):
        sch.inline("C.update")
    _, sch = build("elementwise_chain", 37)
    with pytest.raises(ScheduleError, match="only intermediates can be inlined, Z is output"):
        sch.inline("Z")
    with pytest.raises(ScheduleError, match="no block named 'T.update'"):
        sch.inline("T.update")


# ---- annotations --------------------------------------------------------------------------


def test_vectorize_unroll_parallel_set_loop_kinds():
    comp, sch = build("matmul", 16, 24, 8)
    sch.split("C.i", [4, 4])
    sch.reorder("C.i.0", "C.k", "C.i.1", "C.j")
    sch.vectorize("C.j")
    sch.unroll("C.i.1")
    sch.parallel("C.i.0")
    sch.vectorize("C.init.j")
    kinds = {lp.name: lp.kind for lp in sch.program.loops()}
    assert kinds["C.j"] == LoopKind.VECTOR and kinds["C.i.1"] == LoopKind.UNROLL
    assert kinds["C.i.0"] == LoopKind.PARALLEL
    assert_computes(sch.program, comp)


def test_vectorize_rejects_outer_loops_and_reduce_loops_and_scatters_strided_stores():
    comp, sch = build("matmul", 16, 24, 8)
    with pytest.raises(ScheduleError, match="C.i is not innermost: it contains C.j"):
        sch.vectorize("C.i")
    with pytest.raises(ScheduleError, match="C.k is reduce axis k of block C.update"):
        sch.vectorize("C.k")
    sch.reorder("C.j", "C.i")
    sch.reorder("C.k", "C.i")
    sch.vectorize("C.i")  # C[i, j] at stride 24 per lane: a gather and a scatter, lanes distinct
    assert_computes(sch.program, comp)


def test_unroll_is_limited_and_parallel_needs_a_root_spatial_loop():
    _, sch = build("matmul", 16, 96, 8)
    with pytest.raises(ScheduleError, match="extent 96 > 64"):
        sch.unroll("C.j")
    with pytest.raises(ScheduleError, match="parallel loop C.j is not at the root"):
        sch.parallel("C.j")
    sch.reorder("C.k", "C.i")
    with pytest.raises(ScheduleError, match="parallel loop C.k binds reduce axis k"):
        sch.parallel("C.k")


def test_a_parallel_loop_alone_in_a_parallel_loop_shares_its_steps_with_it():
    comp, sch = build("matmul", 16, 96, 8)
    sch.split("C.j", [-1, 16])
    sch.reorder("C.i", "C.j.0", "C.k", "C.j.1")
    sch.parallel("C.i")
    sch.parallel("C.j.0")
    assert [lp.name for lp in parallel_nest(sch.program.body[-1])] == ["C.i", "C.j.0"]
    assert_computes(sch.program, comp)
    with pytest.raises(ScheduleError, match="parallel loop C.k binds reduce axis k"):
        sch.fork().parallel("C.k")
    with pytest.raises(ScheduleError, match="parallel loop C.j.1 is not at the root of the "
                                            "program nor the only statement of a parallel loop"):
        sch.fork().parallel("C.j.1")  # under the serial C.k
    fused = sch.fork()
    fused.reorder("C.j.0", "C.i")  # C.j.0 outermost, C.i under it: both still parallel
    assert [lp.name for lp in parallel_nest(fused.program.body[-1])] == ["C.j.0", "C.i"]


# ---- cache_write and pack -----------------------------------------------------------------


def test_cache_write_with_init_fused_needs_no_copy_in():
    comp, sch = build("matmul", 16, 24, 8)
    sch.split("C.i", [2, 8])
    sch.reorder("C.i.0", "C.j", "C.k", "C.i.1")
    sch.fuse("C.init", at="C.j")
    assert sch.cache_write("C.update", at="C.j") == "C.local"
    prog = sch.program
    assert prog.buffer("C.local").shape == (8,)
    assert prog.block("C.init").buffer == "C.local"
    assert str(prog.block("C.update").indices[0]) == "i % 8"
    assert "C.read" not in {b.name for b in prog.blocks()}
    assert [lp.name for lp in prog.enclosing("C.write")] == ["C.i.0", "C.j", "C.write.i.1"]
    assert_computes(prog, comp)


def test_cache_write_without_init_copies_the_tile_in_and_out():
    comp, sch = build("matmul", 16, 24, 8)
    sch.split("C.j", [3, 8])
    sch.reorder("C.i", "C.j.0", "C.k", "C.j.1")
    sch.vectorize("C.j.1")
    sch.cache_write("C.update", at="C.j.0")
    prog = sch.program
    loops = {lp.name: lp for lp in prog.loops()}
    assert loops["C.read.j.1"].kind == LoopKind.VECTOR
    assert loops["C.write.j.1"].kind == LoopKind.VECTOR
    assert_computes(prog, comp)


def test_cache_write_rejects_a_foreign_reader_under_the_loop():
    _, sch = build("mm_exp_mm", 8, 6, 12, 10)
    sch.fuse("C.init", at="C.i")
    sch.fuse("D", at="C.i")
    with pytest.raises(ScheduleError, match="D under C.i reads C"):
        sch.cache_write("C.update", at="C.i")


def test_pack_an_input_into_column_panels():
    comp, sch = build("matmul", 16, 24, 8)
    assert sch.pack("C.update", "B", dim=1, factor=8) == "B_packed"
    prog = sch.program
    assert prog.buffer("B_packed").shape == (3, 8, 8)
    assert str(prog.block("C.update").value) == "A[i, k] * B_packed[j // 8, k, j % 8]"
    assert str(prog.block("B_packed").value) == "B[p1, p0 * 8 + p2]"
    assert prog.body[1].name == "B_packed.p1"  # right before the update's nest
    # in B's own order: along its rows, each panel's run of a row one vector
    assert [(lp.name, lp.kind) for lp in prog.loops() if lp.name.startswith("B_packed")] == [
        ("B_packed.p1", LoopKind.SERIAL), ("B_packed.p0", LoopKind.SERIAL),
        ("B_packed.p2", LoopKind.VECTOR)]
    assert_computes(prog, comp)


def test_pack_an_intermediate_read_by_the_second_matmul():
    comp, sch = build("mm_exp_mm", 8, 6, 12, 10)
    sch.pack("F.update", "D", dim=0, factor=4)
    assert sch.program.buffer("D_packed").shape == (2, 12, 4)
    assert_computes(sch.program, comp)


def test_pack_along_an_outer_dimension_unrolls_the_transposing_copy():
    comp, sch = build("conv2d_nchw", 1, 3, 5, 5, 32, 3, 3, 1, 1)
    sch.pack("Y.update", "W", dim=0, factor=16)  # W_packed[k // 16, c, r, s, k % 16]
    prog = sch.program
    assert prog.buffer("W_packed").shape == (2, 3, 3, 3, 16)
    kinds = {lp.name: lp.kind for lp in prog.loops() if lp.name.startswith("W_packed")}
    assert kinds.pop("W_packed.p4") == LoopKind.UNROLL
    assert set(kinds.values()) == {LoopKind.SERIAL}
    assert_computes(prog, comp)
    _, rows = build("matmul", 16, 24, 8)
    rows.pack("C.update", "B", dim=1, factor=8)  # contiguous runs: a vector each
    assert rows.program.loop("B_packed.p2").kind == LoopKind.VECTOR
    _, wide = build("matmul", 4, 1024, 8)
    wide.pack("C.update", "B", dim=1, factor=512)  # wider than MAX_VECTOR_COPY: a loop
    assert wide.program.loop("B_packed.p2").kind == LoopKind.SERIAL


def test_the_copy_feeding_a_parallel_nest_is_parallel():
    comp, sch = build("matmul", 16, 24, 8)
    sch.split("C.i", [4, 4])
    sch.parallel("C.i.0")
    sch.pack("C.update", "B", dim=1, factor=8)  # B's 8 rows, copied by the update's cores
    prog = sch.program
    assert prog.loop("B_packed.p1").kind == LoopKind.PARALLEL
    assert prog.loop("B_packed.p0").kind == LoopKind.SERIAL
    assert_computes(prog, comp)
    _, one_row = build("matmul", 16, 8, 1)
    one_row.split("C.i", [4, 4])
    one_row.parallel("C.i.0")
    one_row.pack("C.update", "B", dim=1, factor=8)  # nothing to share out
    assert one_row.program.loop("B_packed.p1").kind == LoopKind.SERIAL
    comp, columns = build("matmul", 16, 24, 8)
    columns.split("C.i", [4, 4])
    columns.parallel("C.i.0")
    columns.pack("C.update", "A", dim=0, factor=4)  # transposing: its panels are shared out
    assert columns.program.loop("A_packed.p0").kind == LoopKind.PARALLEL
    assert_computes(columns.program, comp)


def test_pack_with_a_factor_that_does_not_divide_pads_the_last_panel():
    comp, sch = build("matmul", 5, 13, 7)
    sch.pack("C.update", "B", dim=1, factor=8)  # 13 columns in 2 panels of 8: 3 of pad
    prog = sch.program
    assert prog.buffer("B_packed").shape == (2, 7, 8)
    assert str(prog.block("B_packed").value) == "B[p1, q]"
    assert [str(ix) for ix in prog.block("B_packed").indices] == ["q // 8", "p1", "q % 8"]
    assert binding_text(prog, "B_packed")["q"] == "B_packed.p0 * 8 + B_packed.p2"
    assert str(prog.block("C.update").value) == "A[i, k] * B_packed[j // 8, k, j % 8]"
    assert_computes(prog, comp)
    # The register tile over the panels leaves a remainder of 5 of its 8 lanes.
    sch.split("C.j", [-1, 8])
    sch.reorder("C.i", "C.j.0", "C.k", "C.j.1")
    sch.vectorize("C.j.1")
    assert_computes(sch.program, comp)


def test_a_padded_transposing_pack_of_an_outer_dimension():
    comp, sch = build("conv2d_nchw", 1, 3, 5, 5, 11, 3, 3, 1, 1)
    sch.pack("Y.update", "W", dim=0, factor=8)  # W_packed[k // 8, c, r, s, k % 8], 11 of 16
    prog = sch.program
    assert prog.buffer("W_packed").shape == (2, 3, 3, 3, 8)
    assert prog.loop("W_packed.p4").kind == LoopKind.UNROLL
    assert_computes(prog, comp)


def test_pack_rejects_bad_factors_and_unread_buffers():
    _, sch = build("matmul", 16, 24, 8)
    with pytest.raises(ScheduleError, match=r"a factor of 48 pads dimension 1 \(extent 24\) to "
                                            "more than twice"):
        sch.pack("C.update", "B", dim=1, factor=48)
    with pytest.raises(ScheduleError, match="the factor must be a positive integer, not 0"):
        sch.pack("C.update", "B", dim=1, factor=0)
    with pytest.raises(ScheduleError, match="C.init does not read B"):
        sch.pack("C.init", "B", dim=1, factor=8)


# ---- rfactor -------------------------------------------------------------------------------


def test_rfactor_a_softmax_row_sum_over_two_threads():
    comp, sch = build("softmax", 1, 1000)
    sch.split("S.c", [-1, 64])  # 16 partials, the last one short: 1000 = 15 x 64 + 40
    sch.reorder("S.c.0", "S.i")
    assert sch.rfactor("S.update", "S.c.0") == "S_rf"
    sch.parallel("S.c.0")
    prog = sch.program
    assert prog.buffer("S_rf").shape == (16, 1)
    assert str(prog.block("S.update").indices[0]) == "c // 64"
    assert [n.name for n in prog.loop("S.c.0").body][0] == "S.rf_init.i"
    final = prog.enclosing("S.rf_final")
    assert [lp.name for lp in final] == ["S.rf_final.r", "S.rf_final.i"]
    assert sch.trace[2] == {"op": "rfactor", "args": {"block": "S.update", "loop": "S.c.0"}}
    assert_computes(prog, comp)


def test_rfactor_a_max_reduction_and_replay_its_trace():
    comp, sch = build("softmax", 3, 40)
    sch.split("M.c", [4, 10])
    sch.reorder("M.c.0", "M.i")
    sch.rfactor("M.update", "M.c.0")
    sch.parallel("M.c.0")
    assert_computes(sch.program, comp)
    again = Schedule.replay(naive_program(comp), sch.trace)
    assert again.program.text() == sch.program.text()


def test_rfactor_a_gemv_with_vector_columns():
    comp, sch = build("gemv", 48, 40)
    sch.split("C.k", [2, 20])
    sch.reorder("C.k.0", "C.i", "C.k.1", "C.j")
    sch.rfactor("C.update", "C.k.0")
    sch.parallel("C.k.0")
    sch.split("C.j", [3, 16])
    sch.vectorize("C.j.1")
    assert sch.program.buffer("C_rf").shape == (2, 1, 48)
    assert_computes(sch.program, comp)


def test_rfactor_a_matmul_along_a_whole_reduce_loop():
    comp, sch = build("matmul", 4, 6, 5)
    sch.reorder("C.k", "C.i")
    sch.rfactor("C.update", "C.k")  # one partial per k: C_rf[k, i, j] = A[i, k] * B[k, j]
    assert str(sch.program.block("C.update").indices[0]) == "k"
    assert_computes(sch.program, comp)


def test_rfactor_along_the_lanes_vectorizes_a_row_max_and_sum():
    comp, sch = build("softmax", 1, 1000)
    for stage in ("M", "S"):
        _, lanes = sch.split(f"{stage}.c", [-1, 64])  # 1000 = 15 x 64 + 40: a short last step
        assert sch.rfactor(f"{stage}.update", lanes) == f"{stage}_rf"
        sch.vectorize(lanes)  # each lane accumulates its own partial
    prog = sch.program
    assert prog.buffer("S_rf").shape == (64, 1)
    assert str(prog.block("S.update").indices[0]) == "c % 64"
    roots = [n.name for n in prog.body]
    assert roots[roots.index("S.i") - 1:roots.index("S.i") + 2] == [
        "S.rf_init.r", "S.i", "S.rf_final.r"]
    assert sch.trace[1] == {"op": "rfactor", "args": {"block": "M.update", "loop": "M.c.1"}}
    assert_computes(prog, comp)
    again = Schedule.replay(naive_program(comp), sch.trace)
    assert again.program.text() == prog.text()


def test_rfactor_along_the_lanes_of_several_rows_and_a_gemv():
    comp, sch = build("softmax", 3, 40)
    sch.split("S.c", [5, 8])
    sch.rfactor("S.update", "S.c.1")
    sch.vectorize("S.c.1")
    assert sch.program.buffer("S_rf").shape == (8, 3)
    assert_computes(sch.program, comp)
    comp, sch = build("gemv", 16, 48)
    sch.split("C.k", [-1, 16])
    sch.reorder("C.i", "C.j", "C.k.0", "C.k.1")
    sch.rfactor("C.update", "C.k.1")
    sch.vectorize("C.k.1")  # a dot product per column, 16 lanes of it at a time
    assert_computes(sch.program, comp)


def test_rfactor_along_the_lanes_needs_the_innermost_piece_and_no_early_reader():
    comp, sch = build("softmax", 2, 64)
    sch.split("M.c", [2, 2, 16])
    with pytest.raises(ScheduleError, match="M.c.1 is below the root but not the innermost "
                                            "piece of a split of axis c"):
        sch.rfactor("M.update", "M.c.1")
    with pytest.raises(ScheduleError, match="S.c is below the root but not the innermost"):
        sch.rfactor("S.update", "S.c")  # unsplit: one partial per point is no reduction
    sch = build("softmax", 2, 64)[1]
    sch.fuse("E", at="M.i")  # E reads the row max in M's nest, before the partials are reduced
    sch.split("M.c", [4, 16])
    with pytest.raises(ScheduleError, match="block E reads M before M.rf_final writes it"):
        sch.rfactor("M.update", "M.c.1")


def test_rfactor_needs_an_outer_reduce_piece_at_the_root():
    comp, sch = build("softmax", 2, 64)
    sch.split("S.c", [4, 16])
    with pytest.raises(ScheduleError, match="S.c.0 is below the root but not the innermost"):
        sch.rfactor("S.update", "S.c.0")
    with pytest.raises(ScheduleError, match="S.i binds no reduce axis of S.update"):
        sch.rfactor("S.update", "S.i")
    with pytest.raises(ScheduleError, match="S.update is not under E.i"):
        sch.rfactor("S.update", "E.i")
    with pytest.raises(ScheduleError, match="E is not a sum or max reduction"):
        sch.rfactor("E", "E.i")
    sch2 = build("softmax", 2, 64)[1]
    sch2.split("S.c", [4, 16])
    sch2.reorder("S.c.1", "S.i", "S.c.0")
    with pytest.raises(ScheduleError, match="S.c.1 is an inner piece of axis c"):
        sch2.rfactor("S.update", "S.c.1")
    with pytest.raises(ScheduleError, match="parallel loop S.c.1 binds reduce axis c of block "
                                            "S.update"):
        sch2.parallel("S.c.1")  # without partials the threads would add into one element


def test_rfactor_refuses_huge_partials_and_a_local_tile():
    _, sch = build("matmul", 2048, 2048, 8)
    sch.reorder("C.k", "C.i")
    with pytest.raises(ScheduleError, match="would hold more than"):
        sch.rfactor("C.update", "C.k")
    # A local tile must hold the whole reduction, so no checked schedule has one below an outer
    # reduce loop; an unchecked one (as rule fuzzing builds) is refused by rfactor itself.
    sch = Schedule(naive_program(get_workload("matmul").build(8, 16, 8)), checked=False)
    sch.split("C.k", [2, 4])
    sch.reorder("C.k.0", "C.i")
    sch.cache_write("C.update", "C.k.0")
    with pytest.raises(ScheduleError, match="does not write its stage's buffer C"):
        sch.rfactor("C.update", "C.k.0")


# ---- the hand schedule the backend is measured with ------------------------------------


def hand_schedule(sch: Schedule) -> None:
    """An 8x32 register tile over 32-wide panels of B (the packed matmul of
    docs/ARCHITECTURE.md §17.1)."""
    sch.pack("C.update", "B", dim=1, factor=32)
    sch.split("C.i", [-1, 8])
    sch.split("C.j", [-1, 2, 16])
    sch.reorder("C.j.0", "C.i.0", "C.k", "C.i.1", "C.j.1", "C.j.2")
    sch.fuse("C.init", at="C.i.0")
    sch.cache_write("C.update", at="C.i.0")
    sch.unroll("C.i.1")
    sch.unroll("C.j.1")
    sch.vectorize("C.j.2")
    sch.vectorize("C.init.j.2")
    sch.vectorize("C.write.j.2")
    sch.parallel("C.j.0")


def test_hand_matmul_schedule_at_512_builds_the_register_tile_program():
    _, sch = build("matmul", 512, 512, 512)
    hand_schedule(sch)
    prog = sch.program
    assert prog.buffer("C.local").shape == (8, 2, 16)
    assert [lp.name for lp in prog.enclosing("C.init")] == [
        "C.j.0", "C.i.0", "C.init.i.1", "C.init.j.1", "C.init.j.2"]
    assert [lp.name for lp in prog.enclosing("C.update")] == [
        "C.j.0", "C.i.0", "C.k", "C.i.1", "C.j.1", "C.j.2"]
    assert str(prog.block("C.update").value) == "A[i, k] * B_packed[j // 32, k, j % 32]"


def test_hand_matmul_schedule_computes_matmul_at_a_small_size():
    comp, sch = build("matmul", 16, 64, 8)
    hand_schedule(sch)
    assert_computes(sch.program, comp)


# ---- traces -------------------------------------------------------------------------------


def test_trace_round_trip_replays_to_the_identical_program(tmp_path):
    comp, sch = build("matmul", 512, 512, 512)
    hand_schedule(sch)
    path = tmp_path / "matmul.json"
    save_trace(path, sch.trace, workload="matmul", size=(512, 512, 512))
    steps, meta = load_trace(path)
    assert meta["workload"] == "matmul" and meta["size"] == [512, 512, 512]
    replayed = Schedule.replay(naive_program(comp), steps)
    assert replayed.program.text() == sch.program.text()
    assert replayed.trace == sch.trace


def test_malformed_traces_are_rejected_with_the_problem(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ScheduleError, match="cannot read it as JSON"):
        load_trace(path)
    doc = {"version": 1, "steps": [{"op": "tile", "args": {}}]}
    path.write_text(json.dumps(doc))
    with pytest.raises(ScheduleError, match="step 0: unknown primitive 'tile'"):
        load_trace(path)
    doc["steps"] = [{"op": "split", "args": {"loop": "C.i"}}]
    path.write_text(json.dumps(doc))
    with pytest.raises(ScheduleError, match=r"step 0 \(split\): args must be exactly"):
        load_trace(path)
    _, sch = build("matmul", 16, 24, 8)
    with pytest.raises(ScheduleError, match=r"trace step 0 \(split\): split of C.i"):
        Schedule.replay(sch.program, [{"op": "split", "args": {"loop": "C.i", "factors": [5]}}])


def _step(op: str, **args: object) -> dict:
    return {"version": 1, "workload": "matmul", "steps": [{"op": op, "args": args}]}


@pytest.mark.parametrize("doc, message", [
    # A string where a list belongs was once read as its characters ("C", ".", "i").
    (_step("reorder", loops="C.i"), r"step 0 \(reorder\): loops must be a list of loop names, "
                                    r"got 'C.i'"),
    (_step("reorder", loops=[["C.i"], "C.j"]), "loops must be a list of loop names"),
    (_step("vectorize", loop=["C.j"]), r"loop must be a name \(a string\), got \['C.j'\]"),
    (_step("unroll", loop=None), "loop must be a name"),
    (_step("cache_write", block="C.update", at=["C.i"]), "at must be a name"),
    (_step("pack", block="C.update", buffer=["B"], dim=1, factor=4), "buffer must be a name"),
    (_step("pack", block="C.update", buffer="B", dim="1", factor=4),
     "dim must be an integer, got '1'"),
    (_step("pack", block="C.update", buffer="B", dim=1, factor=4.5),
     "factor must be an integer, got 4.5"),
    (_step("split", loop="C.i", factors=16), "factors must be a list of integers, got 16"),
    (_step("split", loop="C.i", factors=[True, 16]), "factors must be a list of integers"),
    ({"version": 1, "steps": [{"op": ["split"], "args": {}}]}, r"unknown primitive \['split'\]"),
    ({"version": 1, "workload": 5, "steps": []}, "workload must be a workload name, got 5"),
    ({"version": 1, "size": "16", "steps": []}, "size must be a list of integers, got '16'"),
])
def test_a_trace_with_arguments_of_the_wrong_type_is_refused_before_any_step(tmp_path, doc,
                                                                             message):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ScheduleError, match=message):
        load_trace(path)


def test_a_trace_that_cannot_be_read_says_why(tmp_path):
    with pytest.raises(ScheduleError, match=r"cannot read it \(No such file or directory\)"):
        load_trace(tmp_path / "missing.json")
    with pytest.raises(ScheduleError, match=r"cannot read it \(Is a directory\)"):
        load_trace(tmp_path)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ScheduleError, match=r"not UTF-8 text"):
        load_trace(tmp_path / "binary.json")
