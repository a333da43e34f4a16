"""Encoding programs as (Term, Sizes): loops become pieces of dimension groups, tiles and packs
become Cached and PackRef, and programs outside the vocabulary are refused by name."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from eqsched.egraph.derive import derive
from eqsched.egraph.encode import EncodeError, encode, parse_loop
from eqsched.egraph.term import (
    BlockRef,
    Cached,
    PackRef,
    PieceLoop,
    RfactorLoop,
    Term,
    pack_symbol,
    show,
    symbols,
)
from eqsched.ir import naive_program
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from hand_schedule import packed_register_tile  # noqa: E402


def matmul(m=16, n=24, k=8):
    return naive_program(get_workload("matmul").build(m, n, k))


def test_naive_matmul_is_one_nest_per_block_with_whole_extents():
    term, sizes = encode(matmul())
    assert show(term) == "C.i[]{C.j[]{C.init}} ; C.i[]{C.j[]{C.k[]{C.update}}}"
    assert sizes == {("C.i", ""): 16, ("C.j", ""): 24, ("C.k", ""): 8}


def test_loop_names_parse_into_their_naive_loop_and_pieces():
    bases = {"C.i", "C.init.i"}
    assert parse_loop("C.init.i.1.0", bases) == ("C.init.i", (1, 0))
    assert parse_loop("C.i", bases) == ("C.i", ())
    assert parse_loop("C.write.i.1", bases) is None


def test_nested_splits_give_nested_paths_with_the_arity_of_each_level():
    sch = Schedule(matmul())
    sch.split("C.i", [2, 4, 2])
    sch.split("C.i.1", [2, 2])
    term, sizes = encode(sch.program)
    update_loops = show(Term(term.body[1:]))
    assert update_loops.startswith("C.i[0/3]{C.i[1/3.0/2]{C.i[1/3.1/2]{C.i[2/3]{")
    assert sizes[("C.i", "1/3.1/2")] == 2 and sizes[("C.i", "2/3")] == 2


def test_hand_schedule_is_a_cached_packed_tile_with_vector_and_unroll_kinds():
    sch = Schedule(matmul(64, 64, 64))
    packed_register_tile(sch)
    term, sizes = encode(sch.program)
    assert term.packs == (PackRef("C.update", "B", 1),) and sizes[pack_symbol("B")] == 32
    (outer,) = term.body
    assert (outer.group, outer.path) == ("C.j", "0/3")
    (tile_loop,) = outer.body
    (cached,) = tile_loop.body
    assert isinstance(cached, Cached) and cached.stage == "C"
    init, update = cached.body  # the C.write copy nest is implied by Cached
    assert init == PieceLoop("C.i", "1/2", "unroll", (PieceLoop("C.j", "1/3", "unroll", (
        PieceLoop("C.j", "2/3", "vector", (BlockRef("C.init"),)),)),))
    assert (update.group, update.path) == ("C.k", "")
    assert symbols(term) == set(sizes)
    assert sizes[("C.j", "2/3")] == 16 and sizes[("C.i", "1/2")] == 8


def test_a_padded_pack_encodes_its_factor_and_the_dimension_it_packs():
    sch = Schedule(matmul(8, 20, 4))
    sch.pack("C.update", "B", dim=1, factor=16)  # 20 columns in 2 panels of 16
    term, sizes = encode(sch.program)
    assert term.packs == (PackRef("C.update", "B", 1),) and sizes[pack_symbol("B")] == 16
    assert symbols(term) == set(sizes)


def test_fused_consumer_shares_the_producer_pieces_and_inlined_stages_are_listed():
    naive = naive_program(get_workload("mm_exp_mm").build(8, 6, 12, 10))
    sch = Schedule(naive)
    sch.split("C.i", [2, 4])
    sch.fuse("D", at="C.i.0")
    term, sizes = encode(sch.program)
    assert show(Term(term.body[1:2])) == ("C.i[0/2]{C.i[1/2]{C.j[]{C.k[]{C.update}}} ; "
                                          "C.i[1/2]{C.j[]{D}}}")
    sch2 = Schedule(naive)
    sch2.inline("D")
    assert encode(sch2.program)[0].inlined == ("D",)


def test_an_rfactored_reduction_is_an_rfactor_loop_without_its_init_and_final_nests():
    naive = naive_program(get_workload("gemv").build(32, 40))
    sch = Schedule(naive)
    sch.split("C.k", [4, 10])
    sch.reorder("C.k.0", "C.i")
    sch.rfactor("C.update", "C.k.0")
    sch.parallel("C.k.0")
    term, sizes = encode(sch.program)
    assert show(term) == ("C.i[]{C.j[]{C.init}} ; "
                          "C.k[0/2]@parallel@rfactor{C.j[]{C.i[]{C.k[1/2]{C.update}}}}")
    assert isinstance(term.body[1], RfactorLoop)
    assert sizes[("C.k", "0/2")] == 4 and sizes[("C.k", "1/2")] == 10
    steps = derive(term, sizes, naive)
    assert Schedule.replay(naive, steps).program.text() == sch.program.text()


def test_a_reduction_rfactored_along_lanes_is_a_vector_rfactor_loop_below_the_root():
    naive = naive_program(get_workload("softmax").build(1, 1000))
    sch = Schedule(naive)
    _, lanes = sch.split("S.c", [-1, 64])
    sch.rfactor("S.update", lanes)
    sch.vectorize(lanes)
    term, sizes = encode(sch.program)
    # the partial init and final nests around S's root nest are implied
    assert show(Term(term.body[3:5])) == ("M.i[]{S.init} ; "
                                          "M.i[]{E.j[0/2]{E.j[1/2]@vector@rfactor{S.update}}}")
    assert isinstance(term.body[4].body[0].body[0], RfactorLoop)
    assert sizes[("E.j", "0/2")] == 16 and sizes[("E.j", "1/2")] == 64
    steps = derive(term, sizes, naive)
    assert Schedule.replay(naive, steps).program.text() == sch.program.text()


def test_one_symbol_with_two_extents_is_refused():
    sch = Schedule(matmul())
    sch.split("C.i", [2, 8])
    sch.split("C.init.i", [4, 4])  # C.i[0/2] would be 4 in the init and 2 in the update
    with pytest.raises(EncodeError, match=r"loop C.i.0: extent 2, but \('C.i', '0/2'\) is 4"):
        encode(sch.program)


def test_a_loop_that_is_no_piece_of_a_naive_loop_is_refused_by_name():
    prog = matmul()
    renamed = replace(prog.body[0], name="C.tile")
    with pytest.raises(EncodeError, match="loop C.tile: not a piece of a naive loop"):
        encode(prog.with_body((renamed,) + prog.body[1:]))


def test_a_tile_that_copies_in_its_accumulator_drops_both_copy_nests():
    # No init inside the tile: cache_write adds a C.read nest (local = C) besides C.write.
    sch = Schedule(matmul())
    sch.split("C.j", [-1, 8])
    sch.reorder("C.i", "C.j.0", "C.k", "C.j.1")
    sch.cache_write("C.update", at="C.j.0")
    assert "C.read" in sch.program.text()
    term, sizes = encode(sch.program)
    assert show(term) == ("C.i[]{C.j[]{C.init}} ; "
                          "C.i[]{C.j[0/2]{cached:C{C.k[]{C.j[1/2]{C.update}}}}}")
    assert sizes[("C.j", "1/2")] == 8
