"""Derivations: a (Term, Sizes) becomes a manual trace whose replay is the term's program, and the
program computes what numpy says."""

import json
import sys
from pathlib import Path

import pytest

from eqsched.backend import compile_program
from eqsched.egraph.derive import DeriveError, derive, path_suffix, realize
from eqsched.egraph.encode import encode
from eqsched.egraph.term import BlockRef, Cached, PackRef, PieceLoop, Term, pack_symbol
from eqsched.ir import Program, naive_program
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload, list_workloads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from hand_schedule import packed_register_tile  # noqa: E402


def L(group, path, *body, kind="serial"):  # noqa: N802 - reads like the term it builds
    return PieceLoop(group, path, kind, tuple(body))


def naive(name, *size):
    wl = get_workload(name)
    return naive_program(wl.build(*(size or wl.small_size)))


def assert_matches_reference(prog: Program) -> None:
    comp = prog.computation
    inputs = random_inputs(comp, seed=3)
    outputs = compile_program(prog).run(inputs)
    ok, _, message = compare(outputs, reference(comp, inputs), tolerance(comp))
    assert ok, message


def assert_round_trip(term, sizes, base: Program) -> Program:
    """realize == replay(derive), its encoding is the term, and it computes the reference."""
    trace = derive(term, sizes, base)
    json.dumps(trace)
    prog = realize(term, sizes, base)
    assert Schedule.replay(base, trace).program.text() == prog.text()
    got_term, got_sizes = encode(prog)
    assert got_term == term
    assert {k: got_sizes[k] for k in sizes if k in got_sizes} == sizes
    assert_matches_reference(prog)
    return prog


def test_piece_paths_name_loop_suffixes():
    assert path_suffix("") == "" and path_suffix("1/4.0/2") == ".1.0"


@pytest.mark.parametrize("workload", list_workloads(), ids=lambda w: w.name)
def test_every_naive_program_is_its_own_empty_derivation(workload):
    base = naive(workload.name)
    term, sizes = encode(base)
    assert derive(term, sizes, base) == []
    assert realize(term, sizes, base).text() == base.text()


def test_hand_matmul_schedule_round_trips_to_the_identical_program():
    base = naive("matmul", 64, 64, 64)
    sch = Schedule(base)
    packed_register_tile(sch)
    term, sizes = encode(sch.program)
    trace = derive(term, sizes, base)
    assert [s["op"] for s in trace][-2:] == ["cache_write", "pack"]
    assert realize(term, sizes, base).text() == sch.program.text()
    assert_matches_reference(sch.program)


def ssrsrs_matmul():
    """Ansor's i0 j0 i1 j1 k0 i2 j2 k1 i3 j3 with the init fused at j1 and the tile cached there;
    the init's own loops in another order than the update's, one piece of extent 1."""
    init = L("C.i", "2/4", L("C.i", "3/4", L("C.j", "2/4", L(
        "C.j", "3/4", BlockRef("C.init"), kind="vector"))))
    update = L("C.k", "0/2", L("C.i", "2/4", L("C.j", "2/4", L("C.k", "1/2", L(
        "C.i", "3/4", L("C.j", "3/4", BlockRef("C.update"), kind="vector"), kind="unroll")))))
    body = L("C.i", "0/4", L("C.j", "0/4", L("C.i", "1/4", L(
        "C.j", "1/4", Cached("C", (init, update))))), kind="parallel")
    sizes = {("C.i", f"{n}/4"): e for n, e in enumerate((2, 1, 2, 4))}
    sizes |= {("C.j", f"{n}/4"): e for n, e in enumerate((1, 3, 1, 8))}
    sizes |= {("C.k", "0/2"): 2, ("C.k", "1/2"): 4, pack_symbol("B"): 8}
    return Term((body,), packs=(PackRef("C.update", "B", 1),)), sizes


def test_ssrsrs_matmul_with_fused_init_cached_tile_and_packing():
    term, sizes = ssrsrs_matmul()
    prog = assert_round_trip(term, sizes, naive("matmul", 16, 24, 8))
    assert "alloc C.local" in prog.text() and "B_packed" in prog.text()
    assert "for C.init.j.3 in vectorized(8)" in prog.text()


def mm_exp_mm_sizes():
    return {("C.i", ""): 8, ("C.i", "0/2"): 2, ("C.i", "1/2"): 4, ("C.j", ""): 12,
            ("C.j", "0/2"): 3, ("C.j", "1/2"): 4, ("C.k", ""): 6, ("F.j", ""): 10}


def test_mm_exp_mm_with_exp_fused_into_the_matmul_tiles():
    c = L("C.i", "0/2", L("C.j", "0/2",
                          L("C.i", "1/2", L("C.j", "1/2", BlockRef("C.init"))),
                          L("C.k", "", L("C.i", "1/2", L("C.j", "1/2", BlockRef("C.update")))),
                          L("C.j", "1/2", L("C.i", "1/2", BlockRef("D"), kind="unroll"))))
    f_init = L("C.i", "", L("F.j", "", BlockRef("F.init")))
    f_update = L("C.i", "", L("F.j", "", L("C.j", "", BlockRef("F.update"))))
    assert_round_trip(Term((c, f_init, f_update)), mm_exp_mm_sizes(), naive("mm_exp_mm"))


def test_mm_exp_mm_with_exp_computed_at_the_rows_of_the_second_matmul():
    c_init = L("C.i", "", L("C.j", "", BlockRef("C.init")))
    c_update = L("C.i", "", L("C.j", "", L("C.k", "", BlockRef("C.update"))))
    f = L("C.i", "", L("C.j", "", BlockRef("D")), L("F.j", "", BlockRef("F.init")),
          L("C.j", "", L("F.j", "", BlockRef("F.update"))))
    sizes = {("C.i", ""): 8, ("C.j", ""): 12, ("C.k", ""): 6, ("F.j", ""): 10}
    assert_round_trip(Term((c_init, c_update, f)), sizes, naive("mm_exp_mm"))


def test_a_chain_whose_first_host_needs_an_illegal_step_is_built_as_its_trace_replays():
    # Around C.update, F.update would be fused before F.init (it reads F before anything writes
    # it), which only the checked derivation refuses: the fast path must refuse it too and build
    # around F.update, or its loops are named apart from the trace's and the candidate's trace
    # replays to another program (mm_exp_mm explorations lost nearly every candidate that way).
    c_init = L("C.i", "", L("C.j", "", BlockRef("C.init")))
    rows = L("C.i", "0/2",
             L("C.i", "1/2", L("C.j", "", L("C.k", "", BlockRef("C.update"))),
               L("C.j", "", BlockRef("D"))),
             L("C.i", "1/2", L("F.j", "", BlockRef("F.init")),
               L("C.j", "", L("F.j", "", BlockRef("F.update")))))
    sizes = {("C.i", "0/2"): 2, ("C.i", "1/2"): 4, ("C.j", ""): 12, ("C.k", ""): 6,
             ("F.j", ""): 10}
    prog = assert_round_trip(Term((c_init, rows)), sizes, naive("mm_exp_mm"))
    assert "F.i.0" in prog.text()  # the rows' loops are F.update's


def test_conv2d_with_the_padding_stage_inlined():
    y = L("Xpad.n", "", L("Y.k", "", L(
        "Y.p", "0/2",
        L("Y.p", "1/2", L("Y.q", "", BlockRef("Y.init"), kind="unroll")),
        L("Xpad.c", "", L("Y.ry", "", L("Y.rx", "", L("Y.p", "1/2", L(
            "Y.q", "", BlockRef("Y.update"), kind="unroll"))))))))
    sizes = {("Xpad.n", ""): 1, ("Y.k", ""): 4, ("Y.p", "0/2"): 7, ("Y.p", "1/2"): 1,
             ("Y.q", ""): 6, ("Xpad.c", ""): 3, ("Y.ry", ""): 3, ("Y.rx", ""): 3}
    prog = assert_round_trip(Term((y,), inlined=("Xpad",)), sizes, naive("conv2d_nchw"))
    assert "Xpad" not in prog.text()


def softmax_row(*stmts):
    return Term((L("M.i", "", *stmts),))


SOFTMAX_SIZES = {("M.i", ""): 5, ("M.c", ""): 17, ("E.j", ""): 17}


def test_softmax_with_every_stage_fused_into_one_row_loop_in_program_order():
    term = softmax_row(BlockRef("M.init"), L("M.c", "", BlockRef("M.update")),
                       L("E.j", "", BlockRef("E")), BlockRef("S.init"),
                       L("E.j", "", BlockRef("S.update")), L("E.j", "", BlockRef("Y")))
    prog = assert_round_trip(term, SOFTMAX_SIZES, naive("softmax"))
    assert prog.body[0].name == "S.i"  # built around S.update: S.init must precede it


def test_softmax_producers_fuse_in_first_wherever_the_term_starts_the_row():
    term = softmax_row(BlockRef("S.init"), BlockRef("M.init"), L("M.c", "", BlockRef("M.update")),
                       L("E.j", "", BlockRef("E")), L("E.j", "", BlockRef("S.update")),
                       L("E.j", "", BlockRef("Y")))
    trace = derive(term, SOFTMAX_SIZES, naive("softmax"))
    assert [s["args"]["block"] for s in trace] == ["E", "M.update", "M.init", "S.init", "Y"]


def test_terms_the_manual_api_cannot_state_are_refused_by_name():
    update = L("C.i", "", L("C.j", "", L("C.k", "", BlockRef("C.update"))))
    init = L("C.i", "", L("C.j", "", BlockRef("C.init")))
    with pytest.raises(DeriveError, match=r"the manual API builds C.i\[\]\{C.j\[\]\{C.init"):
        derive(Term((update, init)), {}, naive("matmul"))  # root nests keep program order
    shared = L("C.i", "", L("C.j", "", BlockRef("C.init")),
               Cached("C", (L("C.j", "", L("C.k", "", BlockRef("C.update"))),)))
    with pytest.raises(DeriveError, match="cached:C: cache_write needs a loop whose only child"):
        derive(Term((shared,)), {}, naive("matmul"))


def test_a_term_with_a_missing_size_or_block_is_refused():
    term, sizes = ssrsrs_matmul()
    del sizes[("C.k", "1/2")]
    with pytest.raises(DeriveError, match=r"no size for piece \('C.k', '1/2'\)"):
        derive(term, sizes, naive("matmul", 16, 24, 8))
    with pytest.raises(DeriveError, match="term blocks"):
        derive(Term((L("C.i", "", L("C.j", "", BlockRef("C.init"))),)), {}, naive("matmul"))


def test_a_piece_split_further_takes_the_product_of_its_pieces_sizes():
    init = L("C.i", "", L("C.j", "", BlockRef("C.init")))
    update = L("C.i", "", L("C.j", "", L("C.k", "0/2", L("C.k", "1/2.0/2", L(
        "C.k", "1/2.1/2", BlockRef("C.update"))))))
    sizes = {("C.i", ""): 16, ("C.j", ""): 24, ("C.k", "0/2"): 2, ("C.k", "1/2.0/2"): 2,
             ("C.k", "1/2.1/2"): 2}
    trace = derive(Term((init, update)), sizes, naive("matmul"))
    assert trace[:2] == [{"op": "split", "args": {"loop": "C.k", "factors": [2, 4]}},
                         {"op": "split", "args": {"loop": "C.k.1", "factors": [2, 2]}}]
