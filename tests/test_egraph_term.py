"""Terms: structure apart from sizes, symbols, paths, and their egglog form."""

import json

import pytest
from egglog import EGraph

from eqsched.egraph.lang import SERIALIZED_OPS, root_expr
from eqsched.egraph.term import (
    VECTOR_LANES,
    BlockRef,
    Cached,
    PackRef,
    PieceLoop,
    Term,
    extent_allowed,
    pack_factors,
    pack_symbol,
    parent_path,
    remainder_tiles,
    show,
    split_path,
    symbols,
    vector_lanes,
)

TILED = Term(
    (PieceLoop("C.i", "0/2", "serial", (
        PieceLoop("C.i", "1/2", "unroll", (
            Cached("C", (PieceLoop("C.j", "", "vector", (BlockRef("C.update"),)),)),)),)),),
    inlined=("D",),
    packs=(PackRef("C.update", "B", 1),),
)


def test_paths_name_pieces_by_the_splits_that_made_them():
    assert split_path("", 1, 4) == "1/4"
    assert split_path("1/4", 0, 2) == "1/4.0/2"
    assert parent_path("1/4.0/2") == ("1/4", 0, 2)
    assert parent_path("3/4") == ("", 3, 4)


def test_symbols_and_compact_text():
    assert symbols(TILED) == {("C.i", "0/2"), ("C.i", "1/2"), ("C.j", ""), pack_symbol("B")}
    assert show(TILED) == ("C.i[0/2]{C.i[1/2]@unroll{cached:C{C.j[]@vector{C.update}}}}"
                           " ; inline:D ; pack:C.update:B:1")


def test_kinds_constrain_extents():
    assert extent_allowed("vector", 16) and not extent_allowed("vector", 12)
    assert extent_allowed("unroll", 16) and not extent_allowed("unroll", 17)
    assert extent_allowed("serial", 1000)


def test_vector_lanes_run_from_half_a_register_to_four():
    assert vector_lanes(16) == VECTOR_LANES == (8, 16, 32, 64)  # 512-bit registers
    assert vector_lanes(8) == (4, 8, 16, 32)  # 256-bit (AVX2)
    assert extent_allowed("vector", 4, vector_lanes(8)) and not extent_allowed("vector", 64,
                                                                               vector_lanes(8))
    with pytest.raises(ValueError, match="power of two"):
        vector_lanes(12)


def test_egglog_form_uses_only_known_operators():
    eg = EGraph()
    eg.register(root_expr(TILED))
    nodes = json.loads(eg._serialize().to_json())["nodes"].values()
    ops = {n["op"] for n in nodes if not n["op"].startswith('"') and not n["op"].isdigit()}
    assert ops <= set(SERIALIZED_OPS)
    assert {"Root.packed", "Root.inlined", "cached", "loop", "block"} <= ops


def test_pack_factors_are_the_divisors_and_the_padded_vector_tiles():
    assert pack_factors(16) == (2, 4, 8, 16)  # a power of two is never padded
    assert pack_factors(12) == (2, 3, 4, 6, 8, 12, 16)
    assert pack_factors(127) == (8, 16, 32, 64, 127, 128)
    assert {16, 32, 64}.issubset(pack_factors(1000)) and 48 not in pack_factors(1000)


def test_remainder_tiles_add_register_tiles_that_leave_two_steps_or_more():
    # 64 output channels in rows of six accumulators: 10 whole steps and one of 4. Three
    # vectors across (12, 24, ...) only where the extent is no power of two.
    assert remainder_tiles(64) == (3, 5, 6, 7)
    assert remainder_tiles(56) == (3, 5, 6, 12, 16, 24, 32, 64)  # 7 divides 56
    assert remainder_tiles(512) == (3, 5, 6, 7)
    assert remainder_tiles(7) == (3, 8)
    assert remainder_tiles(5) == (8,) and remainder_tiles(3) == ()  # small loops stay whole
    assert 6 not in pack_factors(64)  # six rows are no panel a vector reads whole
