"""The measurement runner: check before timing; crashes, hangs and running out of memory as error
values with a kind; a worker that dies with its parent, answers only the job asked and imports
nothing from the current directory."""

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from eqsched import runner, te
from eqsched.backend import CompileOptions, Target
from eqsched.expr import Const
from eqsched.ir import Block, Loop, LoopKind, map_nodes, naive_program
from eqsched.runner import (
    DETERMINISTIC,
    MIN_MAX_MEMORY,
    TRANSIENT,
    Measurement,
    TooLargeError,
    _drop_damaged_references,
    _Job,
    _reference_for,
    _Worker,
    _WorkerLost,
    buffer_bytes,
    check_fits_in_memory,
    check_max_memory,
    check_timeout,
    default_max_memory,
    kernel_inputs,
    measure,
    measure_side_by_side,
    shutdown,
    worker_pids,
)
from eqsched.schedule import Schedule
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
    assert m.info["backend"]["cpu_name"] and m.info["machine"]["cpu_model"]
    assert m.info["settings"] == {"repeats": 4, "warmup": 1, "seed": 0, "timeout_s": 120.0,
                                  "time_budget_s": None, "min_repeats": 1,
                                  "max_memory": default_max_memory(), "rounds": 1}
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


def test_programs_timed_side_by_side_take_turns_and_each_is_checked(matmul):
    wrong = _edit_block(matmul, "C.init", value=Const(1.0, "float32"))
    heard = []
    first, bad, second = measure_side_by_side([matmul, wrong, matmul], rounds=3, repeats=2,
                                              on_timing=heard.append)
    assert heard == [True, False]  # one job: compiled and checked, then timed in turn
    assert bad.correct is False and bad.times == []
    for m in (first, second):
        assert m.correct is True and len(m.times) == 3 * 2
        assert m.median_s == np.median(m.times) and m.info["settings"]["rounds"] == 3
    with pytest.raises(ValueError, match="rounds"):
        measure_side_by_side([matmul], rounds=0)


def _others_busy(seconds: float = 0.5) -> float:
    """Cores' worth of CPU time the rest of the machine used while this test slept `seconds`
    (infinite where /proc/stat does not say)."""
    before = runner.machine_busy_s()
    time.sleep(seconds)
    after = runner.machine_busy_s()
    return math.inf if before is None or after is None else (after - before) / seconds


@pytest.fixture
def idle_machine():
    """Skips the test unless the machine is idle, measured first: on a loaded machine (the
    suite's other workers, other users) other processes are there to be seen."""
    busy = _others_busy()
    if busy > 0.15:
        pytest.skip(f"needs an idle machine: other processes keep {busy:.2f} cores busy")


def test_on_an_idle_machine_a_timing_sees_no_other_process(idle_machine):
    # The worker's threads (a parallel program's helpers) are its own; so is the caller: a
    # thread of this process spinning beside the timing is the caller's work, not another
    # process's, and reported as such. The machine was idle when the test began, but the
    # suite's other worker may start a test meanwhile: of three timings, one must see no other
    # process (counting its own threads as others, every one would).
    sch = Schedule(naive_program(get_workload("matmul").build(256, 256, 256)))
    sch.parallel("C.i")
    two_threads = [measure(sch.program, repeats=10, contended_cores=0.5, retimes=0,
                           options=CompileOptions(threads=2)) for _ in range(3)]
    assert all(m.correct for m in two_threads)
    assert any(m.others_cores < 0.35 and m.caller_cores < 0.2 for m in two_threads)
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        beside_the_caller = [measure(naive_program(get_workload("matmul").build(16, 24, 8)),
                                     repeats=3, contended_cores=0.5, retimes=0)
                             for _ in range(3)]
    finally:
        stop.set()
        spinner.join()
    assert any(m.others_cores < 0.35 and m.caller_cores >= 0.5 for m in beside_the_caller)


def test_a_busy_process_beside_the_timing_is_seen_and_the_timing_taken_again(matmul):
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        unchecked = measure(matmul, repeats=3)
        again = measure(matmul, repeats=3, contended_cores=0.5, retimes=1)
    finally:
        spinner.kill()
        spinner.wait()
    # Nobody checks the first for contention: it is not padded to LOAD_WINDOW_S, and a few
    # microseconds of /proc/stat's 10 ms steps say nothing.
    assert unchecked.correct is True and unchecked.others_cores is None and unchecked.load >= 0
    # The spinner keeps a core busy; what else runs can only add to it. A counter step (10 ms
    # per core over the window) is the margin.
    assert again.others_cores >= 0.5 and again.retimed == 1 and len(again.times) == 3
    assert again.caller_cores is not None and again.caller_cores < again.others_cores
    with pytest.raises(ValueError, match="contended_cores"):
        measure(matmul, contended_cores=0)


def test_nothing_timed_waits_for_no_load_window(matmul):
    heard = []
    m = measure(matmul, repeats=0, contended_cores=0.5, on_timing=heard.append)
    assert m.correct is True and m.times == [] and m.others_cores is None and heard == []


def test_workers_measure_from_several_threads():
    from concurrent.futures import ThreadPoolExecutor

    progs = [naive_program(get_workload("matmul").build(8, 8, n)) for n in (3, 4, 5, 6)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda ip: measure(ip[1], repeats=2, worker=ip[0] % 2),
                                enumerate(progs)))
    assert all(m.correct for m in results)
    assert [m.info["program_hash"] for m in results] == [p.hash() for p in progs]


# ---- the worker process: dies with its parent, its own deadline, cap and import path ----------


def _hanging(prog):
    return prog.with_body((Loop("forever", 10**15, LoopKind.SERIAL, prog.body),))


def _job(job_id, prog, timeout_s=60.0, repeats=1):
    return _Job(job_id, (prog,), None, repeats, 0, 0, True, timeout_s, default_max_memory())


def _gone(pid):
    """Whether process `pid` has ended (a zombie waiting for its reaper has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _wait_until_gone(pid, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _gone(pid)


PARENT = """
import threading, time
from eqsched.ir import Loop, LoopKind, naive_program
from eqsched.runner import measure, worker_pids
from eqsched.workloads import get_workload

prog = naive_program(get_workload("matmul").build(8, 8, 8))
hanging = prog.with_body((Loop("forever", 10**15, LoopKind.SERIAL, prog.body),))
threading.Thread(target=measure, args=(hanging,), kwargs={"timeout_s": 600}, daemon=True).start()
while not worker_pids():
    time.sleep(0.01)
print(worker_pids()[0], flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_dies_with_its_parent_even_inside_a_hanging_kernel():
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, env=env,
                              text=True)
    worker = None
    try:
        worker = int(parent.stdout.readline())
        time.sleep(1.0)  # most likely inside the kernel by now; either way it must go
        parent.kill()  # kill -9: no atexit, no cleanup in the parent
        parent.wait(10)
        assert _wait_until_gone(worker), "the worker outlived its parent"
    finally:
        parent.kill()
        parent.wait(10)
        parent.stdout.close()
        if worker is not None and not _gone(worker):
            os.kill(worker, signal.SIGKILL)


def test_a_worker_outlives_the_thread_that_started_it(matmul):
    # Linux sends the parent-death signal when the starting *thread* ends; explore measures
    # from pool threads that end with each run, so workers are started from one that does not.
    started = threading.Thread(target=measure, args=(matmul,), kwargs={"repeats": 1,
                                                                       "worker": 4})
    started.start()
    started.join()
    pid = worker_pids()[4]
    time.sleep(0.5)  # a parent-death signal would have arrived by now
    assert measure(matmul, repeats=1, worker=4).correct is True
    assert worker_pids()[4] == pid


def test_the_worker_keeps_its_own_deadline_when_nobody_reads_its_reply(matmul):
    worker = _Worker()
    try:
        worker.send.send(_job(1, _hanging(matmul), timeout_s=1.0))
        # Its own deadline comes 2 s after the parent's, which never comes: nobody waits.
        assert worker.process.wait(60) == -signal.SIGALRM
    finally:
        worker.stop()


def test_the_worker_is_first_for_the_oom_killer_and_capped(matmul):
    assert measure(matmul, repeats=1, max_memory=1 << 30, worker=4).correct is True
    pid = worker_pids()[4]
    assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000"
    limits = Path(f"/proc/{pid}/limits").read_text()
    assert re.search(rf"Max data size\s+{1 << 30}\s", limits), limits


def test_a_workload_bigger_than_the_memory_cap_is_out_of_memory(matmul):
    # 1 GiB of output and 2 GiB of float64 reference, under a 512 MiB cap: a MemoryError in
    # the worker, reported as transient (a larger cap would do), not a crash of anything.
    huge = naive_program(get_workload("matmul").build(16384, 16384, 16))
    m = measure(huge, repeats=1, max_memory=512 << 20, worker=4)
    assert m.correct is False and m.error.startswith("out of memory: "), m.error
    assert m.error_kind == TRANSIENT
    assert measure(matmul, repeats=1, worker=4).correct is True
    # The kernel's own buffers: mm_exp_mm's intermediates C and D, 1 GiB each, are allocated
    # with the compiled kernel, before any reference is computed.
    wide = naive_program(get_workload("mm_exp_mm").build(16384, 1, 16384, 1))
    m = measure(wide, repeats=1, max_memory=512 << 20, worker=4)
    assert m.error.startswith("out of memory: ") and "(at kernel.py:" in m.error, m.error
    assert m.error_kind == TRANSIENT


def test_the_buffer_estimate_counts_every_tensor_in_float32_and_the_references_float64():
    from eqsched.reference import BUDGET_BYTES

    mm = get_workload("mm_exp_mm").build(16, 8, 4, 2)  # A, B, E in; C, D, F computed
    elements = 16 * 8 + 8 * 4 + 16 * 4 + 16 * 4 + 4 * 2 + 16 * 2
    assert buffer_bytes(mm) == elements * (4 + 8) + BUDGET_BYTES
    check_fits_in_memory(mm, MIN_MAX_MEMORY)
    huge = get_workload("matmul").build(65536, 65536, 16)
    with pytest.raises(TooLargeError, match=r"needs about 48.\d GiB .* cap of 1 GiB"):
        check_fits_in_memory(huge, 1 << 30)


def test_the_default_memory_cap_is_half_of_what_the_machine_or_its_container_allows(
        tmp_path, monkeypatch):
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    unlimited, limited = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    unlimited.write_text("max\n")
    monkeypatch.setattr(runner, "_CGROUP_LIMITS", (str(unlimited), str(tmp_path / "none")))
    assert runner.machine_memory() == physical
    limited.write_text(f"{4 << 30}\n")
    monkeypatch.setattr(runner, "_CGROUP_LIMITS", (str(unlimited), str(limited)))
    assert runner.machine_memory() == min(physical, 4 << 30)
    assert default_max_memory() == max(256 << 20, min(physical, 4 << 30) // 2)


def test_bad_memory_caps_are_a_caller_error(matmul):
    for bad in (0, -1, 1 << 20, 2.5e9, "1G", True):
        with pytest.raises(ValueError, match="max memory"):
            measure(matmul, max_memory=bad)
    assert check_max_memory(1 << 30) == 1 << 30


def test_modules_in_the_current_directory_do_not_reach_the_worker(matmul, tmp_path,
                                                                  monkeypatch):
    # `python -m` puts the current directory first on sys.path: a stray statistics.py there
    # once made every measurement "worker process died".
    stray = "raise SystemExit('a stray module from the current directory was imported')\n"
    for name in ("statistics.py", "numpy.py"):
        (tmp_path / name).write_text(stray)
    (tmp_path / "eqsched").mkdir()
    (tmp_path / "eqsched" / "__init__.py").write_text(stray)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", *sys.path])  # as `python -m` leaves it
    shutdown()  # the next measure starts its worker here
    m = measure(matmul, repeats=1)
    assert m.error is None and m.correct is True, m.error


class _WritesToStderrAndAborts:
    """Unpickled in the worker, it says something on stderr and aborts: what LLVM does on a
    fatal error ("LLVM ERROR: ..."), which no Python handler sees."""

    def __reduce__(self):
        return exec, ("import os, sys\nsys.stderr.write('LLVM ERROR: pretend it broke\\n')\n"
                      "sys.stderr.flush()\nos.abort()",)


def test_what_the_worker_says_on_stderr_is_in_the_error_not_on_the_terminal(matmul, capfd):
    m = measure(matmul, repeats=1, options=_WritesToStderrAndAborts(), worker=4)
    assert m.error == ("worker process died: killed by SIGABRT; its stderr ended: "
                       "LLVM ERROR: pretend it broke")
    assert m.error_kind == DETERMINISTIC
    assert "pretend" not in capfd.readouterr().err
    assert measure(matmul, repeats=1, worker=4).correct is True


def test_a_forked_child_measures_in_its_own_worker_and_leaves_the_parents_alone(matmul):
    assert measure(matmul, repeats=1, worker=4).correct is True
    parents = worker_pids()[4]
    child = os.fork()
    if child == 0:  # never returns into pytest
        ok = False
        try:
            ok = (worker_pids() == {} and measure(matmul, repeats=1, worker=4).correct is True
                  and worker_pids()[4] != parents)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert worker_pids()[4] == parents and measure(matmul, repeats=1, worker=4).correct is True


# ---- one reply per job ------------------------------------------------------------------------


def test_a_reply_to_another_job_is_an_error_and_the_worker_is_stopped(matmul):
    worker = _Worker()
    try:
        worker.send.send(_job(1, matmul))  # a job whose reply nobody collected
        with pytest.raises(_WorkerLost, match=r"out of turn \(job 2 asked, reply 1 received"):
            worker.ask(_job(2, naive_program(get_workload("matmul").build(8, 8, 8))))
        assert not worker.alive()
    finally:
        worker.stop()


def test_an_exception_in_the_caller_mid_job_leaves_no_reply_behind(matmul):
    def fails(started):
        raise RuntimeError("the caller failed while the job ran")

    with pytest.raises(RuntimeError, match="the caller failed"):
        measure(matmul, repeats=3, on_timing=fails, worker=4)
    other = naive_program(get_workload("matmul").build(8, 8, 8))
    m = measure(other, repeats=1, worker=4)
    # Not the reply to the job above (3 times, another program) stamped with this hash.
    assert m.correct is True and len(m.times) == 1 and m.info["program_hash"] == other.hash()


@pytest.mark.parametrize("bad", [math.inf, math.nan, 0, -1.0, 1e300, "5", None])
def test_bad_timeouts_are_refused_before_anything_runs(matmul, bad):
    with pytest.raises(ValueError, match="timeout"):
        measure(matmul, timeout_s=bad)
    assert check_timeout(2) == 2.0


# ---- what the check catches -------------------------------------------------------------------


def test_an_intermediate_read_before_it_is_written_fails_the_check():
    # mm_exp_mm without C's init accumulates into whatever C held. Fresh memory of this size
    # comes zeroed from the system, so without the NaN fill this program passed.
    prog = naive_program(get_workload("mm_exp_mm").build(64, 4, 1024, 4))
    assert prog.block("C.init")
    no_init = prog.with_body(prog.body[1:])
    m = measure(no_init, repeats=1)
    assert m.correct is False and m.error is None and "elements off" in m.check_message
    assert m.error_kind == DETERMINISTIC


def test_cached_inputs_and_expected_outputs_a_kernel_wrote_into_are_dropped(matmul):
    # In the worker the check runs after every candidate; here, on this process's cache.
    ref = _reference_for(matmul, seed=12345)
    assert ref.intact() and _drop_damaged_references() == 0
    ref.expected["C"][3, 5] += 1.0  # what a stray store past some array's end could do
    assert not ref.intact()
    assert _drop_damaged_references() == 1
    assert _reference_for(matmul, seed=12345) is not ref  # rebuilt


WATCHED = """
import os, sys, threading, time
from eqsched.runner import _watch_parent

parent, hang_up = int(sys.argv[1]), sys.argv[2] == "hang-up"
requests, writer = os.pipe()
threading.Thread(target=_watch_parent, args=(parent, requests), daemon=True).start()
if hang_up:
    os.close(writer)
time.sleep(30)
print("the watchdog let it live")
"""


@pytest.mark.parametrize("how", ["hang-up", "reparented"])
def test_the_watchdog_ends_a_worker_whose_parent_is_gone(how):
    # Behind the parent-death signal (Linux only, and tied to a thread): a closed request pipe,
    # or a parent process id that is no longer the one the worker was started by.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    parent = os.getpid() if how == "hang-up" else 1 << 22  # no process has that id
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", WATCHED, str(parent), how], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "let it live" not in done.stdout, done
    assert time.monotonic() - started < 25


def test_a_preparation_from_constants_is_checked_but_not_timed():
    """A column sum of a constant weight (4096 x 64) is made once, as a kernel bound to the
    weight makes it; each timed call then scales a 1 x 64 row, some hundred times less work."""
    A = te.placeholder((1, 64), "A")
    W = te.placeholder((4096, 64), "W")
    r = te.reduce_axis(4096, "r")
    colsum = te.compute((64,), lambda j: te.sum_(W[r, j], axis=r), "colsum")
    out = te.compute((1, 64), lambda i, j: A[i, j] * colsum[j], "out")
    varying = te.Computation("scaled", [out])
    prepared, each_call = (measure(naive_program(comp), repeats=5, min_repeats=5)
                           for comp in (varying.with_constants(["W"]), varying))
    assert prepared.correct and each_call.correct
    assert prepared.min_s * 10 < each_call.min_s
