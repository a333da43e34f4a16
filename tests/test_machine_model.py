"""The machine model: a calibration on this machine gives sane figures in a tiny budget, the
model is cached per machine and target where the environment says, and its costs read as the
analytic model uses them."""

import dataclasses
import json

import pytest

from eqsched import machine_model as mm
from eqsched.backend import Target
from eqsched.machine_model import CalibrationError, MachineModel


@pytest.fixture(scope="module")
def host_model():
    return mm.calibrate(Target.host(), seconds=0.0005, repeats=3)


def test_a_tiny_calibration_of_the_host_gives_sane_figures(host_model):
    target = Target.host()
    assert host_model.target == "host"
    assert (host_model.vector_lanes, host_model.vector_registers) == (
        target.vector_lanes, target.vector_registers)
    assert 2e8 < host_model.hz < 1e10
    assert host_model.fma_per_cycle > 0 and host_model.fma_latency >= 1
    assert host_model.loads_per_cycle > 0 and host_model.stores_per_cycle > 0
    assert 0 < host_model.split_loads_per_cycle  # every one of its loads crosses a line
    one = host_model.bandwidth
    assert one["L1d"] >= one["L2"] >= one["L3"] >= one["DRAM"] > 0
    assert one["L1d"] > 2 * one["DRAM"]  # the clamp to monotone cannot make this true
    assert all(host_model.bandwidth_all_cores[level] >= one[level] for level in mm.LEVELS)
    assert host_model.peak_gflops > 1
    assert host_model.line_bytes in (32, 64, 128) and host_model.l1_sets * host_model.l1_ways > 0
    assert mm.PASSES <= host_model.passes <= mm.MAX_PASSES
    assert 1 <= host_model.reproduced <= host_model.passes
    assert host_model.calibrated_at.endswith("UTC") and host_model.load_average >= 0
    assert any(line.startswith("calibrated ") for line in host_model.describe())


def test_a_pass_slowed_by_a_neighbour_does_not_set_a_port_figure():
    # A busy SMT sibling halves the rates a pass reads (and lengthens a latency); the quiet
    # passes' figures are the ones kept.
    quiet = {"issue_width": 4.0, "fma_per_cycle": 2.0, "fma_latency": 4.0}
    contended = {"issue_width": 2.1, "fma_per_cycle": 1.2, "fma_latency": 4.4}
    slightly_off = {"issue_width": 3.9, "fma_per_cycle": 1.95, "fma_latency": 4.1}
    passes = [contended, quiet, slightly_off, contended]
    assert mm._best(passes) == quiet
    assert mm._reproduced(passes) == 2  # the quiet pass and the one within AGREEMENT of it
    # A best that no second pass comes near may itself be a contended reading among worse ones.
    assert mm._reproduced([contended, quiet, contended]) == 1


def test_a_pass_whose_clock_read_slow_or_whose_timer_misread_sets_no_figure():
    quiet = {"issue_width": 4.0, "fma_per_cycle": 2.0, "fma_latency": 4.0}
    # Slowed while timing the clock: every figure of the pass, in its cycles, reads too high.
    slow_clock = {"issue_width": 7.9, "fma_per_cycle": 3.9, "fma_latency": 2.0}
    misread = {"issue_width": 324.8, "fma_per_cycle": 1.98, "fma_latency": 4.1}
    usable = mm._usable([3.0e9, 1.5e9, 3.0e9, 2.9e9], [quiet, slow_clock, misread, quiet])
    assert len(usable) == 3 and usable[1]["issue_width"] is None
    assert mm._best(usable) == quiet
    assert mm._reproduced(usable) == 2


def test_a_call_stretched_by_an_interrupt_does_not_stop_the_rate_at_a_tiny_call(monkeypatch):
    # Each unit takes 1 us, each call 2 us of its own overhead; the first call is interrupted.
    calls = []

    def timed(call):
        call()
        return 0.05 if len(calls) == 1 else 2e-6 + calls[-1] * 1e-6

    monkeypatch.setattr(mm, "_cpu_seconds", timed)
    rate = mm._rate(calls.append, seconds=0.002, repeats=3)
    assert calls[-1] >= 1000 and 0.9e6 < rate <= 1e6


def test_a_figure_no_pass_could_read_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(mm.BOUNDS, "issue_width", (100.0, 200.0))
    with pytest.raises(CalibrationError, match=r"calibration of host: issue_width measured .* "
                                               r"outside 100\.\.200"):
        mm.calibrate(Target.host(), seconds=0.0002, repeats=1)


def test_an_unsteady_calibration_is_used_but_not_cached(tmp_path, monkeypatch,
                                                        synthetic_machine):
    monkeypatch.setenv("EQSCHED_CACHE_DIR", str(tmp_path))
    unsteady = dataclasses.replace(synthetic_machine, target="host", passes=10, reproduced=1)
    monkeypatch.setattr(mm, "calibrate", lambda target: unsteady)
    with pytest.warns(mm.CalibrationWarning, match="unsteady .* not cached"):
        assert mm.machine_model(Target.host()) == unsteady
    assert not mm.cache_path(Target.host()).exists()
    with pytest.warns(mm.CalibrationWarning):
        mm.recalibrate(Target.host())
    assert not mm.cache_path(Target.host()).exists()
    steady = dataclasses.replace(unsteady, reproduced=2)
    monkeypatch.setattr(mm, "calibrate", lambda target: steady)
    assert mm.recalibrate(Target.host()) == steady and mm.cache_path(Target.host()).exists()


def test_an_avx2_target_has_half_the_lanes_and_registers():
    if "avx2" not in Target.host().isa:
        pytest.skip("no AVX2 on this CPU")
    avx2 = mm.calibrate(Target.parse("host,-avx512f"), seconds=0.0005, repeats=3)
    assert (avx2.vector_lanes, avx2.vector_registers) == (8, 16)
    assert avx2.fma_per_cycle > 0 and avx2.bandwidth["L1d"] > avx2.bandwidth["DRAM"]


def test_an_impossible_figure_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(mm.BOUNDS, "hz", (1e12, 1e13))
    with pytest.raises(CalibrationError, match=r"calibration of host: hz measured .* outside"):
        mm.calibrate(Target.host(), seconds=0.0002, repeats=1)


def test_the_cache_file_round_trips_and_is_keyed_by_target(tmp_path, monkeypatch,
                                                            synthetic_machine):
    monkeypatch.setenv("EQSCHED_CACHE_DIR", str(tmp_path))
    host, avx2 = Target.host(), Target.parse("host,-avx512f")
    assert mm.cache_path(host) != mm.cache_path(avx2)
    assert mm.cache_path(avx2).parent == tmp_path and "host_-avx512f" in mm.cache_path(avx2).name
    stored = {host: dataclasses.replace(synthetic_machine, target="host"),
              avx2: dataclasses.replace(synthetic_machine, target="host,-avx512f",
                                        vector_lanes=8)}
    for target, model in stored.items():
        mm.save(model, mm.cache_path(target))
    for target, model in stored.items():
        assert mm.machine_model(target) == model  # read back, not measured
    assert json.loads(mm.cache_path(host).read_text())["version"] == mm.CALIBRATION_VERSION


def test_the_cache_honors_xdg_and_refuses_another_version(tmp_path, monkeypatch,
                                                           synthetic_machine):
    monkeypatch.delenv("EQSCHED_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert mm.cache_path(Target.host()).parent == tmp_path / "eqsched"
    old = {**synthetic_machine.to_json(), "version": mm.CALIBRATION_VERSION - 1}
    with pytest.raises(ValueError, match="version"):
        MachineModel.from_json(old)


def test_half_vectors_issue_at_the_half_width_rate_and_wider_ones_take_whole_vectors(
        synthetic_machine):
    # Units half as wide as the registers, like a double-pumped core: half vectors issue twice
    # as fast as whole ones.
    model = dataclasses.replace(synthetic_machine, fma_per_cycle=1.0, fma_per_cycle_half=2.0,
                                stores_per_cycle=0.5, stores_per_cycle_half=1.0)
    assert model.op_cycles("compute", 16) == 1.0
    assert model.op_cycles("compute", 8) == model.op_cycles("compute", 1) == 0.5
    assert model.op_cycles("compute", 32) == 2.0
    assert model.op_cycles("stores", 16) == 2.0
    assert model.instructions(8) == 1 and model.instructions(48) == 3


def test_an_unaligned_load_pays_the_split_rate_for_the_offsets_that_cross_a_line(
        synthetic_machine):
    # 2 loads a cycle, 1 across a line. A zmm (16 lanes) crosses a 64-byte line at 15 of 16
    # offsets, a ymm at 7 of 16, a 64-lane vector is four zmm.
    model = synthetic_machine
    assert model.unaligned_load_cycles(16) == pytest.approx(1 / 16 * 0.5 + 15 / 16 * 1.0)
    assert model.unaligned_load_cycles(8) == pytest.approx(9 / 16 * 0.5 + 7 / 16 * 1.0)
    assert model.unaligned_load_cycles(64) == pytest.approx(4 * model.unaligned_load_cycles(16))


def test_cores_share_a_level_as_calibrated(synthetic_machine):
    model = synthetic_machine  # lines of 64 bytes; DRAM 5 B/cycle alone, 6 on both cores
    assert model.fill_cycles("DRAM") == 64 / 5.0
    assert model.fill_cycles("DRAM", threads=2) == 64 / 3.0  # 6 B/cycle between two cores
    assert model.fill_cycles("L2", threads=2) == 64 / 48.0  # private: each core its own
    assert model.fill_cycles("DRAM", threads=8) == 64 / 3.0  # past the calibrated cores: as at 2
    assert model.peak_gflops == pytest.approx(2.0 * 16 * 2 * 3.0)
