"""A team of native threads sharing the iterations of parallel loops.

    team = team_for(threads)                      # one per thread count and process
    team.run(chunk_fn, args, extent)              # a kernel's packed chunk function, its pointers

Handing a chunk to a helper through Python locks wakes a sleeping thread on another core (a
futex wake; under a hypervisor an idle vCPU's wake-up), which cost tens of microseconds on every
parallel nest of every call. Here the helpers are native loops (started from Python threads, so
ctypes releases the GIL for their whole life) that spin on the team's generation word for a
while after each loop, as OpenMP's and TVM's thread pools do, and sleep on it (a futex) only
after that: nests that follow one another in a call, and calls made back to back, pay a cache
line's transfer. The iterations are claimed from a shared counter a few at a time (dynamic
scheduling): on a shared machine one core can run slower than the other for a while, and a
static split would wait for it.

A chunk function is a kernel's packed entry `fn(ptr args, i64 lo, i64 hi)` (`lower`), which
loads its buffer pointers from `args`. Glue code calls the team natively (`Team.run_address`,
`Team.state_address`), so a chain of kernels stays one native call with parallel loops in it.

Linux only (futex), as the project is.

See docs/ARCHITECTURE.md §7 Backend and target.
"""

from __future__ import annotations

import ctypes
import os
import threading

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from .target import create_target_machine, host, target_machine

I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()

# The team's state: one 64-byte line per word that two threads write, so they do not share one.
GENERATION = 0  # i32 futex word: bumped once per parallel loop
SLEEPERS = 8  # helpers asleep on the generation word
FUNCTION, ARGS, EXTENT, CHUNK = 16, 17, 18, 19  # the loop, written before the bump
NEXT = 24  # the next unclaimed iteration
PENDING = 32  # helpers still working on the loop
STATE_WORDS = 40

# How long a helper spins before it sleeps: a bound on busy-waiting in time-stamp counter ticks
# (a few hundred microseconds at the clocks x86 cores run), not a tuned figure.
SPIN_TICKS = 1_000_000
# Past this much spinning each step yields the core: the scheduler may have put the two
# spinning threads on one core (a woken helper on its waker's), where spinning would starve the
# one the other waits for.
YIELD_TICKS = 20_000
SYS_FUTEX, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 202, 128, 129
CHUNKS_PER_THREAD = 8  # claims of a loop per thread, at most: granularity vs counter traffic


class Team:
    """`helpers` native threads, and the calling thread, sharing each parallel loop run."""

    def __init__(self, helpers: int):
        self.helpers = helpers
        self._state = np.zeros(STATE_WORDS + 8, np.int64)  # 64-byte aligned below
        start = (-self._state.ctypes.data % 64) // 8
        self._state = self._state[start:start + STATE_WORDS]
        self.state_address = self._state.ctypes.data
        self.run_address = _engine().get_function_address("team_run")
        self._run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_int64,
                                     ctypes.c_int64)(self.run_address)
        self._serve = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(
            _engine().get_function_address("team_serve"))
        self._start()

    def _start(self) -> None:
        """A fresh state and lock, and the helpers started on them: at creation, and again in a
        forked child, which inherits the team (chains hold its addresses) but not its threads."""
        self.lock = threading.Lock()  # one loop at a time: kernels from several threads take turns
        self._state[:] = 0
        for index in range(self.helpers):
            threading.Thread(target=self._serve, args=(self.state_address,), daemon=True,
                             name=f"eqsched-team-{self.helpers}-{index}").start()

    def chunk(self, extent: int) -> int:
        """Iterations per claim: at least one, at most CHUNKS_PER_THREAD claims a thread."""
        return max(1, extent // (CHUNKS_PER_THREAD * (self.helpers + 1)))

    def run(self, function: int, args: int, extent: int) -> None:
        """Run `function(args, lo, hi)` over `range(extent)` on this thread and the helpers."""
        with self.lock:
            self._run(self.state_address, function, args, extent, self.chunk(extent),
                      self.helpers)


_teams: dict[int, Team] = {}
_teams_lock = threading.Lock()


def team_for(threads: int) -> Team:
    """The process's team of `threads` threads (the caller and threads - 1 helpers)."""
    if threads < 2:
        raise ValueError(f"a team shares a loop among two or more threads, not {threads}")
    with _teams_lock:
        if threads not in _teams:
            _teams[threads] = Team(threads - 1)
        return _teams[threads]


def _restart_teams_after_fork() -> None:
    global _teams_lock
    _teams_lock = threading.Lock()
    for team in _teams.values():
        team._start()


os.register_at_fork(after_in_child=_restart_teams_after_fork)

_engine_made: llvm.ExecutionEngine | None = None


def _engine() -> llvm.ExecutionEngine:
    global _engine_made
    if _engine_made is None:
        module = llvm.parse_assembly(str(_module()))
        module.verify()
        engine = llvm.create_mcjit_compiler(module, create_target_machine(3, None))
        engine.finalize_object()
        _engine_made = engine
    return _engine_made


def _module() -> ir.Module:
    module = ir.Module(name="team")
    module.triple = host()["triple"]
    module.data_layout = str(target_machine(3, None).target_data)
    _Emitter(module).emit()
    return module


class _Emitter:
    """team_serve(state): a helper's loop; team_run(state, fn, args, extent, chunk, helpers):
    one parallel loop from the caller; both claim iterations with team_work."""

    def __init__(self, module: ir.Module):
        self.pause = ir.Function(module, ir.FunctionType(ir.VoidType(), []),
                                 "llvm.x86.sse2.pause")
        self.ticks = ir.Function(module, ir.FunctionType(I64, []), "llvm.readcyclecounter")
        self.syscall = ir.Function(module, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
        self.sched_yield = ir.Function(module, ir.FunctionType(I32, []), "sched_yield")
        self.work = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), "team_work")
        self.work.linkage = "internal"
        self.serve = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), "team_serve")
        self.run = ir.Function(module, ir.FunctionType(ir.VoidType(),
                                                       [PTR, PTR, PTR, I64, I64, I64]), "team_run")
        self.chunk_type = ir.FunctionType(ir.VoidType(), [PTR, I64, I64])

    @staticmethod
    def word(b: ir.IRBuilder, state: ir.Value, index: int) -> ir.Value:
        return b.gep(state, [ir.Constant(I64, index)], inbounds=True, source_etype=I64)

    def emit(self) -> None:
        self._work()
        self._serve()
        self._run()

    def _work(self) -> None:
        """Claim `chunk` iterations at a time until none are left, running each claim."""
        fn = self.work
        state = fn.args[0]
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        loop, body, done = (fn.append_basic_block(n) for n in ("claim", "body", "done"))
        # Typed as a pointer to the chunk's signature, so llvmlite can call it (printed `ptr`).
        function = b.load(self.word(b, state, FUNCTION), typ=self.chunk_type.as_pointer())
        args = b.load(self.word(b, state, ARGS), typ=PTR)
        extent = b.load(self.word(b, state, EXTENT), typ=I64)
        chunk = b.load(self.word(b, state, CHUNK), typ=I64)
        b.branch(loop)
        b.position_at_end(loop)
        lo = b.atomic_rmw("add", self.word(b, state, NEXT), chunk, "monotonic")
        b.cbranch(b.icmp_signed("<", lo, extent), body, done)
        b.position_at_end(body)
        hi = b.add(lo, chunk)
        hi = b.select(b.icmp_signed("<", hi, extent), hi, extent)
        b.call(function, [args, lo, hi])
        b.branch(loop)
        b.position_at_end(done)
        b.ret_void()

    def _serve(self) -> None:
        """Wait for the generation word to move (spin, then sleep on it), work, report done."""
        fn = self.serve
        state = fn.args[0]
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        wait, check, asleep, got = (fn.append_basic_block(n)
                                    for n in ("wait", "check", "asleep", "got"))
        generation = self.word(b, state, GENERATION)
        seen = b.alloca(I32)
        since = b.alloca(I64)
        b.store(ir.Constant(I32, 0), seen)  # the team's first loop is generation 1
        b.store(b.call(self.ticks, []), since)
        b.branch(wait)

        b.position_at_end(wait)
        current = b.load_atomic(generation, "acquire", 4, typ=I32)
        b.cbranch(b.icmp_unsigned("!=", current, b.load(seen)), got, check)

        b.position_at_end(check)
        spun = b.sub(b.call(self.ticks, []), b.load(since))
        self._spin_step(b, spun)
        b.cbranch(b.icmp_unsigned(">", spun, ir.Constant(I64, SPIN_TICKS)), asleep, wait)

        b.position_at_end(asleep)
        # Dekker with team_run: count ourselves asleep, then look again (both seq_cst), so a
        # bump we miss here sees us counted and wakes us; the futex sleeps only if the word
        # still holds `seen`.
        sleepers = self.word(b, state, SLEEPERS)
        b.atomic_rmw("add", sleepers, ir.Constant(I64, 1), "seq_cst")
        again = b.load_atomic(generation, "seq_cst", 4, typ=I32)
        with b.if_then(b.icmp_unsigned("==", again, b.load(seen))):
            # syscall's arguments are longs: every one passed 64 bits wide.
            b.call(self.syscall, [ir.Constant(I64, SYS_FUTEX), generation,
                                  ir.Constant(I64, FUTEX_WAIT_PRIVATE),
                                  b.zext(b.load(seen), I64), ir.Constant(PTR, None)])
        b.atomic_rmw("sub", sleepers, ir.Constant(I64, 1), "seq_cst")
        b.store(b.call(self.ticks, []), since)
        b.branch(wait)

        b.position_at_end(got)
        b.store(current, seen)
        b.call(self.work, [state])
        b.atomic_rmw("sub", self.word(b, state, PENDING), ir.Constant(I64, 1), "release")
        b.store(b.call(self.ticks, []), since)
        b.branch(wait)

    def _spin_step(self, b: ir.IRBuilder, spun: ir.Value) -> None:
        """One step of a spin that has lasted `spun` ticks: a pause, or a yield of the core."""
        with b.if_else(b.icmp_unsigned(">", spun, ir.Constant(I64, YIELD_TICKS))) as (late, early):
            with late:
                b.call(self.sched_yield, [])
            with early:
                b.call(self.pause, [])

    def _run(self) -> None:
        """Publish the loop, bump the generation, wake sleepers, work, wait for the helpers."""
        fn = self.run
        state, function, args, extent, chunk, helpers = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.store(b.ptrtoint(function, I64), self.word(b, state, FUNCTION))
        b.store(b.ptrtoint(args, I64), self.word(b, state, ARGS))
        b.store(extent, self.word(b, state, EXTENT))
        b.store(chunk, self.word(b, state, CHUNK))
        # Plain stores: no helper touches these words between its report on the last loop
        # and the bump below, which publishes them.
        b.store(ir.Constant(I64, 0), self.word(b, state, NEXT))
        b.store(helpers, self.word(b, state, PENDING))
        generation = self.word(b, state, GENERATION)
        b.atomic_rmw("add", generation, ir.Constant(I32, 1), "seq_cst")
        sleeping = b.load_atomic(self.word(b, state, SLEEPERS), "seq_cst", 8, typ=I64)
        with b.if_then(b.icmp_unsigned("!=", sleeping, ir.Constant(I64, 0))):
            b.call(self.syscall, [ir.Constant(I64, SYS_FUTEX), generation,
                                  ir.Constant(I64, FUTEX_WAKE_PRIVATE),
                                  ir.Constant(I64, 2**31 - 1)])
        b.call(self.work, [state])
        start = b.call(self.ticks, [])
        wait, idle, done = (fn.append_basic_block(n) for n in ("wait", "idle", "done"))
        b.branch(wait)
        b.position_at_end(wait)
        pending = b.load_atomic(self.word(b, state, PENDING), "acquire", 8, typ=I64)
        b.cbranch(b.icmp_unsigned("==", pending, ir.Constant(I64, 0)), done, idle)
        b.position_at_end(idle)
        self._spin_step(b, b.sub(b.call(self.ticks, []), start))
        b.branch(wait)
        b.position_at_end(done)
        b.ret_void()


__all__ = ["Team", "team_for"]
