"""A team shares a parallel loop's iterations among native threads: every iteration runs once,
in claims of any size, whether the helpers were spinning or asleep, from any calling thread and
in a forked child."""

import os
import signal
import time
from dataclasses import replace

import numpy as np
import pytest

from eqsched.backend import CompileOptions, aligned_empty, compile_program
from eqsched.backend import team as team_module
from eqsched.backend.chain import Chain
from eqsched.backend.team import CHUNKS_PER_THREAD, team_for
from eqsched.ir import LoopKind, naive_program
from eqsched.schedule import Schedule
from eqsched.workloads import get_workload

rng = np.random.default_rng(0)


def parallel_matmul(m: int, n: int, k: int):
    prog = naive_program(get_workload("matmul").build(m, n, k))
    return prog.with_body(tuple(replace(lp, kind=LoopKind.PARALLEL) for lp in prog.body))


def operands(m: int, n: int, k: int):
    a, b, c = aligned_empty((m, k)), aligned_empty((k, n)), aligned_empty((m, n))
    a[...], b[...] = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    c.fill(np.nan)
    return a, b, c


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_every_iteration_runs_once_whatever_the_claims(threads):
    # 13 rows among 2-5 threads, then 200 rows: claims of one row and of several.
    for m in (13, 200):
        kernel = compile_program(parallel_matmul(m, 10, 7), CompileOptions(threads=threads))
        a, b, c = operands(m, 10, 7)
        kernel(a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_claims_are_coarse_enough_for_a_long_loop_and_single_for_a_short_one():
    team = team_for(2)
    assert team.chunk(4) == 1 and team.chunk(3) == 1
    assert team.chunk(1600) == 1600 // (CHUNKS_PER_THREAD * 2)


def test_a_split_loop_with_a_remainder_runs_its_tail_once_on_a_team():
    # 197 = 12 * 16 + 5: the parallel piece's last step is partial, and the team's claims are
    # single steps, so the tail's chunk is one of many.
    comp = get_workload("matmul").build(197, 24, 8)
    s = Schedule(naive_program(comp))
    s.split("C.i", [13, 16])
    s.split("C.init.i", [13, 16])
    s.parallel("C.init.i.0")
    s.parallel("C.i.0")
    kernel = compile_program(s.program, CompileOptions(threads=2))
    a, b, c = operands(197, 24, 8)
    kernel(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_sleeping_helpers_wake_for_the_next_loop():
    kernel = compile_program(parallel_matmul(16, 8, 8), CompileOptions(threads=2))
    a, b, c = operands(16, 8, 8)
    for _ in range(3):
        kernel(a, b, c)
        # Longer than any spin (SPIN_TICKS at a clock above 0.1 GHz): the helper goes to sleep.
        time.sleep(team_module.SPIN_TICKS / 1e8)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_a_forked_child_restarts_the_teams_its_kernels_and_chains_hold():
    kernel = compile_program(parallel_matmul(16, 8, 8), CompileOptions(threads=2))
    a, b, c = operands(16, 8, 8)
    chain = Chain([(kernel, (a, b, c))])  # the team's addresses are compiled into its glue
    kernel(a, b, c)  # the parent's team runs before the fork
    pid = os.fork()
    if pid == 0:  # the child: its parent's helper threads are gone
        ok = True
        for run in (lambda: kernel(a, b, c), chain):
            c.fill(np.nan)
            run()
            ok = ok and np.allclose(c, a @ b, rtol=1e-5, atol=1e-5)
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60  # a child waiting on helpers it lacks would never end
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on its inherited team")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_a_team_has_two_threads_or_more():
    with pytest.raises(ValueError, match="two or more threads, not 1"):
        team_for(1)
