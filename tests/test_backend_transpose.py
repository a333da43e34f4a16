"""Transposing pack copies lowered as register-tile transposes (eqsched/backend/transpose.py)."""

from __future__ import annotations

import pytest

from eqsched.backend import CompileOptions, compile_program
from eqsched.backend.lower import lower
from eqsched.backend.transpose import transposing_copy
from eqsched.ir import naive_program
from eqsched.reference import compare, random_inputs, reference, tolerance
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload


def packed(workload: str, size: tuple[int, ...], block: str, buffer: str, dim: int,
           factor: int) -> Schedule:
    sch = Schedule(naive_program(get_workload(workload).build(*size)))
    sch.pack(block, buffer, dim, factor)
    return sch


def copy_of(sch: Schedule, lanes: int = 16):
    root = next(n for n in sch.program.body
                if getattr(n, "name", "").rpartition(".")[0].endswith("_packed"))
    return transposing_copy(root, sch.program, lanes)


def assert_computes_the_reference(sch: Schedule, threads: int = 1) -> None:
    prog = sch.program
    comp = prog.computation
    inputs = random_inputs(comp, seed=7)
    got = compile_program(prog, CompileOptions(threads=threads)).run(inputs)
    ok, _, msg = compare(got, reference(comp, inputs), tolerance(comp))
    assert ok, msg


@pytest.mark.parametrize("size, factor, tile", [
    ((2, 32, 5, 5, 48, 3, 3, 1, 1), 16, 16),   # W[k, c, r, s] along k, 16-wide panels
    ((1, 8, 5, 5, 64, 3, 3, 1, 1), 32, 16),    # two tiles per panel
    ((1, 3, 6, 6, 16, 3, 3, 1, 1), 8, 8),      # panels narrower than a register
    ((1, 2, 6, 6, 24, 3, 3, 1, 1), 12, 4),     # 12-wide panels in 4 x 4 tiles
    ((1, 2, 6, 6, 20, 3, 3, 1, 1), 5, 4),      # 5-wide panels: no power-of-two tile divides
    ((1, 1, 6, 6, 24, 1, 1, 1, 0), 12, 4),     # rest = 1: too short a run to tile
])
def test_a_convolutions_weight_packed_along_k_is_copied_in_tiles(size, factor, tile):
    sch = packed("conv2d_nchw", size, "Y.update", "W", 0, factor)
    copy = copy_of(sch)
    rest = size[1] * size[5] * size[6]
    if rest < tile or factor % tile:
        assert copy is None  # copied as written
    else:
        assert (copy.factor, copy.tile, copy.rest, copy.outer) == (factor, tile, rest, 1)
        assert "shufflevector" in str(lower(sch.program, "", "")[0])
    assert_computes_the_reference(sch)


def test_columns_past_the_last_whole_tile_are_copied_one_by_one():
    # 20 columns of B[k, j] packed along k: one 16-wide tile and 4 single columns per panel.
    sch = packed("matmul", (6, 20, 32), "C.update", "B", 0, 16)
    assert copy_of(sch).rest == 20
    assert_computes_the_reference(sch)


def test_dimensions_before_the_packed_one_are_an_outer_loop():
    sch = packed("batch_matmul", (3, 8, 24, 32), "C.update", "B", 1, 8)
    copy = copy_of(sch)
    assert (copy.outer, copy.rest, copy.panels) == (3, 24, 4)
    assert_computes_the_reference(sch)


def test_a_parallel_panel_loop_copies_its_chunk_of_panels():
    sch = packed("conv2d_nchw", (1, 16, 5, 5, 64, 3, 3, 1, 1), "Y.update", "W", 0, 16)
    sch.parallel("W_packed.p0")
    assert copy_of(sch) is not None
    assert_computes_the_reference(sch, threads=2)


def test_packs_it_does_not_recognize_are_lowered_as_written():
    padded = packed("matmul", (6, 20, 40), "C.update", "B", 0, 16)  # 40 rows: a padded pack
    assert copy_of(padded) is None
    assert_computes_the_reference(padded)
    innermost = packed("matmul", (6, 64, 16), "C.update", "B", 1, 16)  # no transpose
    assert copy_of(innermost) is None
    split = packed("conv2d_nchw", (1, 16, 5, 5, 32, 3, 3, 1, 1), "Y.update", "W", 0, 16)
    split.split("W_packed.p1", [4, 4])  # a nest the schedule changed
    assert copy_of(split) is None
    assert_computes_the_reference(split)

