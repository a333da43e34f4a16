"""The analytic cost model: orderings any sane model of a core must get right, on synthetic
machine models given explicitly (the AVX-512 core with 32 registers of tests/conftest.py, and an
AVX2 core with 16), that its predictions follow the machine model's numbers, and a finite,
positive prediction with the same named terms for every kind of program the IR allows."""

import dataclasses
import math
import random

import numpy as np
import pytest

from eqsched.egraph.derive import realize
from eqsched.egraph.space import build_space
from eqsched.extract.analytic import KEYS, AnalyticModel
from eqsched.extract.cost import get_cost_model
from eqsched.ir import naive_program
from eqsched.rules import default_rules
from eqsched.schedule import Schedule
from eqsched.te import Computation, compute, placeholder
from eqsched.workloads import get_workload, list_workloads


@pytest.fixture(scope="module")
def avx512(synthetic_machine):
    return synthetic_machine


@pytest.fixture(scope="module")
def avx2(synthetic_machine):
    return dataclasses.replace(synthetic_machine, target="synthetic-avx2", vector_lanes=8,
                               vector_registers=16)


@pytest.fixture(scope="module")
def model(avx512):
    return AnalyticModel(avx512)


def matmul(n=512):
    return naive_program(get_workload("matmul").build(n, n, n))


def register_tiled(naive, n=512, cache_write=True, unroll=True, pack=True):
    """The known-good matmul: an 8x32 register tile (16 zmm accumulators) over the whole k,
    B packed in 32-wide panels (the brief's SSRSRS schedule, ~104 GFLOPS at 512)."""
    s = Schedule(naive)
    s.split("C.i", [1, n // 8, 1, 8])
    s.split("C.j", [n // 32, 1, 2, 16])
    s.split("C.k", [n, 1])
    s.reorder("C.i.0", "C.j.0", "C.i.1", "C.j.1", "C.k.0", "C.i.2", "C.j.2", "C.k.1", "C.i.3",
              "C.j.3")
    s.fuse("C.init", at="C.j.1")
    if cache_write:
        s.cache_write("C.update", at="C.j.1")
    if unroll:
        s.unroll("C.i.3")
        s.unroll("C.j.2")
    s.vectorize("C.j.3")
    if pack:
        s.pack("C.update", "B", dim=1, factor=32)
    return s.program


def row_streaming(naive, n=512, vectorize=True):
    """i, k, j with j innermost: C[i, j] updated in memory once per k (no register tile)."""
    s = Schedule(naive)
    s.reorder("C.i", "C.k", "C.j")
    s.split("C.j", [n // 16, 16])
    if vectorize:
        s.vectorize("C.j.1")
    return s.program


def test_a_vectorized_loop_beats_the_same_loop_scalar(model):
    naive = matmul()
    fast, slow = model.predict([row_streaming(naive), row_streaming(naive, vectorize=False)])
    assert fast < slow / 4


def test_a_vector_over_packed_panels_loads_runs_not_lanes(model):
    """A 64-wide vector over B packed in 16-wide panels reads four contiguous registers (the
    backend's runs), as many loads as over 64-wide panels; over 4-wide panels, lane by lane."""
    def panels(factor):
        s = Schedule(matmul(256))
        s.pack("C.update", "B", dim=1, factor=factor)
        s.split("C.j", [4, 64])
        s.reorder("C.i", "C.j.0", "C.k", "C.j.1")
        s.vectorize("C.j.1")
        return s.program
    runs, whole, lanes = (model.breakdown(panels(f))["loads"] for f in (16, 64, 4))
    assert runs == pytest.approx(whole, rel=0.05)
    assert lanes > 4 * runs


def test_a_scatter_stores_lane_by_lane(model):
    """Y[i, j] = X[j, i] vectorized over i: contiguous loads, but a store per lane (a scatter),
    as many store units as the scalar loop's (a contiguous vector store would take 1/8)."""
    x = placeholder((256, 256), "X")
    naive = naive_program(Computation("transpose", [compute((256, 256), lambda i, j: x[j, i],
                                                            "Y")]))
    scattered = Schedule(naive)
    scattered.reorder("Y.j", "Y.i")
    scattered.split("Y.i", [16, 16])
    scalar = scattered.fork()
    scattered.vectorize("Y.i.1")
    stores = [model.breakdown(p)["stores"] for p in (scattered.program, scalar.program)]
    assert stores[0] == pytest.approx(stores[1])


def test_a_scattered_accumulator_is_not_kept_in_registers(model):
    """C[i, j] += ... vectorized over i (lanes a row apart) inside k: the gather and scatter
    of C run at every k, far slower than the same loops vectorized over j, where C is kept in
    a register through k."""
    naive = matmul(256)
    across, along = Schedule(naive), Schedule(naive)
    across.reorder("C.j", "C.i")
    across.split("C.i", [16, 16])
    across.reorder("C.k", "C.i.1")  # j, i.0, k, i.1
    across.vectorize("C.i.1")
    along.split("C.j", [16, 16])
    along.reorder("C.k", "C.j.1")  # i, j.0, k, j.1
    along.vectorize("C.j.1")
    scattered, contiguous = model.predict([across.program, along.program])
    assert scattered > 4 * contiguous


def test_a_register_tile_beats_accumulating_in_memory(model):
    naive = matmul()
    tiled, streaming = model.predict([register_tiled(naive), row_streaming(naive)])
    assert tiled < streaming / 2


def conv2d_resnet(accumulate_in_registers: bool):
    """conv2d 64x56x56, 3x3, vectorized along the 56-wide rows as a 64-lane vector (its 56
    lanes in pieces of 32, 16 and 8). In registers: 4 output channels of one row accumulate
    over the whole (c, r, s) reduction. In memory: the innermost serial loop runs over 32
    output channels, so each row of Y is loaded, updated three times (s) and stored back at
    every step (explore's winner before the fix, measured 0.57-0.6x onnxruntime against
    0.8-1.0x for the register tile)."""
    s = Schedule(naive_program(get_workload("conv2d_nchw").build(1, 64, 56, 56, 64, 3, 3, 1, 1)))
    if accumulate_in_registers:
        s.split("Y.k", [16, 1, 1, 4])
        s.split("Y.q", [1, 1, 1, 64])
        s.reorder("Y.n", "Y.k.0", "Y.p", "Y.k.1", "Y.q.0", "Y.q.1", "Y.k.2", "Y.q.2", "Y.rc",
                  "Y.ry", "Y.rx", "Y.k.3", "Y.q.3")
        for tile_loop in ("Y.ry", "Y.rx", "Y.k.3"):
            s.unroll(tile_loop)
    else:
        s.split("Y.k", [1, 2, 1, 32])
        s.split("Y.p", [28, 1, 2, 1])
        s.split("Y.q", [1, 1, 1, 64])
        s.reorder("Y.n", "Y.k.0", "Y.q.0", "Y.k.1", "Y.q.1", "Y.rc", "Y.p.0", "Y.ry", "Y.k.2",
                  "Y.p.1", "Y.p.2", "Y.k.3", "Y.rx", "Y.q.2", "Y.p.3", "Y.q.3")
        for tile_loop in ("Y.k.1", "Y.p.2", "Y.rx"):
            s.unroll(tile_loop)
    s.vectorize("Y.q.3")
    return s.program


def test_an_accumulator_in_memory_makes_a_round_trip_per_register(model):
    """Each zmm of a 64-lane accumulator row is loaded, updated and stored on its own: four
    round trips per update, so the register tile wins, as measured side by side."""
    in_registers, in_memory = conv2d_resnet(True), conv2d_resnet(False)
    assert model.predict([in_registers])[0] < 0.75 * model.predict([in_memory])[0]
    naive = matmul()
    narrow = model.breakdown(row_streaming(naive))  # C in 16-lane pieces: one zmm per update
    wide = Schedule(naive)
    wide.reorder("C.i", "C.k", "C.j")
    wide.split("C.j", [512 // 64, 64])
    wide.vectorize("C.j.1")  # a quarter of the updates, four zmm each
    assert model.breakdown(wide.program)["latency"] == pytest.approx(narrow["latency"])


def test_a_vector_load_off_a_register_boundary_pays_for_the_lines_it_crosses(model):
    """Y[i, j] = X[i, j + s]: rows 96 floats apart (a multiple of a zmm), so the loads are
    aligned at s = 0 and cross a line 15 times in 16 at s = 1 (conv2d's rows at q + 1)."""
    x = placeholder((64, 96), "X")

    def shifted(s):
        naive = naive_program(Computation("copy", [compute((64, 64), lambda i, j: x[i, j + s],
                                                           "Y")]))
        sch = Schedule(naive)
        sch.split("Y.j", [4, 16])
        sch.vectorize("Y.j.1")
        return model.breakdown(sch.program)["loads"]

    assert shifted(1) > 1.5 * shifted(0)


def test_unrolling_the_register_tile_matters(model):
    # Without unrolling, the tile loops are serial: one accumulator at a time, in memory.
    naive = matmul()
    unrolled, rolled = model.predict([register_tiled(naive), register_tiled(naive, unroll=False)])
    assert unrolled < rolled / 2


def row_of_c_over_unrolled_k(naive, i_unroll=1, j_serial=1, rows_inside_k=False):
    """C[i, 0:256] over 16 unrolled k (or i_unroll rows of it over 8 k, in j_serial strips,
    the rows around the k copies or inside them): B's 16 x 256 block does not depend on i, but
    it is far too big to stay in registers."""
    s = Schedule(naive)
    if i_unroll == 1:
        s.split("C.j", [2, 4, 64])
        s.split("C.k", [32, 16])
        s.reorder("C.j.0", "C.k.0", "C.i", "C.k.1", "C.j.1", "C.j.2")
        s.unroll("C.k.1")
        s.unroll("C.j.1")
        s.vectorize("C.j.2")
        return s.program
    s.split("C.i", [512 // i_unroll, i_unroll])
    s.split("C.j", [2, j_serial, 256 // j_serial])
    s.split("C.k", [64, 8])
    inner = ("C.k.1", "C.i.1") if rows_inside_k else ("C.i.1", "C.k.1")
    s.reorder("C.j.0", "C.i.0", "C.k.0", "C.j.1", *inner, "C.j.2")
    s.unroll("C.i.1")
    s.unroll("C.k.1")
    s.vectorize("C.j.2")
    return s.program


def test_loads_hoisted_out_of_a_loop_must_fit_in_registers(model):
    # One B vector per FMA: measured 87 GFLOPS where a register-held B would allow the peak.
    terms = model.breakdown(row_of_c_over_unrolled_k(matmul()))
    assert terms["loads"] >= 0.9 * terms["compute"]


def test_accumulators_live_across_unrolled_copies_spill_past_the_register_file(model):
    naive = matmul()
    fits = model.breakdown(row_of_c_over_unrolled_k(naive, i_unroll=4, j_serial=4,
                                                    rows_inside_k=True))  # 16 zmm
    spills = model.breakdown(row_of_c_over_unrolled_k(naive, i_unroll=8, j_serial=4,
                                                      rows_inside_k=True))  # 32 zmm
    assert fits["spills"] == 0 < spills["spills"]


def test_operands_reused_across_outer_unrolled_copies_are_live_together(model):
    # Four rows around eight unrolled k: CSE loads each of B's 8 x 4 vectors once and keeps all
    # 32 until the last row, beside 16 accumulators. LLVM spilled them (119 stack accesses
    # against 42 with the rows inside the k copies): 17.5 against 35.6 GFLOPS side by side.
    naive = matmul()
    rows_outside = model.breakdown(row_of_c_over_unrolled_k(naive, i_unroll=4, j_serial=4))
    rows_inside = model.breakdown(row_of_c_over_unrolled_k(naive, i_unroll=4, j_serial=4,
                                                           rows_inside_k=True))
    assert rows_inside["spills"] == 0 < rows_outside["spills"]
    assert rows_outside["total"] > 1.4 * rows_inside["total"]


def test_the_tiled_matmul_beats_the_naive_one_by_far(model):
    naive = matmul()
    tiled, plain = model.predict([register_tiled(naive), naive])
    assert tiled < plain / 20
    assert 2 * 512**3 / tiled / 1e9 <= model.peak_gflops  # never faster than the FMA peak


def test_the_known_good_program_beats_samples_of_its_space(model):
    naive = matmul(128)
    space = build_space(naive, default_rules())
    samples = [realize(term, sizes, naive) for term, sizes in space.sample(20, seed=3)]
    good, *others = model.predict([register_tiled(naive, 128)] + samples)
    assert good < min(others)


def test_every_workloads_naive_program_has_a_finite_positive_prediction(model):
    programs = [naive_program(w.build(*w.default_size)) for w in list_workloads()]
    programs += [naive_program(w.build(*w.small_size)) for w in list_workloads()]
    seconds = model.predict(programs)
    assert np.all(np.isfinite(seconds)) and np.all(seconds > 0)


@pytest.mark.parametrize("workload", ["conv2d_nchw", "softmax", "mm_exp_mm", "elementwise_chain"])
def test_programs_of_every_kind_get_finite_positive_predictions(model, workload):
    # Random walks of the space: parallel, unrolled and vector loops, local tiles, packed copies,
    # inlined stages, padding selects, exp, max reductions, several stages.
    wl = get_workload(workload)
    naive = naive_program(wl.build(*wl.small_size))
    space = build_space(naive, default_rules())
    rng = random.Random(0)
    programs = []
    for _ in range(400):
        term = space.walk(lambda slot, nodes: rng.choice(nodes))
        options = space.size_options(term)
        if all(options_ for _, options_ in options):
            sizes = {(group, path): extent for group, choices in options
                     for path, extent in rng.choice(choices).items()}
            programs.append(realize(term, sizes, naive))
        if len(programs) == 10:
            break
    assert programs
    seconds = model.predict(programs)
    assert np.all(np.isfinite(seconds)) and np.all(seconds > 0)


def test_breakdown_keys_are_stable_and_total_is_the_prediction(model):
    naive = matmul(64)
    for prog in (naive, register_tiled(naive, 64), row_streaming(naive, 64)):
        terms = model.breakdown(prog)
        assert tuple(terms) == KEYS
        assert all(math.isfinite(v) and v >= 0 for v in terms.values())
        assert terms["total"] == model.predict([prog])[0]


def test_predictions_are_deterministic(avx512):
    naive = matmul(128)
    programs = [naive, register_tiled(naive, 128)]
    first = AnalyticModel(avx512).predict(programs)
    assert np.array_equal(first, AnalyticModel(avx512).predict(programs))
    model = AnalyticModel(avx512)
    model.predict(programs)
    assert np.array_equal(first, model.predict(programs))  # its caches change nothing


def test_a_parallel_loop_helps_only_with_several_threads(avx512):
    s = Schedule(row_streaming(matmul(256), 256))
    s.parallel("C.i")
    parallel = s.program
    one, two = AnalyticModel(avx512, threads=1), AnalyticModel(avx512, threads=2)
    assert one.predict([parallel])[0] == pytest.approx(two.predict([parallel])[0] * 2, rel=0.05)


def test_a_parallel_loop_over_a_remainder_runs_as_long_as_its_fullest_step(avx512):
    # 56 columns in two parallel steps of 32: one core runs 32 of them, the other 24.
    naive = naive_program(get_workload("matmul").build(64, 56, 256))
    split, whole = Schedule(naive), Schedule(naive)
    split.split("C.j", [-1, 32])
    split.reorder("C.j.0", "C.i", "C.k", "C.j.1")
    split.parallel("C.j.0")
    whole.split("C.i", [-1, 32])
    whole.reorder("C.i.0", "C.i.1", "C.k", "C.j")
    whole.parallel("C.i.0")
    one, two = AnalyticModel(avx512, threads=1), AnalyticModel(avx512, threads=2)
    for sch, busiest in ((split, 32 / 56), (whole, 1 / 2)):
        update = [n for n in sch.program.body if n.name.startswith("C.")][-1]
        assert two._share(update) == pytest.approx(busiest)
        assert one._share(update) == 1.0


def test_a_collapsed_parallel_nest_shares_its_steps_product(avx512):
    # 64 rows in 11 steps of 6 (the last has 4): one core runs 6 steps, 34 rows. Collapsed
    # with 4 steps of 14 columns, 44 steps go to the two cores evenly.
    sch = Schedule(naive_program(get_workload("matmul").build(64, 56, 32)))
    sch.split("C.i", [-1, 6])
    sch.split("C.j", [-1, 14])
    sch.reorder("C.i.0", "C.j.0", "C.i.1", "C.k", "C.j.1")
    sch.parallel("C.i.0")
    alone = sch.program.body[-1]
    sch.parallel("C.j.0")
    collapsed = sch.program.body[-1]
    two = AnalyticModel(avx512, threads=2)
    assert two._share(alone) == pytest.approx(34 / 64)
    assert two._share(collapsed) == pytest.approx(1 / 2)
    assert AnalyticModel(avx512, threads=3)._share(collapsed) == pytest.approx(
        (14 * 6 * 14 + 4 * 14) / (64 * 56))  # 15 of the 44 steps, the one of 4 rows among them


def parallel_stream(n=1 << 24):
    """An elementwise chain over 64 MiB per array, each stage vectorized and split in 16
    parallel chunks: DRAM-bound."""
    s = Schedule(naive_program(get_workload("elementwise_chain").build(n)))
    for stage in ("T", "U", "Z"):
        s.split(f"{stage}.i", [16, n // 256, 16])
        s.parallel(f"{stage}.i.0")
        s.vectorize(f"{stage}.i.2")
    return s.program


def test_two_cores_stream_from_dram_only_as_fast_as_its_bandwidth_scales(avx512):
    prog = parallel_stream()
    scaling = dataclasses.replace(avx512, bandwidth_all_cores={**avx512.bandwidth_all_cores,
                                                               "DRAM": 10.0})
    one = AnalyticModel(avx512, threads=1).predict([prog])[0]
    shared = AnalyticModel(avx512, threads=2).predict([prog])[0]  # 6 B/cycle on two cores
    scaled = AnalyticModel(scaling, threads=2).predict([prog])[0]  # 10 B/cycle on two cores
    assert one / shared < 1.4 < 1.8 < one / scaled


def test_its_registered_name_is_the_calibrated_host_and_it_rejects_a_bad_thread_count(avx512):
    assert isinstance(get_cost_model("analytic"), AnalyticModel)
    with pytest.raises(ValueError, match="threads"):
        AnalyticModel(avx512, threads=0)


# ---- the machine model decides ----------------------------------------------------------------


def tile_of_vectors(naive, rows, vectors, lanes, n=512):
    """`rows` x `vectors` accumulators of `lanes` lanes over the whole k (B packed)."""
    s = Schedule(naive)
    s.split("C.i", [1, n // rows, 1, rows])
    s.split("C.j", [n // (vectors * lanes), 1, vectors, lanes])
    s.split("C.k", [n, 1])
    s.reorder("C.i.0", "C.j.0", "C.i.1", "C.j.1", "C.k.0", "C.i.2", "C.j.2", "C.k.1", "C.i.3",
              "C.j.3")
    s.fuse("C.init", at="C.j.1")
    s.cache_write("C.update", at="C.j.1")
    s.unroll("C.i.3")
    s.unroll("C.j.2")
    s.vectorize("C.j.3")
    s.pack("C.update", "B", dim=1, factor=vectors * lanes)
    return s.program


def test_each_machine_prefers_the_tile_its_registers_hold(avx512, avx2):
    # 8 x 2 vectors of 16 lanes: 16 registers on AVX-512, 32 on AVX2 (spills there);
    # 4 x 2 vectors of 8 lanes: 8 registers on either, but half-width operations on AVX-512.
    naive = matmul()
    wide, narrow = tile_of_vectors(naive, 8, 2, 16), tile_of_vectors(naive, 4, 2, 8)
    on_avx512 = AnalyticModel(avx512).predict([wide, narrow])
    on_avx2 = AnalyticModel(avx2).predict([wide, narrow])
    assert on_avx512[0] < on_avx512[1] / 1.5
    assert on_avx2[1] < on_avx2[0] / 1.2
    assert AnalyticModel(avx2).breakdown(wide)["spills"] > 0


def carried_rows(naive, n, rows, lanes):
    """`rows` rows of C, `lanes` wide, accumulated in C (no local tile) over the whole k."""
    s = Schedule(naive)
    s.split("C.i", [-1, rows])
    s.split("C.j", [-1, lanes])
    s.reorder("C.i.0", "C.j.0", "C.k", "C.i.1", "C.j.1")
    s.unroll("C.i.1")
    s.vectorize("C.j.1")
    return s.program


def test_the_steps_of_a_remainder_that_hold_no_point_are_not_counted(avx512):
    # 7 rows as 2 x 4 (and as 2 x 2 x 2): the backend peels the partial step and drops the
    # unrolled copies past the last row, so 7 rows do 7/8 of the work of 8, whether the piece
    # holding the remainder is unrolled or a loop (conv2d 512x7x7's 4-row tile over 7 rows was
    # predicted 13% slower than it ran, docs §17.1).
    model = AnalyticModel(avx512)

    def rows(m: int, factors: list[int], unrolled: bool) -> dict[str, float]:
        s = Schedule(naive_program(get_workload("matmul").build(m, 16, 256)))
        pieces = s.split("C.i", factors)
        s.reorder(*pieces[:-1], "C.k", pieces[-1], "C.j")
        if unrolled:
            s.unroll(pieces[-1])
        s.vectorize("C.j")
        return model.breakdown(s.program)

    for factors in ([2, 4], [2, 2, 2]):
        for unrolled in (True, False):
            seven, eight = rows(7, factors, unrolled), rows(8, factors, unrolled)
            assert seven["compute"] == pytest.approx(7 / 8 * eight["compute"])
            assert seven["loads"] < eight["loads"]  # A's rows; B's row is loaded per step


def test_operands_shared_by_carried_rows_count_against_the_registers(avx2):
    # 3 rows x 32 lanes on 16 registers: 12 accumulators, the 4 registers of B's row that
    # the 3 rows share and A's broadcast: LLVM spilled and shuffled accumulators every k
    # (28 GFLOPS at 127^3, where 6 rows x 16 lanes ran at numpy's 46). B's rows of 127
    # floats are not aligned: its loads count all the same.
    for n in (127, 128):
        naive = matmul(n)
        wide, fitting = carried_rows(naive, n, 3, 32), carried_rows(naive, n, 6, 16)
        model = AnalyticModel(avx2)
        assert model.breakdown(fitting)["spills"] == 0 < model.breakdown(wide)["spills"]
        assert model.predict([fitting])[0] < model.predict([wide])[0]


def carried_tile(naive, n, rows, vectors, lanes=16):
    """`rows` x `vectors` accumulators of `lanes` lanes carried through k.1 (no local tile),
    the vectors' loop outside the rows' (the loop order LLVM sees does not matter)."""
    s = Schedule(naive)
    s.split("C.i", [n // rows, rows])
    s.split("C.j", [n // (vectors * lanes), vectors, lanes])
    s.split("C.k", [n // 96, 96])
    s.reorder("C.j.0", "C.k.0", "C.i.0", "C.k.1", "C.j.1", "C.i.1", "C.j.2")
    s.unroll("C.i.1")
    s.unroll("C.j.1")
    s.vectorize("C.j.2")
    return s.program


def test_a_carried_tile_spills_with_the_copies_of_its_smaller_operand(avx512):
    # Per k step LLVM keeps the copies of one operand live across the tile (the 3 vectors of
    # B for 10 rows, the rows' broadcasts of A for 6 columns), beside a copy of the other:
    # 30 accumulators spilled on 32 registers (124-130 stack accesses), 24 and 25 did not.
    naive, model = matmul(960), AnalyticModel(avx512)
    for rows, vectors in ((10, 3), (15, 2), (5, 6)):
        assert model.breakdown(carried_tile(naive, 960, rows, vectors))["spills"] > 0
    for rows, vectors in ((8, 3), (5, 5), (4, 6), (12, 2)):
        assert model.breakdown(carried_tile(naive, 960, rows, vectors))["spills"] == 0


def test_predictions_follow_the_machine_models_clock_and_units(avx512):
    naive = matmul(256)
    programs = [tile_of_vectors(naive, 8, 2, 16, 256), row_streaming(naive, 256), naive]
    base = AnalyticModel(avx512).predict(programs)
    fast_clock = AnalyticModel(dataclasses.replace(avx512, hz=6e9)).predict(programs)
    np.testing.assert_allclose(fast_clock - 1e-9, (base - 1e-9) / 2, rtol=1e-9)
    one_fma = dataclasses.replace(avx512, fma_per_cycle=1.0, fma_per_cycle_half=1.0)
    tile = AnalyticModel(avx512).breakdown(programs[0])
    assert AnalyticModel(one_fma).breakdown(programs[0])["compute"] == pytest.approx(
        2 * tile["compute"])
    # 16 accumulators hide a latency of 4 at 2 FMAs a cycle, not one of 12.
    slow = AnalyticModel(dataclasses.replace(avx512, fma_latency=12.0)).breakdown(programs[0])
    assert slow["latency"] == pytest.approx(3 * tile["latency"])
    assert tile["latency"] <= tile["compute"] < slow["latency"]


def test_cache_traffic_follows_the_machines_caches_and_bandwidths(avx512):
    prog = row_streaming(matmul(1024), 1024)  # B (4 MiB) streams through L2 for every row of C
    small_l2 = dataclasses.replace(avx512, caches={**avx512.caches, "L2": 256 << 10})
    big_l3 = dataclasses.replace(avx512, caches={**avx512.caches, "L3": 1 << 20})
    base = AnalyticModel(avx512).breakdown(prog)
    assert AnalyticModel(big_l3).breakdown(prog)["dram"] > base["dram"]
    assert AnalyticModel(small_l2).breakdown(prog)["l2_fill"] >= base["l2_fill"]
    faster_l3 = dataclasses.replace(avx512, bandwidth={**avx512.bandwidth, "L3": 32.0})
    assert AnalyticModel(faster_l3).breakdown(prog)["l2_fill"] == pytest.approx(
        base["l2_fill"] / 2)


def row_tile(m, n, k, pack=False, k_unrolled=8):
    """mm_exp_mm's first matmul as one search found it: a 1x64 register tile (k unrolled 8)
    that walks the whole k of B for every row of C; B unpacked, its rows n floats apart."""
    s = Schedule(naive_program(get_workload("matmul").build(m, n, k)))
    s.split("C.j", [n // 64, 4, 1, 16])
    s.split("C.k", [k // k_unrolled, k_unrolled])
    s.reorder("C.j.0", "C.i", "C.k.0", "C.j.1", "C.k.1", "C.j.2", "C.j.3")
    s.fuse("C.init", at="C.i")
    for loop in ("C.init.j.1", "C.j.1", "C.k.1", "C.j.2"):
        s.unroll(loop)
    s.vectorize("C.j.3")
    if pack:
        s.pack("C.update", "B", dim=1, factor=64)
    return s.program


def test_a_panel_at_a_power_of_two_stride_misses_the_l2_its_size_would_fit(avx512):
    # B's 64-wide panel is 2048 rows of 256 B: 512 KiB fits a 1 MiB L2, but rows 4 KiB apart
    # fill 64 of its 1024 sets and only 16 ways: measured 6 GFLOPS unpacked, 35 packed.
    with_sets = AnalyticModel(dataclasses.replace(avx512, l2_sets=1024, l2_ways=16))
    without = AnalyticModel(avx512)
    unpacked, packed = row_tile(64, 1024, 2048), row_tile(64, 1024, 2048, pack=True)
    odd_stride = row_tile(64, 1088, 2048)  # rows 4352 B apart spread over every set
    assert without.breakdown(unpacked)["l2_fill"] < 2 * without.breakdown(packed)["l2_fill"]
    assert with_sets.breakdown(unpacked)["l2_fill"] > 10 * with_sets.breakdown(packed)["l2_fill"]
    # Blind to the sets the model saw the unpacked panel's walk only (a visit of 4 lines, then
    # a 4 KiB jump: no prefetch), not that the panel leaves the L2.
    assert without.predict([unpacked]) < with_sets.predict([unpacked]) / 2
    assert with_sets.predict([unpacked]) > 2 * with_sets.predict([packed])
    assert with_sets.breakdown(odd_stride)["l2_fill"] == without.breakdown(odd_stride)["l2_fill"]
    # The pack's own copy walks B's columns 4 KiB apart: a little more, no more.
    assert with_sets.breakdown(packed)["l2_fill"] == pytest.approx(
        without.breakdown(packed)["l2_fill"], rel=0.05)


def test_a_panel_at_a_multiple_of_4k_crowds_the_l2_however_its_walk_is_split(avx512):
    # Rows 12 KiB apart (N = 3072) land in 16 of 1,024 L2 sets; a k loop split 64 x 12 walks
    # them as 12 rows, then 64 steps of 12 rows: counted apart, the two strides seemed to
    # spread the panel over 192 sets. 197x3072x768's winner (B unpacked) measured 57 GFLOPS
    # where it was predicted 152; the same tile at N = 3104 (rows 12,416 B apart) runs as
    # fast as with B packed.
    with_sets = AnalyticModel(dataclasses.replace(avx512, l2_sets=1024, l2_ways=20))
    without = AnalyticModel(avx512)
    crowded = row_tile(64, 3072, 768, k_unrolled=12)
    spread = row_tile(64, 3136, 768, k_unrolled=12)  # rows 196 lines apart: 256 sets
    assert with_sets.breakdown(crowded)["l2_fill"] > 5 * without.breakdown(crowded)["l2_fill"]
    assert with_sets.breakdown(spread)["l2_fill"] == without.breakdown(spread)["l2_fill"]


def test_an_accumulator_chained_through_unrolled_copies_waits_on_fma_latency(model):
    # Sixteen zmm accumulators, each updated by 8 unrolled k in turn inside a serial j loop,
    # wait on the FMA latency as the same sixteen carried through a serial k loop do. Blind to
    # it, the model ranked the AVX2 matmul 512³ winner (8 ymm accumulators through 16 unrolled
    # k) above 4x16 packed tiles it measured 0.7x of.
    naive = matmul()
    unrolled = model.breakdown(row_of_c_over_unrolled_k(naive, i_unroll=4, j_serial=4,
                                                        rows_inside_k=True))
    carried = model.breakdown(register_tiled(naive))
    # At least: updated in memory, each register's round trip may cost more (§8).
    assert unrolled["latency"] >= carried["latency"] * 0.99


def test_a_walk_of_whole_lines_with_a_far_jump_between_visits_gets_no_prefetch(avx512):
    # B unpacked under a 1x64 tile: 4 lines of a row, then a jump to the next row 4352 B on.
    # The prefetchers follow neither the jump nor a stream of 4 lines: each visit costs the
    # machine's strided fill, as a part-line column walk does. Only the padded-pack programs
    # ranked above the unpacked ones at 1000³ and 197x3072x768 measured faster.
    walk = row_tile(64, 1088, 2048)
    plain = AnalyticModel(dataclasses.replace(avx512, strided_fill=1.0))
    costly = AnalyticModel(dataclasses.replace(avx512, strided_fill=3.0))
    assert costly.breakdown(walk)["l2_fill"] > 2 * plain.breakdown(walk)["l2_fill"]  # B's part


def rows_under_unrolled_k(j_steps, k_serial=False):
    """C = A @ B at 1024x1024x2048 in 6x16 tiles reloaded every 8 k (k split 256 x 8, the
    8 rows of k unrolled or serial), `j_steps` tiles of 16 columns side by side per step of
    k.0: each of B's 8 rows in a step is read for `j_steps` lines, then k.0 jumps 8 rows on."""
    s = Schedule(naive_program(get_workload("matmul").build(1024, 1024, 2048)))
    s.split("C.i", [171, 1, 3, 2])
    s.split("C.j", [1, 64 // j_steps, j_steps, 16])
    s.split("C.k", [256, 8])
    s.reorder("C.i.0", "C.i.1", "C.j.0", "C.j.1", "C.k.0", "C.j.2", "C.k.1", "C.i.2", "C.i.3",
              "C.j.3")
    for loop in ("C.i.2", "C.i.3") if k_serial else ("C.k.1", "C.i.2", "C.i.3"):
        s.unroll(loop)
    s.vectorize("C.j.3")
    return s.program


def test_rows_streamed_a_few_lines_each_get_no_prefetch(avx512):
    # Eight rows of B 4 KiB apart, each for 2 to 8 lines, then the next eight: no prefetcher
    # follows streams that short. Measured on AVX2 (Zen 4, side by side): 46-57 GFLOPS, where
    # the model said 88-92 and ranked them above the same tiles over B packed (105-110), the
    # first round of a search of mm_exp_mm proposed nothing else. Whole rows (64 steps) stream.
    plain = AnalyticModel(dataclasses.replace(avx512, strided_fill=1.0))
    costly = AnalyticModel(dataclasses.replace(avx512, strided_fill=3.0))
    for j_steps in (2, 8):
        short = rows_under_unrolled_k(j_steps)
        assert costly.breakdown(short)["l2_fill"] > 2 * plain.breakdown(short)["l2_fill"]
    whole_rows = rows_under_unrolled_k(64)
    assert costly.breakdown(whole_rows)["l2_fill"] == plain.breakdown(whole_rows)["l2_fill"]


def test_a_walk_the_l2_serves_costs_its_streamed_rate(avx512):
    # The strided fill is the L3's (a demand miss per line at its latency): B's rows from the
    # L3 cost it, the same lines from the L2 into the L1 do not. Charged at both levels, tiles
    # over B's rows in a 1 MiB L2 were predicted at 48 GFLOPS and ran 72-90.
    plain = AnalyticModel(dataclasses.replace(avx512, strided_fill=1.0))
    costly = AnalyticModel(dataclasses.replace(avx512, strided_fill=3.0))
    walk = rows_under_unrolled_k(8, k_serial=True)
    assert costly.breakdown(walk)["l2_fill"] > 2 * plain.breakdown(walk)["l2_fill"]
    assert costly.breakdown(walk)["l1_fill"] == plain.breakdown(walk)["l1_fill"]


def test_a_transposing_pack_is_costed_as_the_backends_tile_transposes(model):
    """W[k, c, r, s] packed along k: the backend copies it in register tiles (a vector load and
    store per run), so the copy costs a stream of both buffers, whatever the panel width."""
    naive = naive_program(get_workload("conv2d_nchw").build(1, 256, 7, 7, 256, 3, 3, 1, 1))

    def pack_only(factor, split=False):
        s = Schedule(naive)
        s.pack("Y.update", "W", 0, factor)
        if split:  # a nest the backend lowers as written, a scalar load per element
            s.split("W_packed.p1", [16, 16])
        prog = s.program
        return prog.with_body(tuple(n for n in prog.body if n.name == "W_packed.p0"),
                              prog.buffers)

    narrow, wide = (model.breakdown(pack_only(f)) for f in (16, 64))
    assert narrow["copies"] == pytest.approx(wide["copies"], rel=0.1)
    as_written = model.breakdown(pack_only(16, split=True))
    assert narrow["loads"] < as_written["loads"] / 8
    assert narrow["total"] < as_written["total"]


def conv2d_tile(rows: int, channels: int, vectors: int):
    """conv2d 1x8x16x16, 6 output channels: `rows` rows x `channels` output channels x
    `vectors` vectors of 8 columns accumulated in Y over rx, with the taps ry unrolled between
    the rows and the channels."""
    naive = naive_program(get_workload("conv2d_nchw").build(1, 8, 16, 16, 6, 3, 3, 1, 1))
    s = Schedule(naive)
    s.split("Y.k", [-1, channels])
    s.split("Y.p", [-1, rows])
    s.split("Y.q", [-1, vectors, 8])
    s.reorder("Y.n", "Y.k.0", "Y.p.0", "Y.q.0", "Y.rc", "Y.rx", "Y.p.1", "Y.ry", "Y.k.1",
              "Y.q.1", "Y.q.2")
    for loop in ("Y.p.1", "Y.ry", "Y.k.1", "Y.q.1"):
        s.unroll(loop)
    s.vectorize("Y.q.2")
    return s.program


def test_rows_merged_along_a_diagonal_of_copies_count_against_the_registers(avx2):
    # 4 rows x 3 channels: 12 accumulators, and the taps ry between the rows read 6 rows of X
    # (row p + ry) that CSE loads once and keeps live across the copies that share them: with
    # W's taps, more than 16 registers. conv2d 56x56's explore winner had this tile: 26 stack
    # accesses per step, 53 GFLOPS, where a tile of 1 row x 6 channels x 2 vectors ran 73.
    diagonal, fitting = conv2d_tile(4, 3, 1), conv2d_tile(1, 6, 2)
    model = AnalyticModel(avx2)
    assert model.breakdown(fitting)["spills"] == 0 < model.breakdown(diagonal)["spills"]
    assert model.predict([fitting])[0] < model.predict([diagonal])[0]


def test_an_accumulator_narrower_than_a_register_goes_through_memory_at_every_step(avx2):
    # 7 of a vector's 8 lanes: the backend accesses the rows of C in pieces of 4, 2 and 1
    # lanes, and LLVM keeps those in memory across the k loop (conv2d 512x7x7's rows along q
    # ran at a fraction of what the model predicted as if in registers, docs §17.6). 8 of 8
    # lanes stay in registers over k.
    model = AnalyticModel(avx2)
    stores = {}
    for n in (7, 8):
        naive = naive_program(get_workload("matmul").build(32, n, 256))
        stores[n] = model.breakdown(carried_rows(naive, n, 4, 8))["stores"]
    assert stores[7] > 50 * stores[8]



def test_a_tail_of_a_power_of_two_lanes_is_a_narrower_register(avx512):
    # 8 of 16 lanes is a plain ymm: LLVM keeps its accumulators in registers over k like any
    # other (conv2d's 56 columns as 16-lane steps, the last 8 wide, ran clean FMA loops) and
    # a core of half-width units runs its FMAs at twice the zmm rate; 7 of 16 goes through
    # memory in pieces of 4, 2 and 1.
    half_wide = dataclasses.replace(avx512, fma_per_cycle=1.0, fma_per_cycle_half=2.0)
    model = AnalyticModel(half_wide)
    terms = {}
    for n in (23, 24, 32):
        naive = naive_program(get_workload("matmul").build(32, n, 256))
        terms[n] = model.breakdown(carried_rows(naive, n, 4, 16))
    assert terms[24]["stores"] < terms[32]["stores"]  # once per row, half of it a ymm
    assert terms[23]["stores"] > 20 * terms[24]["stores"]  # at every k
    assert terms[24]["compute"] == pytest.approx(0.75 * terms[32]["compute"])

def test_a_tail_moved_in_pieces_issues_an_insert_per_extra_piece(avx2):
    # 7 of 8 lanes over a local tile of 4 rows in registers: each row of B is loaded as 4, 2
    # and 1 lanes and put together with two inserts, five instructions where 8 lanes take one
    # (conv2d 512x7x7's rows along q, read at every tap, were predicted 56 GFLOPS and ran 29
    # on AVX2, docs §17.6).
    model = AnalyticModel(avx2)
    issue = {}
    for n in (7, 8):
        s = Schedule(naive_program(get_workload("matmul").build(32, n, 256)))
        s.split("C.i", [-1, 4])
        s.split("C.j", [-1, 8])
        s.reorder("C.i.0", "C.j.0", "C.k", "C.i.1", "C.j.1")
        s.fuse("C.init", at="C.j.0")
        s.cache_write("C.update", at="C.j.0")
        for stage in ("C", "C.init", "C.write"):
            s.unroll(f"{stage}.i.1")
            s.vectorize(f"{stage}.j.1")
        issue[n] = model.breakdown(s.program)["issue"]
    assert issue[7] > 1.3 * issue[8]  # four FMAs, four broadcasts and the B row per k


def test_a_spilled_accumulator_goes_to_memory_at_each_of_its_updates(avx2):
    # 7 rows of two ymm (14 accumulators, 2 of B and a broadcast of A: 17 of 16 registers).
    # Unrolling k by 8 inside the loop does not take the round trips away: each update of a
    # spilled accumulator is a load, an FMA and a store (conv2d 512x7x7's 7 columns x 2 ymm
    # with rc unrolled 8 inside the taps was predicted 84 GFLOPS and ran 55, docs §17.6).
    model = AnalyticModel(avx2)

    def rows(k_unrolled: int) -> float:
        s = Schedule(naive_program(get_workload("matmul").build(28, 16, 256)))
        s.split("C.i", [-1, 7])
        s.split("C.k", [-1, k_unrolled])
        s.reorder("C.i.0", "C.j", "C.k.0", "C.k.1", "C.i.1")
        s.split("C.j", [-1, 16])
        s.reorder("C.i.0", "C.j.0", "C.k.0", "C.k.1", "C.i.1", "C.j.1")
        s.unroll("C.k.1")
        s.unroll("C.i.1")
        s.vectorize("C.j.1")
        return model.breakdown(s.program)["spills"]

    assert rows(8) > 0.4 * rows(1) > 0


def rows_of_a_vector(n: int):
    """C's rows as one 64-lane vector step over n columns, four rows unrolled around the
    innermost k loop (their accumulators carried in registers)."""
    s = Schedule(naive_program(get_workload("matmul").build(32, n, 256)))
    s.split("C.j", [-1, 64])
    s.split("C.i", [-1, 4])
    s.reorder("C.i.0", "C.j.0", "C.k", "C.i.1", "C.j.1")
    s.unroll("C.i.1")
    s.vectorize("C.j.1")
    return s.program


def test_a_wide_tail_costs_its_pieces_at_their_widths(avx512):
    # 56 of 64 lanes run as 32 + 16 + 8: on a core whose units are half a register wide (Zen 4:
    # a ymm FMA at twice the zmm rate) the FMAs of a 56-wide row take 3.5 zmm's time where 64
    # lanes take 4; on full-width units (a ymm FMA as slow as a zmm one) both take 4.
    half_wide = dataclasses.replace(avx512, fma_per_cycle=1.0, fma_per_cycle_half=2.0)
    for machine, ratio in ((half_wide, 3.5 / 4), (avx512, 1.0)):
        compute = {n: AnalyticModel(machine).breakdown(rows_of_a_vector(n))["compute"]
                   for n in (56, 64)}
        assert compute[56] == pytest.approx(ratio * compute[64])


def rows_around_k(rows: int):
    """A local tile of `rows` x 32 lanes of C; each row runs its own k loop (the rows are
    unrolled outside it), so the whole tile stays live across them."""
    s = Schedule(matmul(128))
    s.split("C.i", [-1, rows])
    s.split("C.j", [-1, 4, 8])
    s.reorder("C.i.0", "C.j.0", "C.i.1", "C.k", "C.j.1", "C.j.2")
    s.fuse("C.init", at="C.j.0")
    s.cache_write("C.update", at="C.j.0")
    for stage in ("C", "C.init", "C.write"):
        s.unroll(f"{stage}.i.1")
        s.unroll(f"{stage}.j.1")
        s.vectorize(f"{stage}.j.2")
    return s.program


def test_a_register_tile_spills_when_it_is_larger_than_the_register_file(avx2):
    # Each row's k loop touches 4 registers, but all 7 x 4 of the tile are live across every
    # loop (conv2d 512x7x7's 7 x 2 x 32-lane tile on 16 registers sent every accumulator to
    # the stack and back each step, docs §17.6).
    model = AnalyticModel(avx2)
    assert model.breakdown(rows_around_k(1))["spills"] == 0
    assert model.breakdown(rows_around_k(7))["spills"] > 0


def test_a_loop_the_backend_runs_in_copies_issues_its_bookkeeping_once_per_copies(
        avx512, monkeypatch):
    import eqsched.backend.lower as lower
    prog = register_tiled(matmul(256), n=256)  # every innermost loop body is small
    issue = {}
    for copies in (1, 2, 4):
        monkeypatch.setattr(lower, "MAX_COPIES", copies)
        issue[copies] = AnalyticModel(avx512).breakdown(prog)["issue"]
    # Each step's increment and compare-and-branch come once per copies: 4 copies save 3/4 of
    # them, 2 copies 1/2.
    assert issue[4] < issue[2] < issue[1]
    assert (issue[1] - issue[4]) / (issue[1] - issue[2]) == pytest.approx(1.5)


def test_a_pack_of_a_constant_weight_is_not_charged_per_call(model):
    comp = get_workload("matmul").build(512, 512, 512)
    varying = register_tiled(naive_program(comp))
    weighted = register_tiled(naive_program(comp.with_constants(["B"])))
    # What is left of the copies is the local tile's write-back.
    assert 0 < model.breakdown(weighted)["copies"] < model.breakdown(varying)["copies"]
    assert model.predict([weighted])[0] == model.predict([weighted.per_call])[0]
    assert model.predict([weighted])[0] < model.predict([varying])[0]


def test_a_strided_store_the_backend_transposes_costs_less_than_its_scatter(model):
    # Y[k, p, q] = X[p, q, k] * 2 vectorized along k (lanes 16 apart in Y): with q unrolled 8
    # around the vector loop the backend stores transposed runs of 8 columns; with q serial,
    # a scatter per vector.
    x = placeholder((8, 16, 32), "X")
    comp = Computation("relayout", [compute((32, 8, 16), lambda k, p, q: x[p, q, k] * 2.0, "Y")])

    def stores(unrolled):
        sch = Schedule(naive_program(comp))
        k = sch.split("Y.k", [-1, 16])
        q = sch.split("Y.q", [-1, 8])
        sch.reorder(k[0], "Y.p", q[0], q[1], k[1])
        if unrolled:
            sch.unroll(q[1])
        sch.vectorize(k[1])
        return model.breakdown(sch.program)["stores"]

    assert stores(unrolled=True) < stores(unrolled=False) / 4
