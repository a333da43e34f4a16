"""The measurement runner: check before timing, and crashes or hangs as error values."""

from dataclasses import replace

import numpy as np
import pytest

from eqsched.backend import CompileOptions, Target
from eqsched.expr import Const
from eqsched.ir import Block, Loop, LoopKind, map_nodes, naive_program
from eqsched.runner import (
    DETERMINISTIC,
    TRANSIENT,
    Measurement,
    default_max_memory,
    kernel_inputs,
    measure,
)
from eqsched.workloads import get_workload


@pytest.fixture(scope="module")
def matmul():
    return naive_program(get_workload("matmul").build(16, 24, 8))


def _edit_block(prog, name, **changes):
    def edit(node):
        if isinstance(node, Block) and node.name == name:
            return replace(node, **changes)
        return None

    return prog.with_body(map_nodes(prog.body, edit))


def test_a_correct_program_is_checked_then_timed(matmul):
    m = measure(matmul, repeats=4, warmup=1)
    assert m.error is None, m.error
    assert m.correct is True and m.max_err < 1e-5
    assert len(m.times) == 4 and 0 < m.min_s <= m.median_s
    assert m.gflops == pytest.approx(2 * 16 * 24 * 8 / m.median_s / 1e9)
    assert m.info["backend"]["cpu_name"] and m.info["machine"]["peak_gflops_per_core"] > 0
    assert m.info["settings"] == {"repeats": 4, "warmup": 1, "seed": 0, "timeout_s": 120.0,
                                  "time_budget_s": None, "min_repeats": 1,
                                  "max_memory": default_max_memory()}
    assert m.error_kind is None
    assert m.info["program_hash"] == matmul.hash()
    assert isinstance(m.to_json()["times"], list)


def test_the_kernel_gets_aligned_copies_of_inputs_the_allocator_put_anywhere(matmul):
    # Where numpy puts an array depends on earlier allocations; the timing must not (§11).
    raw = np.arange(16 * 8 + 24 * 8 + 4, dtype=np.float32)
    inputs = {"A": raw[1:1 + 16 * 8].reshape(16, 8),  # 4 bytes past whatever raw's start is
              "B": raw[3 + 16 * 8:3 + 16 * 8 + 8 * 24].reshape(8, 24)}
    kept = [kernel_inputs(matmul, inputs) for _ in range(8)]  # live, so each lands elsewhere
    for args in kept:
        assert list(args) == ["A", "B"]
        for name, array in args.items():
            assert array.ctypes.data % 64 == 0
            assert np.array_equal(array, inputs[name]) and not np.may_share_memory(array, raw)


def test_the_target_reaches_the_worker(matmul):
    avx2 = CompileOptions(target=Target.parse("host,-avx512f"), threads=1)
    m = measure(matmul, repeats=1, warmup=0, options=avx2)
    assert m.error is None and m.correct
    assert m.info["backend"]["target"] == "host,-avx512f"
    assert m.info["backend"]["vector_bits"] == 256


def test_a_wrong_program_is_reported_and_not_timed(matmul):
    wrong = _edit_block(matmul, "C.init", value=Const(1.0, "float32"))
    m = measure(wrong, repeats=3)
    assert m.correct is False and m.error is None
    assert m.times == [] and m.median_s is None and m.gflops is None
    assert m.max_err == pytest.approx(1.0, rel=1e-3)
    assert "384 of 384 elements off" in m.check_message
    assert m.error_kind == DETERMINISTIC  # measuring it again would not help


def test_outputs_the_kernel_never_writes_fail_the_check(matmul):
    m = measure(matmul.with_body(()), repeats=1)
    assert m.correct is False and "elements off" in m.check_message


def test_unchecked_runs_are_timed_without_a_verdict(matmul):
    wrong = _edit_block(matmul, "C.init", value=Const(1.0, "float32"))
    m = measure(wrong, repeats=2, check=False)
    assert m.correct is None and len(m.times) == 2


def test_a_crashing_kernel_becomes_an_error_and_the_next_measure_works(matmul):
    update = matmul.block("C.update")
    i, j = update.indices
    crashing = _edit_block(matmul, "C.update", indices=(i + 10**12, j))  # far outside C
    m = measure(crashing, repeats=1)
    assert isinstance(m, Measurement) and m.correct is False
    assert m.error == "worker process died: killed by SIGSEGV"
    assert m.error_kind == DETERMINISTIC  # the kernel crashes itself: it would again
    assert "machine" in m.info
    assert measure(matmul, repeats=1).correct is True


def test_a_hanging_kernel_times_out_and_the_next_measure_works(matmul):
    hanging = matmul.with_body((Loop("forever", 10**15, LoopKind.SERIAL, matmul.body),))
    m = measure(hanging, repeats=1, timeout_s=2)
    assert m.correct is False and m.error.startswith("timed out after 2 s")
    assert m.error_kind == TRANSIENT  # on a quieter machine it might finish
    assert measure(matmul, repeats=1).correct is True


def test_an_exception_in_the_worker_is_an_error_value(matmul):
    broken = _edit_block(matmul, "C.update", buffer="NoSuchBuffer")
    m = measure(broken, repeats=1)
    assert m.correct is False and m.error and "NoSuchBuffer" in m.error
    assert m.error_kind == DETERMINISTIC


def test_negative_repeats_are_a_caller_error(matmul):
    with pytest.raises(ValueError, match="repeats"):
        measure(matmul, repeats=-1)


def test_a_time_budget_stops_timing_after_one_run(matmul):
    m = measure(matmul, repeats=50, warmup=5, time_budget_s=0.0)
    assert m.correct is True and len(m.times) == 1


def test_a_time_budget_still_times_min_repeats_runs(matmul):
    assert len(measure(matmul, repeats=50, time_budget_s=0.0, min_repeats=3).times) == 3
    assert len(measure(matmul, repeats=2, time_budget_s=0.0, min_repeats=3).times) == 2
    with pytest.raises(ValueError, match="min_repeats"):
        measure(matmul, min_repeats=0)


def test_the_caller_hears_when_timing_starts_and_ends(matmul):
    heard = []
    m = measure(matmul, repeats=2, on_timing=heard.append)
    assert m.correct is True and heard == [True, False]
    heard.clear()
    wrong = _edit_block(matmul, "C.init", value=Const(1.0, "float32"))
    assert measure(wrong, repeats=2, on_timing=heard.append).correct is False
    assert heard == []  # a wrong program is not timed


def test_workers_measure_from_several_threads():
    from concurrent.futures import ThreadPoolExecutor

    progs = [naive_program(get_workload("matmul").build(8, 8, n)) for n in (3, 4, 5, 6)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda ip: measure(ip[1], repeats=2, worker=ip[0] % 2),
                                enumerate(progs)))
    assert all(m.correct for m in results)
    assert [m.info["program_hash"] for m in results] == [p.hash() for p in progs]
