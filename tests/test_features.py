"""Program features: one fixed-length finite vector per program, whose entries say what the
schedule did (vector lanes, register tile, local accumulator, packing, strides, cache traffic)."""

import dataclasses

import numpy as np
import pytest
from conftest import synthetic_machine_model
from test_schedule import hand_schedule

from eqsched.extract.features import FEATURE_NAMES, Hardware, features
from eqsched.ir import Program, naive_program
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload, list_workloads


def matmul(*size: int) -> Schedule:
    return Schedule(naive_program(get_workload("matmul").build(*size)))


AVX512 = synthetic_machine_model()
AVX2 = dataclasses.replace(AVX512, vector_lanes=8, vector_registers=16)
ON_AVX512 = Hardware.of(AVX512)


def named(prog: Program, hardware: Hardware = ON_AVX512) -> dict[str, float]:
    x = features(prog, hardware)
    assert x.shape == (len(FEATURE_NAMES),) and x.dtype == np.float64
    assert np.all(np.isfinite(x))
    return dict(zip(FEATURE_NAMES, x))


def register_tiled(sch: Schedule) -> Schedule:
    """The backend's packed 8x32 register tile, parallel over column panels."""
    hand_schedule(sch)
    return sch


def test_feature_names_are_distinct():
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)


@pytest.mark.parametrize("wl", list_workloads(), ids=lambda w: w.name)
def test_every_workload_naive_program_has_finite_features(wl):
    f = named(naive_program(wl.build(*wl.small_size)))
    assert f["blocks"] >= 1 and f["log2_flops"] > 0
    assert f["innermost_vectorized"] == 0 and f["accumulates_locally"] == 0


def test_naive_matmul_reads_b_with_a_gather_along_k():
    f = named(matmul(64, 64, 64).program)
    # The update's distinct accesses along k: C broadcast, A unit stride, B a column (gather).
    assert f["gather_share"] > 0.3 and f["unit_stride_share"] > 0.3
    assert f["reduction"] > 0.9  # the update dominates the iterations
    assert f["copy_blocks"] == 0 and f["packed_buffers"] == 0


def test_register_tiled_matmul_features_name_each_transformation():
    f = named(register_tiled(matmul(128, 128, 128)).program)
    assert f["innermost_vectorized"] > 0.99 and f["vector_lane_fill"] > 0.99
    assert f["log2_vector_lanes"] == pytest.approx(4, abs=0.05)
    # 8 x 2 x 16 elements in the update; its init and write-back copies weigh little
    assert f["log2_register_tile"] == pytest.approx(8, abs=0.25)
    assert f["log2_tile_registers"] == pytest.approx(4, abs=0.1)  # 16 zmm registers
    assert f["log2_register_spill"] == 0
    assert f["accumulates_locally"] > 0.9
    assert f["log2_local_bytes"] == pytest.approx(10, abs=0.25)  # 8 x 32 floats
    assert f["packed_buffers"] == 1 and f["local_buffers"] == 1 and f["copy_blocks"] == 2
    assert f["parallel_point_share"] > 0.9 and f["gather_share"] == 0


def test_each_schedule_step_changes_the_features():
    sch = matmul(64, 64, 64)
    seen = [features(sch.program, ON_AVX512)]
    sch.reorder("C.i", "C.k", "C.j")
    seen.append(features(sch.program, ON_AVX512))
    sch.split("C.j", [-1, 16])
    sch.vectorize("C.j.1")
    seen.append(features(sch.program, ON_AVX512))
    sch.split("C.i", [-1, 4])
    sch.reorder("C.i.0", "C.k", "C.i.1")
    sch.unroll("C.i.1")
    seen.append(features(sch.program, ON_AVX512))
    sch.parallel("C.i.0")
    seen.append(features(sch.program, ON_AVX512))
    for before, after in zip(seen, seen[1:]):
        assert not np.allclose(before, after)


def test_interchange_to_ikj_removes_the_gather_and_cuts_cache_traffic():
    naive = named(matmul(256, 256, 256).program)
    sch = matmul(256, 256, 256)
    sch.reorder("C.i", "C.k", "C.j")
    ikj = named(sch.program)
    assert naive["gather_share"] > 0 and ikj["gather_share"] == 0
    assert ikj["log2_traffic_L1_per_flop"] < naive["log2_traffic_L1_per_flop"]


def test_register_tile_beyond_the_register_file_counts_as_spill():
    sch = matmul(64, 64, 64)
    sch.split("C.i", [-1, 64])
    sch.split("C.j", [-1, 16])
    sch.reorder("C.i.0", "C.j.0", "C.k", "C.i.1", "C.j.1")
    sch.unroll("C.i.1")
    sch.vectorize("C.j.1")
    f = named(sch.program)
    assert f["log2_tile_registers"] > 5.9 and f["log2_register_spill"] > 0.9


def test_scheduled_programs_of_other_workloads_have_finite_features():
    conv = get_workload("conv2d_nchw")
    sch = Schedule(naive_program(conv.build(*conv.small_size)))
    sch.inline("Xpad")
    sch.vectorize("Y.init.q")
    named(sch.program)
    chain = get_workload("elementwise_chain")
    sch = Schedule(naive_program(chain.build(64)))
    sch.split("Z.i", [-1, 16])
    sch.vectorize("Z.i.1")
    sch.parallel("Z.i.0")
    f = named(sch.program)
    assert f["parallel_point_share"] > 0


def test_the_hardware_comes_from_the_machine_model_and_the_threads():
    assert Hardware.of(AVX512, threads=2) == Hardware(64, 32, 64, (48 << 10, 1 << 20, 32 << 20), 2)
    assert Hardware.of(AVX2).vector_bytes == 32 and Hardware.of(AVX2).vector_registers == 16


def test_a_register_tile_needs_twice_the_registers_of_an_avx2_target():
    prog = register_tiled(matmul(128, 128, 128)).program
    wide, narrow = named(prog), named(prog, Hardware.of(AVX2))
    assert narrow["log2_tile_registers"] == pytest.approx(wide["log2_tile_registers"] + 1, abs=0.05)
    assert wide["log2_register_spill"] == 0 < narrow["log2_register_spill"]
    assert narrow["vector_lane_fill"] == wide["vector_lane_fill"] > 0.99


def test_the_parallel_balance_follows_the_threads():
    sch = Schedule(naive_program(get_workload("elementwise_chain").build(48)))
    sch.split("Z.i", [3, -1])
    sch.parallel("Z.i.0")
    two, three = (named(sch.program, Hardware.of(AVX512, threads)) for threads in (2, 3))
    # Z holds a third of the points; its 3 chunks take 2 rounds of 2 threads, 1 round of 3
    assert two["parallel_balance"] == pytest.approx(0.75 / 3)
    assert three["parallel_balance"] == pytest.approx(1 / 3)


def test_a_pack_of_a_constant_weight_is_left_out_as_each_call_skips_it():
    comp = get_workload("matmul").build(64, 64, 64)
    varying = register_tiled(Schedule(naive_program(comp))).program
    weighted = register_tiled(Schedule(naive_program(comp.with_constants(["B"])))).program
    # The pack and the local tile's write-back, then the write-back alone.
    assert named(varying)["copy_blocks"] == 2 and named(weighted)["copy_blocks"] == 1
    np.testing.assert_array_equal(features(weighted, ON_AVX512),
                                  features(weighted.per_call, ON_AVX512))
