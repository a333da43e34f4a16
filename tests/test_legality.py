"""Legality facts (accesses as affine functions of loops, producers/consumers) and check_program on
hand-broken programs: each mistake a schedule could make is named in the error."""

from dataclasses import replace

import pytest

from eqsched.affine import Affine
from eqsched.expr import Load, Var
from eqsched.ir import Alloc, Binding, Block, Loop, LoopKind, Program, map_nodes, naive_program
from eqsched.legality import (
    MAX_UNROLL,
    ScheduleError,
    accesses,
    address_coeff,
    check_program,
    loop_binding,
    readers,
    reduce_loops,
    sites,
    writers,
)
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload, list_workloads


def naive(name: str, *size: int) -> Program:
    return naive_program(get_workload(name).build(*size))


def rebind(prog: Program, block: str, axis: str, terms: tuple) -> Program:
    def fix(n):
        if isinstance(n, Block) and n.name == block:
            binds = tuple(Binding(b.axis, terms) if b.axis == axis else b for b in n.bindings)
            return replace(n, bindings=binds)
        return None

    return prog.with_body(map_nodes(prog.body, fix))


def with_loop_body(prog: Program, loop: str, body: tuple) -> Program:
    return prog.with_body(map_nodes(
        prog.body, lambda n: replace(n, body=body) if isinstance(n, Loop) and n.name == loop
        else None))


# ---- facts --------------------------------------------------------------------------------


@pytest.mark.parametrize("wl", list_workloads(), ids=lambda w: w.name)
def test_naive_programs_of_every_workload_are_legal(wl):
    check_program(naive_program(wl.build(*wl.small_size)))


def test_accesses_are_affine_in_the_loops_after_split_and_pack():
    sch = Schedule(naive("matmul", 16, 64, 8))
    sch.pack("C.update", "B", dim=1, factor=32)
    sch.split("C.j", [2, 2, 16])
    site = sites(sch.program)["C.update"]
    store, acc, a, b = accesses(site)
    assert store.write and store.buffer == "C" and not acc.write
    assert store.indices == (Affine.of({"C.i": 1}),
                             Affine.of({"C.j.0": 32, "C.j.1": 16, "C.j.2": 1}))
    assert b.buffer == "B_packed"
    assert b.indices == (Affine.of({"C.j.0": 1}), Affine.of({"C.k": 1}),
                         Affine.of({"C.j.1": 16, "C.j.2": 1}))
    assert address_coeff(b, (2, 8, 32), "C.j.2") == 1
    assert address_coeff(a, (16, 8), "C.k") == 1 and address_coeff(a, (16, 8), "C.i") == 8


def test_a_padded_pack_copies_each_column_once_and_a_wider_panel_loop_is_refused():
    sch = Schedule(naive("matmul", 4, 13, 3))
    sch.pack("C.update", "B", dim=1, factor=8)  # 2 panels of 8 hold 13 columns
    prog = sch.program
    store, source = accesses(sites(prog)["B_packed"])
    assert store.indices == (Affine.of({"B_packed.p0": 1}), Affine.of({"B_packed.p1": 1}),
                             Affine.of({"B_packed.p2": 1}))
    assert source.indices == (Affine.of({"B_packed.p1": 1}),
                              Affine.of({"B_packed.p0": 8, "B_packed.p2": 1}))
    assert store.axis_bounds == ((0, 1), (0, 2), (0, 7))  # columns 0..12 of the axis q
    # A third panel would be all pad: the copy's panel loop may overshoot by less than a step.
    wider = prog.replacing_loop("B_packed.p0", (replace(prog.loop("B_packed.p0"), extent=3),))
    with pytest.raises(ScheduleError, match=r"loops of axis q cover 0..23, not 0..12"):
        check_program(wider)


def test_producers_consumers_and_loop_roles():
    prog = naive("mm_exp_mm", 8, 6, 12, 10)
    assert writers(prog)["C"] == ["C.init", "C.update"]
    assert readers(prog)["C"] == ["C.update", "D"]
    assert readers(prog)["D"] == ["F.update"]
    update = prog.block("C.update")
    assert loop_binding(update, "C.k") == ("k", 1)
    assert loop_binding(update, "D.i") is None
    assert reduce_loops(update) == {"C.k"}
    assert reduce_loops(prog.block("D")) == set()
    assert [s for s in sites(prog)] == ["C.init", "C.update", "D", "F.init", "F.update"]


# ---- structure and bindings ---------------------------------------------------------------


def test_duplicate_loop_names_are_rejected():
    prog = naive("matmul", 4, 4, 4)
    with pytest.raises(ScheduleError, match="the name C.init.i is used by two loops/blocks"):
        check_program(prog.with_body(prog.body[:1] + prog.body))


def test_binding_must_use_enclosing_loops():
    prog = rebind(naive("matmul", 4, 4, 4), "C.update", "i", (("C.init.i", 1),))
    with pytest.raises(ScheduleError, match="binds i to C.init.i, which is not a loop around it"):
        check_program(prog)


def test_pieces_of_an_axis_must_form_a_mixed_radix_number():
    sch = Schedule(naive("matmul", 8, 4, 4))
    sch.split("C.i", [2, 4])
    prog = rebind(sch.program, "C.update", "i", (("C.i.0", 2), ("C.i.1", 1)))
    with pytest.raises(ScheduleError, match="loop C.i.0 has stride 2 in axis i, expected 4"):
        check_program(prog)
    prog = rebind(sch.program, "C.update", "i", (("C.i.1", 1),))
    with pytest.raises(ScheduleError, match="loops of axis i cover 0..3, not 0..7"):
        check_program(prog)


def test_only_the_outermost_piece_may_overshoot_and_by_less_than_one_step():
    sch = Schedule(naive("matmul", 7, 4, 4))
    sch.split("C.i", [2, 4])  # 8 > 7: the guard i < 7 skips one point
    check_program(sch.program)
    loose = rebind(sch.program, "C.update", "i", (("C.i.0", 8), ("C.i.1", 1)))
    with pytest.raises(ScheduleError, match="C.i.0 has stride 8 in axis i, expected 4"):
        check_program(loose)

    def shrink(n):  # the same loops over an axis of 3: their second step of 4 would be empty
        if isinstance(n, Block) and n.name == "C.update":
            return replace(n, axes=tuple(replace(a, extent=3) if a.name == "i" else a
                                         for a in n.axes))
        return None

    wide = sch.program.with_body(map_nodes(sch.program.body, shrink))
    with pytest.raises(ScheduleError, match="loops of axis i cover 0..7, not 0..2"):
        check_program(wide)


def test_a_remainder_reads_only_what_exists():
    # The update's loops reach C[7, ...], which is not there; the guard keeps it from running, so
    # the update reads only the rows the init wrote.
    sch = Schedule(naive("matmul", 7, 4, 4))
    sch.split("C.i", [2, 4])
    update = accesses(sites(sch.program)["C.update"])[0]
    assert update.indices[0].bounds({"C.i.0": (0, 1), "C.i.1": (0, 3)}) == (0, 7)
    assert update.axis_bounds[0] == (0, 6)
    check_program(sch.program)


def test_an_accumulation_under_a_loop_it_does_not_bind_would_repeat():
    prog = naive("matmul", 4, 4, 4)
    twice = Loop("R", 2, LoopKind.SERIAL, prog.body[1:])
    with pytest.raises(ScheduleError, match="C.update is under loop R that binds none"):
        check_program(prog.with_body(prog.body[:1] + (twice,)))


# ---- dependences --------------------------------------------------------------------------


def test_a_consumer_before_its_producer_is_rejected():
    prog = naive("mm_exp_mm", 8, 6, 12, 10)
    init, update, d = prog.body[:3]
    with pytest.raises(ScheduleError, match="block D reads C before C.update writes it"):
        check_program(prog.with_body((init, d, update) + prog.body[3:]))


def test_an_update_before_its_init_is_rejected():
    prog = naive("matmul", 4, 4, 4)
    with pytest.raises(ScheduleError, match="C.update reads C before any other block writes it"):
        check_program(prog.with_body(prog.body[::-1]))


def test_an_init_inside_the_reduction_would_reset_the_sum():
    prog = naive("matmul", 4, 4, 4)
    init = rebind(rebind(prog, "C.init", "i", (("C.i", 1),)), "C.init", "j", (("C.j", 1),))
    init_blk = init.block("C.init")
    k_loop = prog.loop("C.k")
    body = with_loop_body(prog, "C.k", (init_blk,) + k_loop.body).body[1:]
    with pytest.raises(ScheduleError, match="C.init is under C.k, a reduce loop of C.update"):
        check_program(prog.with_body(body))


def nest_inside(prog: Program, consumer: str, loop: str, bindings: dict) -> Program:
    """Move `consumer`'s block (rebound) to the end of `loop`'s body, dropping its own nest."""
    blk = prog.block(consumer)
    blk = replace(blk, bindings=tuple(Binding(a, t) for a, t in bindings.items()))
    root = next(n for n in prog.body if isinstance(n, Loop) and n.name.startswith(consumer + "."))
    body = tuple(n for n in prog.body if n is not root)
    return with_loop_body(prog.with_body(body), loop, prog.loop(loop).body + (blk,))


def test_reading_a_partial_sum_is_rejected():
    prog = nest_inside(naive("mm_exp_mm", 8, 6, 12, 10), "D", "C.k",
                       {"i": (("C.i", 1),), "j": (("C.j", 1),)})
    with pytest.raises(ScheduleError, match="D reads C inside C.update's reduce loop C.k"):
        check_program(prog)


def two_stage(read) -> Program:
    """C = A + 1, then D[i, j] = 2 * C[read(i, j)] (both 4x4)."""
    from eqsched.te import Computation, compute, placeholder

    A = placeholder((4, 4), "A")
    C = compute((4, 4), lambda i, j: A[i, j] + 1.0, "C")
    D = compute((4, 4), lambda i, j: C[read(i, j)] * 2.0, "D")
    return naive_program(Computation("two_stage", [D]))


def test_a_consumer_reading_another_iterations_result_is_rejected():
    prog = nest_inside(two_stage(lambda i, j: (j, i)), "D", "C.i",
                       {"i": (("C.i", 1),), "j": (("D.j", 1),)})
    inner = prog.loop("C.i").body
    prog = with_loop_body(prog, "C.i", inner[:1] + (Loop("D.j", 4, LoopKind.SERIAL, inner[1:]),))
    with pytest.raises(ScheduleError, match="dimension 0 moves 0 vs 1 per step of shared loop"):
        check_program(prog)


def test_a_consumer_reading_past_what_this_iteration_wrote_is_rejected():
    prog = nest_inside(two_stage(lambda i, j: (i, j)), "D", "C.j",
                       {"i": (("C.i", 1),), "j": (("C.j", 1),)})
    check_program(prog)  # D[i, j] reads C[i, j] right after it is written
    neighbour = Load("C", (Var("i"), Var("j") + 1))
    prog = prog.with_body(map_nodes(prog.body, lambda n: replace(n, value=neighbour * 2.0)
                                    if isinstance(n, Block) and n.name == "D" else None))
    with pytest.raises(ScheduleError, match=r"D reads C dimension 1 in \[1, 1\] per iteration "
                                            r"of C.j, but C writes only \[0, 0\]"):
        check_program(prog)


# ---- loop kinds and locals ----------------------------------------------------------------


def test_loop_kind_rules():
    prog = naive("matmul", 4, 4, 96)
    kinds = {"C.k": LoopKind.UNROLL}
    annotated = prog.with_body(map_nodes(
        prog.body, lambda n: replace(n, kind=kinds[n.name]) if isinstance(n, Loop)
        and n.name in kinds else None))
    with pytest.raises(ScheduleError, match=f"unrolled loop C.k has extent 96 > {MAX_UNROLL}"):
        check_program(annotated)
    kinds = {"C.init.j": LoopKind.PARALLEL}
    annotated = prog.with_body(map_nodes(
        prog.body, lambda n: replace(n, kind=kinds[n.name]) if isinstance(n, Loop)
        and n.name in kinds else None))
    with pytest.raises(ScheduleError, match="parallel loop C.init.j is not at the root"):
        check_program(annotated)


def test_local_buffers_are_only_accessed_inside_their_alloc():
    sch = Schedule(naive("matmul", 4, 4, 4))
    sch.fuse("C.init", at="C.i")
    sch.cache_write("C.update", at="C.i")
    prog = sch.program
    alloc = prog.loop("C.i").body[0]
    assert isinstance(alloc, Alloc)
    unwrapped = with_loop_body(prog, "C.i", alloc.body)
    with pytest.raises(ScheduleError, match="C.init accesses local C.local outside its alloc"):
        check_program(unwrapped)
