"""Blocked sketches: whole channel-vectorized tiles, in the space, that run right."""

import pytest

from eqsched.backend import CompileOptions, compile_program
from eqsched.egraph.saturate import saturate
from eqsched.egraph.space import Space, build_space
from eqsched.egraph.term import vector_lanes
from eqsched.extract import EvolutionarySearch
from eqsched.extract.analytic import AnalyticModel
from eqsched.extract.sketches import _column_counts, blocked_sketches
from eqsched.ir import LoopKind, Scope, naive_program
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.rules import default_rules
from eqsched.workloads import get_workload

# Rows of 10 hold 8-lane vectors but no whole 16-lane register; 32 output channels are two.
CONV = ("conv2d_nchw", (1, 8, 10, 10, 32, 3, 3, 1, 1))




@pytest.fixture(scope="module")
def conv_saturated():
    name, size = CONV
    return saturate(naive_program(get_workload(name).build(*size)), default_rules())


@pytest.fixture(scope="module")
def conv_space(conv_saturated):
    return Space(conv_saturated, vector_lanes(16))


def test_each_sketch_is_in_the_space_and_runs_right(conv_space):
    comp = conv_space.naive.computation
    inputs = random_inputs(comp, 0)
    want = reference(comp, inputs)
    sketches = list(blocked_sketches(conv_space.naive, conv_space.facts, 16))
    assert len(sketches) >= 4
    search = EvolutionarySearch(conv_space, AnalyticModel(), seed=0)
    for term, sizes in sketches:
        assert conv_space.contains(term, sizes)
        prog = search.program_of(term, sizes)
        outputs = compile_program(prog, CompileOptions(threads=1)).run(inputs)
        ok, _, message = compare(outputs, want, tolerance(comp))
        assert ok, message


def test_a_sketch_accumulates_a_channel_vector_tile_with_its_init_inside(conv_space):
    term, sizes = next(blocked_sketches(conv_space.naive, conv_space.facts, 16))
    prog = EvolutionarySearch(conv_space, AnalyticModel(), seed=0).program_of(term, sizes)
    local = [b.name for b in prog.buffers if b.scope == Scope.LOCAL]
    assert local == ["Y.local"]
    update = prog.enclosing("Y.update")
    assert update[-1].kind == LoopKind.VECTOR and update[-1].name.startswith("Y.k.")
    assert update[-1].extent == 16
    # the init fills the tile: no root nest writes Y before the reduction
    assert any(lp.name == "Y.k.1" for lp in prog.enclosing("Y.init"))
    assert "W_packed" in {b.name for b in prog.buffers}


def test_the_first_population_starts_with_the_sketches(conv_space):
    search = EvolutionarySearch(conv_space, AnalyticModel(), seed=0, population=48,
                                generations=1, max_generations=2, first_islands=1)
    seeds = search._blocked_seeds
    assert seeds and all(conv_space.contains(c.term, c.sizes) for c in seeds)
    ranked = search.propose(8)
    vectors = [c.program.enclosing("Y.update")[-1] for c, _ in ranked]
    assert any(lp.kind == LoopKind.VECTOR and lp.name.startswith("Y.k.") for lp in vectors)


def test_a_space_without_blocked_stages_has_no_sketches():
    naive = naive_program(get_workload("matmul").build(64, 64, 64))
    space = build_space(naive, default_rules(), None, vector_lanes(16))
    assert list(blocked_sketches(space.naive, space.facts, 16)) == []


def test_an_avx2_register_makes_8_lane_sketches(conv_saturated):
    space = Space(conv_saturated, vector_lanes(8))
    term, sizes = next(blocked_sketches(space.naive, space.facts, 8))
    assert space.contains(term, sizes)
    assert sizes[("Y.k", "3/4")] == 8  # the lanes of one 256-bit register


def test_a_tile_takes_a_short_row_whole_or_a_piece_of_a_long_one():
    assert 7 in _column_counts(7)  # a late ResNet stage's row, whole
    assert {8, 14, 16} <= set(_column_counts(56)) and 56 not in _column_counts(56)
    assert max(_column_counts(1000)) == 16  # the unrolling limit
