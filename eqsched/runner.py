"""Measure a loop program: compile, check against the reference, time, in a worker process.

A generated kernel can crash (a bad index segfaults), hang or ask for more memory than the
machine has. Everything that runs generated code happens in a persistent worker process (a fresh
interpreter, never a fork), so a crash, a timeout or running out of memory becomes a
`Measurement` with an `error` and an `error_kind`, and the caller goes on; the next call starts a
new worker. The worker dies with its parent, keeps its own deadline and memory cap, imports
nothing from the current directory, and its stderr ends up in the error, not on the terminal.

    m = measure(prog, repeats=10)
    m.correct, m.median_s, m.gflops, m.error, m.error_kind

See docs/ARCHITECTURE.md §11 Measurement.
"""

from __future__ import annotations

import atexit
import errno
import itertools
import json
import math
import os
import queue
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from . import machine
from .backend import CompileOptions, aligned_copy, compile_program
from .ir import Program, naive_program
from .reference import BUDGET_BYTES as REFERENCE_CHUNK_BYTES
from .reference import compare, random_inputs, reference, tolerance
from .te import Computation

DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 86400.0  # a day: past it a timeout is a typo (and inf overflows the pipe's poll)
MIN_MAX_MEMORY = 256 << 20  # an idle worker (interpreter, numpy, LLVM) holds about 100 MiB
# Past it a cap is a typo, and past 8 EiB setrlimit overflows (in the worker, after compiling).
MAX_MAX_MEMORY = 1 << 60
# Why a measurement has no valid result. A transient failure (timed out, the worker died or was
# killed, out of memory) says nothing about the program and is worth measuring again; a
# deterministic one (compile error, wrong result, a crashing kernel) would fail the same way.
TRANSIENT = "transient"
DETERMINISTIC = "deterministic"
_REFERENCES_KEPT = 4  # per worker: candidates of one workload share one reference
# The worker's own deadline comes this long after the parent's, so the parent, when alive,
# reports the timeout itself; the worker's deadline is for when the parent is gone or stuck.
_WORKER_GRACE_S = 2.0
# The shortest window over which other processes' CPU use means something: /proc/stat counts in
# 10 ms steps, ticked every few ms per core, so over 0.2 s it reads within about 0.1 core.
LOAD_WINDOW_S = 0.2
_STDERR_KEPT = 600  # characters of the worker's stderr quoted in an error
# Signals a kernel raises itself: the same program would crash the same way.
_CRASHES = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
_OUT_OF_MEMORY_SIGNS = ("MemoryError", "bad_alloc", "out of memory", "Cannot allocate memory")


@dataclass
class Measurement:
    """The outcome of `measure`. `error` is set when no result could be produced at all
    (compile error, crash, timeout, out of memory); a wrong result is `correct=False` with
    `check_message`. `error_kind` says why there is no valid result, when there is none:
    TRANSIENT (worth measuring again) or DETERMINISTIC (the default for an error or a wrong
    result: only the runner knows a failure was not the program's)."""

    correct: bool | None  # None: not checked
    max_err: float | None = None
    median_s: float | None = None
    min_s: float | None = None
    times: list[float] = field(default_factory=list)
    gflops: float | None = None
    error: str | None = None
    check_message: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    error_kind: str | None = None
    # Cores' worth of CPU time other processes used while the candidate was timed: the
    # machine's busy time minus the worker's and its caller's (the process that measures,
    # like explore's), and the 1-minute load average after it: a neighbour process can make
    # a timing 2-3x slow (docs/ARCHITECTURE.md §11, §17.5). `caller_cores` is the caller's
    # own share, its interference with itself (explore's search waits: about 0). None when
    # not known: nothing timed, no /proc, or a timing shorter than LOAD_WINDOW_S that no
    # contention check asked to pad.
    others_cores: float | None = None
    load: float | None = None
    caller_cores: float | None = None
    retimed: int = 0  # timings taken again because other processes competed (contended_cores)

    def __post_init__(self) -> None:
        if self.error_kind is None and (self.error is not None or self.correct is False):
            self.error_kind = DETERMINISTIC
        if self.error_kind not in (None, TRANSIENT, DETERMINISTIC):
            raise ValueError(f"error_kind must be {TRANSIENT!r} or {DETERMINISTIC!r}, "
                             f"got {self.error_kind!r}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_timeout(timeout_s: Any) -> float:
    """`timeout_s` as a float when it is a usable per-candidate timeout (seconds, more than 0,
    at most `MAX_TIMEOUT_S`); otherwise a ValueError that names it. The command line checks
    its --timeout with this too, so a bad one is refused before anything runs."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise ValueError(f"timeout must be a number of seconds, got {timeout_s!r}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:  # also refuses nan
        raise ValueError(f"timeout must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds, "
                         f"got {timeout_s!r}")
    return float(timeout_s)


# Where a container's memory limit is (cgroup v2, then v1); "max" or a huge number: none.
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def machine_memory() -> int:
    """The memory this process may use, in bytes: the machine's (MemTotal), or its container's
    limit when that is lower (past it the container's OOM killer strikes, not MemoryError)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in _CGROUP_LIMITS:
        try:
            limit = Path(path).read_text().strip()
        except OSError:
            continue
        if limit.isdigit():
            memory = min(memory, int(limit))
    return memory


def default_max_memory() -> int:
    """The worker's memory cap when none is given: half of the machine's memory, so a runaway
    candidate fails with "out of memory" before the machine swaps or the OOM killer picks a
    process that matters (the explorer holds the e-graph)."""
    return max(MIN_MAX_MEMORY, machine_memory() // 2)


class TooLargeError(ValueError):
    """A workload size whose buffers would not fit under the worker's memory cap."""


def buffer_bytes(comp: Computation) -> int:
    """What measuring `comp` allocates, about: every input, intermediate and output in float32
    (the program's buffers), the float64 copy of each that the reference computes with (it keeps
    every stage to check the outputs), and the reference's working chunk."""
    elements = sum(math.prod(t.shape) for t in comp.inputs) + \
        sum(math.prod(s.shape) for s in comp.stages)
    return elements * (4 + 8) + REFERENCE_CHUNK_BYTES


def check_fits_in_memory(comp: Computation, max_memory: int | None) -> None:
    """TooLargeError naming the memory needed when measuring `comp` could not stay under
    `max_memory` (bytes; default `default_max_memory()`), before anything is allocated."""
    cap = default_max_memory() if max_memory is None else max_memory
    need = buffer_bytes(comp)
    if need > cap:
        raise TooLargeError(f"{comp.name} at this size needs about {_gib(need)} of buffers "
                            f"(inputs, intermediates and outputs, and the reference's float64 "
                            f"copies), over the memory cap of {_gib(cap)} (--max-memory)")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"


def check_max_memory(max_memory: Any) -> int:
    """`max_memory` (bytes) when it is a usable memory cap for a worker; else a ValueError."""
    if isinstance(max_memory, bool) or not isinstance(max_memory, int):
        raise ValueError(f"max memory must be a number of bytes, got {max_memory!r}")
    if max_memory > MAX_MAX_MEMORY:
        raise ValueError(f"max memory must be at most 1 EiB, got {max_memory} bytes")
    if max_memory < MIN_MAX_MEMORY:
        raise ValueError(f"max memory must be at least {MIN_MAX_MEMORY >> 20} MiB (an idle "
                         f"worker holds about 100 MiB), got {max_memory} bytes")
    return max_memory


@dataclass(frozen=True)
class _Job:
    id: int  # every reply carries it: a reply to another job is never taken for this one's
    programs: tuple[Program, ...]  # timed side by side, `rounds` times in turn
    options: CompileOptions | None
    repeats: int
    warmup: int
    seed: int
    check: bool
    timeout_s: float
    max_memory: int  # bytes
    time_budget_s: float | None = None
    min_repeats: int = 1
    rounds: int = 1
    contended_cores: float | None = None
    retimes: int = 0


# The worker's note that it is about to time, and the caller's answer that its own work has
# paused (`on_timing` returned): the timing starts then; the result follows.
_TIMING = "timing"
_GO = "go"


class _WorkerLost(Exception):
    """The worker died, timed out or answered out of turn; the message says which."""

    def __init__(self, message: str, kind: str = TRANSIENT):
        super().__init__(message)
        self.kind = kind


# ---- the worker process ---------------------------------------------------------------------


@dataclass
class _Reference:
    """The inputs and expected outputs of one workload instance, kept across candidates, with a
    checksum of both: a stray store by a kernel into them would poison every later check. CRC-32
    catches any accidental change of a few words and takes 2 ms for matmul 512³'s 4 MiB
    (blake2b took 13)."""

    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    digest: int = 0

    def __post_init__(self) -> None:
        self.digest = self.current_digest()

    def current_digest(self) -> int:
        crc = 0
        for arrays in (self.inputs, self.expected):
            for name in sorted(arrays):
                crc = zlib.crc32(np.ascontiguousarray(arrays[name]), zlib.crc32(name.encode(), crc))
        return crc

    def intact(self) -> bool:
        return self.current_digest() == self.digest


_references: OrderedDict[tuple[str, int], _Reference] = OrderedDict()


def _reference_for(prog: Program, seed: int) -> _Reference:
    comp = prog.computation
    key = (naive_program(comp).hash(), seed)
    if key in _references:
        _references.move_to_end(key)
        return _references[key]
    inputs = random_inputs(comp, seed)
    _references[key] = _Reference(inputs, reference(comp, inputs))
    while len(_references) > _REFERENCES_KEPT:
        _references.popitem(last=False)
    return _references[key]


def _drop_damaged_references() -> int:
    """Forget every cached reference a kernel wrote into; how many there were."""
    damaged = [key for key, ref in _references.items() if not ref.intact()]
    for key in damaged:
        del _references[key]
    return len(damaged)


def kernel_inputs(prog: Program, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays a measurement hands the kernel: copies, so a stray store by the kernel cannot
    poison cached inputs, and 64-byte aligned like the outputs `Kernel.run` allocates, so the
    timing does not depend on where the allocator happened to put them (§11)."""
    return {b.name: aligned_copy(inputs[b.name]) for b in prog.inputs}


def _run(job: _Job, timing: Callable[[], None]) -> list[Measurement]:
    """Compile and check every program of the job, then time them: `rounds` times in turn, so
    each sees the machine as the others did (side by side). A timing during which other
    processes kept `contended_cores` busy is taken again, up to `retimes` times; the quietest
    is kept. `timing()` returns when the caller is ready for the timing to start."""
    prepared = [_prepare(prog, job) for prog in job.programs]
    if job.repeats == 0 or all(kernel is None for _, kernel, _ in prepared):
        return [result for result, _, _ in prepared]  # nothing to time: failed, wrong, or asked
    timing()
    kept: _Window | None = None
    for attempt in range(1 + job.retimes):
        window = _timed_window(prepared, job)
        if kept is None or window.quieter_than(kept):
            kept = window
        if not window.contended(job.contended_cores):
            break
    load = os.getloadavg()[0]
    results = []
    for (result, _, _), prog, timed in zip(prepared, job.programs, kept.times):
        if timed:
            result.times = timed
            result.median_s = statistics.median(timed)
            result.min_s = min(timed)
            result.gflops = prog.computation.flops / result.median_s / 1e9
            result.others_cores, result.caller_cores = kept.others_cores, kept.caller_cores
            result.load, result.retimed = load, attempt
        results.append(result)
    return results


@dataclass
class _Window:
    """One timing of a job's programs: their times, and the cores' worth of CPU time other
    processes and the caller used meanwhile (None: not known)."""

    times: list[list[float]]
    others_cores: float | None
    caller_cores: float | None

    def contended(self, limit: float | None) -> bool:
        return limit is not None and self.others_cores is not None and self.others_cores >= limit

    def quieter_than(self, other: _Window) -> bool:
        return (self.others_cores is not None and other.others_cores is not None
                and self.others_cores < other.others_cores)


def _timed_window(prepared: list, job: _Job) -> _Window:
    """Each prepared program timed `rounds` times in turn, and who else used the machine."""
    times: list[list[float]] = [[] for _ in prepared]
    before, own, wall = _cpu_counters(), time.process_time(), time.perf_counter()
    for _ in range(job.rounds):
        for (_, kernel, run), timed in zip(prepared, times):
            if kernel is not None:
                _time(kernel, run, timed, job)
    if job.contended_cores is not None:
        # A caller acts on the figure: a window shorter than LOAD_WINDOW_S is padded by
        # waiting (the caller's search is still held), so it means something. Unchecked
        # timings are not padded: the suite and `eqsched run` time hundreds of tiny kernels.
        time.sleep(max(0.0, LOAD_WINDOW_S - (time.perf_counter() - wall)))
    wall = time.perf_counter() - wall
    after = _cpu_counters()
    if before is None or after is None or wall < LOAD_WINDOW_S:
        return _Window(times, None, None)
    busy, caller = after[0] - before[0], after[1] - before[1]
    others = busy - (time.process_time() - own) - caller
    return _Window(times, max(0.0, others / wall), caller / wall)


def _cpu_counters() -> tuple[float, float] | None:
    """CPU seconds the whole machine (`machine_busy_s`) and the worker's caller (its parent:
    every thread, from /proc/PID/stat) have used, or None where /proc does not say."""
    busy = machine_busy_s()
    try:
        with open(f"/proc/{os.getppid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if busy is None:
        return None
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return busy, (utime + stime) / os.sysconf("SC_CLK_TCK")


def _prepare(prog: Program, job: _Job) -> tuple[Measurement, Callable | None, tuple]:
    """The program compiled and checked against the reference: its result so far, and what
    to time it with, a call and its arguments (None when it failed or has nothing to time)."""
    try:
        kernel = compile_program(prog, job.options)
        info: dict[str, Any] = {"backend": kernel.info, "machine": machine.facts()}
        ref = _reference_for(prog, job.seed) if job.check else None
        inputs = ref.inputs if ref is not None else random_inputs(prog.computation, job.seed)
        args = kernel_inputs(prog, inputs)
        if prog.preparation:
            # Checked and timed as a kernel bound to its constants runs: prepared once, then
            # only the rest on each call (what a model's weights get, docs/ARCHITECTURE.md §7).
            outputs, call = kernel.prepared_run(args)  # outputs and intermediates start as NaN
            arrays: tuple[np.ndarray, ...] = ()  # the call holds them
        else:
            outputs = kernel.run(args)
            call, arrays = kernel, (*args.values(), *outputs.values())
    except Exception as err:  # every failure of one program is that program's result
        return _failure(err), None, ()
    result = Measurement(correct=None, info=info)
    if ref is not None:
        ok, max_err, message = compare(outputs, ref.expected, tolerance(prog.computation))
        written = [name for name in args if not np.array_equal(args[name], inputs[name])]
        if ok and written:  # the timing runs would see other inputs than the check did
            ok, message = False, f"the kernel wrote into its input {written[0]}"
        result.correct, result.max_err, result.check_message = ok, max_err, message
        if not ok:
            result.error_kind = DETERMINISTIC
            return result, None, ()
    return result, call, arrays


def _time(kernel: Callable, run: tuple, times: list[float], job: _Job) -> None:
    """Warm up and time `kernel` on `run`, appending to `times`. A slow candidate should
    not eat the exploration's budget: past `time_budget_s` of warmup and timing, stop (keeping
    at least `min_repeats` timed runs: one run on a noisy machine can be far off, and the
    search would chase it; docs/ARCHITECTURE.md §17.5)."""
    spent, budget = 0.0, job.time_budget_s if job.time_budget_s is not None else math.inf
    timed = 0
    for _ in range(job.warmup):
        if spent > budget:
            break
        start = time.perf_counter()
        kernel(*run)
        spent += time.perf_counter() - start
    for _ in range(job.repeats):
        if timed >= job.min_repeats and spent > budget:
            break
        start = time.perf_counter()
        kernel(*run)
        times.append(time.perf_counter() - start)
        spent += times[-1]
        timed += 1


def machine_busy_s() -> float | None:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat: user,
    nice, system, irq, softirq, steal), or None where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _failure(err: Exception) -> Measurement:
    """A job's exception as its result. Out of memory and the system's errors (OSError: no
    memory for the JIT, no file descriptors) are transient; anything else is the program's."""
    last = traceback.extract_tb(err.__traceback__)[-1]
    where = f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno})"
    if isinstance(err, MemoryError) or getattr(err, "errno", None) == errno.ENOMEM:
        return Measurement(correct=False, error=f"out of memory: {err}{where}",
                           error_kind=TRANSIENT)
    return Measurement(correct=False, error=f"{type(err).__name__}: {err}{where}",
                       error_kind=TRANSIENT if isinstance(err, OSError) else DETERMINISTIC)


def _serve(requests: Connection, replies: Connection) -> None:
    while True:
        try:
            job = requests.recv()
        except EOFError:
            return
        # The worker's own deadline: SIGALRM's default action ends the process even inside a
        # kernel that never returns to Python, parent or no parent.
        signal.setitimer(signal.ITIMER_REAL, job.timeout_s + _WORKER_GRACE_S)
        _cap_memory(job.max_memory)
        try:
            results = _run(job, lambda: _wait_for_go(job, requests, replies))
        except Exception as err:  # every failure of one job is that job's result
            results = [_failure(err)] * len(job.programs)
        if _drop_damaged_references():  # which program of the job did it is not known
            for result in results:
                if result.error is None:
                    result.correct, result.error_kind = False, DETERMINISTIC
                    result.check_message = ("the kernel wrote into the worker's cached inputs "
                                            "or expected outputs")
                    result.times, result.median_s, result.min_s = [], None, None
                    result.gflops = None
        replies.send((job.id, results))
        signal.setitimer(signal.ITIMER_REAL, 0)


def _wait_for_go(job: _Job, requests: Connection, replies: Connection) -> None:
    """Tell the caller that timing is about to start and wait for its go: it pauses its own
    work first (explore's search finishes the unit of work it is in), which would otherwise
    run beside the timing and be taken for another process's (docs/ARCHITECTURE.md §11)."""
    replies.send((job.id, _TIMING))
    answer = requests.recv()
    if answer != (job.id, _GO):
        raise RuntimeError(f"expected the caller's go for job {job.id}, got {answer!r}")


def _cap_memory(max_memory: int) -> None:
    """Cap the data the worker can allocate (RLIMIT_DATA: heap and private mappings, where
    numpy's arrays and LLVM's memory live; unlike RLIMIT_AS it does not count the shared
    libraries and reserved address space). A failing allocation is then a MemoryError."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = max_memory if hard == resource.RLIM_INFINITY else min(max_memory, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))


def _watch_parent(parent: int, requests_fd: int) -> None:
    """Exit when the parent is gone: reparented, or its end of the request pipe closed. Covers
    what the parent-death signal cannot (other systems; a parent that forked, whose child holds
    the pipe, is still caught by the reparenting). A hang-up needs no reading, so this does not
    race the main thread for requests."""
    poller = select.poll()
    poller.register(requests_fd, 0)  # hang-ups and errors are always reported
    while True:
        if poller.poll(500) or os.getppid() != parent:
            os._exit(1)


def _volunteer_for_oom_killer() -> None:
    """Be the process the kernel's OOM killer picks first, before the explorer (which holds the
    e-graph): a worker is restarted in a moment, an exploration is not."""
    try:
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError:  # not Linux, or /proc not mounted: the memory cap still holds
        pass


def _worker_main(argv: list[str]) -> None:
    parent, requests_fd, replies_fd = map(int, argv)  # the bootstrap made it die with `parent`
    _volunteer_for_oom_killer()
    # A crashing kernel is an error value, not a core file in the user's directory.
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    # Ctrl-C reaches the whole process group; the parent decides what an interrupt means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent, requests_fd), daemon=True,
                     name="eqsched-parent-watch").start()
    _serve(Connection(requests_fd, writable=False), Connection(replies_fd, readable=False))


# How a worker starts. First, before its imports (half a second), it asks the kernel for SIGKILL
# when its parent dies (Linux: PR_SET_PDEATHSIG, 1) and makes sure the parent has not died
# already: a worker left behind would spin in a hanging kernel forever. Then `python -I` (no
# current directory, no PYTHON* variables, no user site on sys.path) takes the parent's import
# path minus the current directory and loads this same eqsched package from its own folder.
# `python -m eqsched.runner` put the current directory first, and a stray statistics.py there
# broke every measurement.
_BOOTSTRAP = """\
import ctypes, importlib.util, json, os, signal, sys
package, path, argv = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
if sys.platform.startswith("linux"):
    ctypes.CDLL(None).prctl(1, ctypes.c_ulong(signal.SIGKILL), *[ctypes.c_ulong(0)] * 3)
if os.getppid() != int(argv[0]):
    os._exit(1)
sys.path[:] = path
spec = importlib.util.spec_from_file_location(
    "eqsched", package + "/__init__.py", submodule_search_locations=[package])
module = importlib.util.module_from_spec(spec)
sys.modules["eqsched"] = module
spec.loader.exec_module(module)
from eqsched.runner import _worker_main
_worker_main(argv)
"""


def _import_path() -> list[str]:
    """The parent's sys.path without the current directory ('' or its absolute path)."""
    here = os.path.realpath(os.getcwd())
    return [p for p in sys.path if p and os.path.realpath(p) != here]


# ---- the parent side ------------------------------------------------------------------------


class _Starter:
    """Starts worker processes from one thread that lives as long as the process.

    On Linux the parent-death signal fires when the *thread* that started the worker ends, not
    the process: a worker started by one of explore's measuring threads would be killed when
    its run ends, possibly while another thread measures in it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue | None = None
        self._pid = 0

    def popen(self, command: list[str], **kwargs: Any) -> subprocess.Popen:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child (threads do not fork)
                self._requests, self._pid = queue.SimpleQueue(), os.getpid()
                threading.Thread(target=self._serve, args=(self._requests,), daemon=True,
                                 name="eqsched-worker-starter").start()
            requests = self._requests
        done: queue.SimpleQueue = queue.SimpleQueue()
        requests.put((command, kwargs, done))
        try:
            started, value = done.get()
        except BaseException:  # interrupted while the start is under way: finish, then undo it
            started, value = done.get()
            if started:
                value.kill()
                value.wait()
            raise
        if not started:
            raise value
        return value

    @staticmethod
    def _serve(requests: queue.SimpleQueue) -> None:
        while True:
            command, kwargs, done = requests.get()
            try:
                done.put((True, subprocess.Popen(command, **kwargs)))
            except BaseException as err:  # handed to the caller, which raises it
                done.put((False, err))


_starter = _Starter()


class _Worker:
    """A fresh interpreter running `_serve`, talking pickles over two pipes; its stderr goes to
    a file that errors quote.

    It is started as its own program rather than by multiprocessing's spawn, which re-imports
    the caller's main script in the child and fails for scripts without a
    `if __name__ == "__main__":` guard.
    """

    def __init__(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # Appending: the worker writes at the end whatever the parent truncated in between.
        self.stderr = tempfile.TemporaryFile("a+b", prefix="eqsched-worker-")
        package = str(Path(__file__).resolve().parent)
        command = [sys.executable, "-I", "-c", _BOOTSTRAP, package, json.dumps(_import_path()),
                   str(os.getpid()), str(to_child_r), str(from_child_w)]
        try:
            self.process = _starter.popen(
                command, pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # keep the caller's stdout clean (e.g. `--json`)
                stderr=self.stderr)
        except BaseException:
            for fd in (to_child_w, from_child_r):
                os.close(fd)
            self.stderr.close()
            raise
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.send = Connection(to_child_w, readable=False)
        self.recv = Connection(from_child_r, writable=False)

    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, job: _Job, on_timing: Callable[[bool], None] | None = None
            ) -> list[Measurement]:
        """The worker's results for `job`, one per program; raises _WorkerLost when there are
        none. Any other exception (an interrupt, a failing `on_timing`) stops the worker first:
        its reply to this job would otherwise wait in the pipe and answer the next one."""
        deadline = time.monotonic() + job.timeout_s
        timing = False
        os.ftruncate(self.stderr.fileno(), 0)  # what the worker says about this job only
        oom_kills = _oom_kills()
        try:
            self.send.send(job)
            while True:
                if not self.recv.poll(max(0.0, deadline - time.monotonic())):
                    self.stop()
                    raise _WorkerLost(f"timed out after {job.timeout_s:g} s (worker killed)")
                message = self.recv.recv()
                if not (isinstance(message, tuple) and len(message) == 2
                        and message[0] == job.id):
                    self.stop()
                    raise _WorkerLost(f"the worker answered out of turn (job {job.id} asked, "
                                      f"reply {_job_id_of(message)} received; worker restarted)")
                reply = message[1]
                if isinstance(reply, list):
                    return reply
                timing = True
                if on_timing is not None:
                    on_timing(True)
                self.send.send((job.id, _GO))
        except _WorkerLost:
            raise
        except (EOFError, OSError):
            try:
                code = self.process.wait(5)  # the pipe closes a moment before the exit status
            except subprocess.TimeoutExpired:
                code = None
            lost = self._death(code, job, oom_kills)
            self.stop()
            raise lost from None
        except BaseException:
            self.stop()
            raise
        finally:
            if timing and on_timing is not None:
                on_timing(False)

    def _death(self, code: int | None, job: _Job, oom_kills: int) -> _WorkerLost:
        """What the worker's death means: a crash of the kernel, running out of memory, its own
        deadline, or a kill from outside; with the end of its stderr."""
        said = self.stderr_tail()
        message = f"worker process died: {_exit_reason(code)}"
        if said:
            message += f"; its stderr ended: {said}"
        killed_by = -code if code is not None and code < 0 else None
        if any(sign in said for sign in _OUT_OF_MEMORY_SIGNS) or (
                killed_by == signal.SIGKILL and _oom_kills() > oom_kills):
            return _WorkerLost(f"out of memory: {message}")
        if killed_by == signal.SIGALRM:
            return _WorkerLost(f"timed out after {job.timeout_s:g} s (the worker's own "
                               f"deadline)")
        return _WorkerLost(message, DETERMINISTIC if killed_by in _CRASHES else TRANSIENT)

    def stderr_tail(self) -> str:
        """The last lines the worker wrote on stderr during the current job, as one line."""
        fd = self.stderr.fileno()
        size = os.fstat(fd).st_size
        text = os.pread(fd, _STDERR_KEPT, max(0, size - _STDERR_KEPT)).decode(errors="replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return " | ".join(lines)[-_STDERR_KEPT:]

    def stop(self) -> None:
        """Kill the worker (if it is still running) and close its pipes; safe to repeat."""
        if self.alive():
            self.process.kill()
        self.process.wait(5)
        self.send.close()
        self.recv.close()
        self.stderr.close()


def _job_id_of(message: Any) -> Any:
    return message[0] if isinstance(message, tuple) and message else type(message).__name__


def _oom_kills() -> int:
    """How many processes the kernel's OOM killer has killed since boot (0 if unknown)."""
    try:
        with open("/proc/vmstat") as vmstat:
            for line in vmstat:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


_workers: dict[int, _Worker] = {}
_locks: dict[int, threading.Lock] = defaultdict(threading.Lock)
_pool_lock = threading.Lock()
_job_ids = itertools.count(1)


def _forget_workers_after_fork() -> None:
    """A forked child does not own its parent's workers: it closes its copies of their pipes
    (so a worker still sees its parent hang up) and starts its own when it measures, from its
    own starter thread (threads do not survive a fork; a lock may have been held)."""
    global _pool_lock, _starter
    for worker in _workers.values():
        worker.send.close()
        worker.recv.close()
        worker.stderr.close()
    _workers.clear()
    _locks.clear()
    _pool_lock = threading.Lock()
    _starter = _Starter()


os.register_at_fork(after_in_child=_forget_workers_after_fork)


def worker_pids() -> dict[int, int]:
    """The process id of each running worker, by worker number."""
    return {number: w.process.pid for number, w in list(_workers.items()) if w.alive()}


def measure(
    prog: Program,
    *,
    repeats: int = 10,
    warmup: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    seed: int = 0,
    check: bool = True,
    options: CompileOptions | None = None,
    time_budget_s: float | None = None,
    min_repeats: int = 1,
    max_memory: int | None = None,
    contended_cores: float | None = None,
    retimes: int = 1,
    worker: int = 0,
    on_timing: Callable[[bool], None] | None = None,
) -> Measurement:
    """Compile `prog`, check it against the reference (before any timing), time `repeats` calls.

    Runs in persistent worker process number `worker` (callers measuring from several threads
    use one number each); `timeout_s` bounds the whole job (compile, reference, check, timing)
    and `max_memory` (bytes; default `default_max_memory()`) what the worker may allocate.
    Warmup and timing stop early once they have taken `time_budget_s`, but not before
    min(`min_repeats`, `repeats`) calls are timed (none with `repeats` 0: compiled and checked
    only). `on_timing(True)` is called when the worker is about to warm up and time (after
    compiling and checking), which waits until it returns, and `on_timing(False)` when it is
    done, so a caller can pause its own work meanwhile. Never raises for a bad program:
    failures come back as `error`, with `error_kind`. Raises ValueError for bad settings.
    A timing during which other processes kept `contended_cores` cores' worth busy
    (`Measurement.others_cores`) is taken again, up to `retimes` times, and the quietest kept
    (`Measurement.retimed` says how often); a timing shorter than LOAD_WINDOW_S is then
    padded by waiting, so the figure means something. None never takes one again nor pads:
    `others_cores` is then None for a timing shorter than LOAD_WINDOW_S.
    """
    return measure_side_by_side(
        [prog], rounds=1, repeats=repeats, warmup=warmup, timeout_s=timeout_s, seed=seed,
        check=check, options=options, time_budget_s=time_budget_s, min_repeats=min_repeats,
        max_memory=max_memory, contended_cores=contended_cores, retimes=retimes,
        worker=worker, on_timing=on_timing)[0]


def measure_side_by_side(
    programs: Sequence[Program],
    *,
    rounds: int = 5,
    repeats: int = 10,
    warmup: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    seed: int = 0,
    check: bool = True,
    options: CompileOptions | None = None,
    time_budget_s: float | None = None,
    min_repeats: int = 1,
    max_memory: int | None = None,
    contended_cores: float | None = None,
    retimes: int = 1,
    worker: int = 0,
    on_timing: Callable[[bool], None] | None = None,
) -> list[Measurement]:
    """`measure` for several programs in one job: all compiled and checked first, then timed
    in turn, `rounds` times (each round as `measure` times one program), so they share the
    machine's state and load; each median is over all its rounds' runs. `timeout_s` bounds
    the whole job."""
    if repeats < 0 or warmup < 0 or retimes < 0 or min_repeats < 1 or rounds < 1:
        raise ValueError(f"repeats, warmup and retimes must be >= 0, min_repeats and rounds "
                         f">= 1, got {repeats}, {warmup}, {retimes}, {min_repeats} and {rounds}")
    if contended_cores is not None and not contended_cores > 0:
        raise ValueError(f"contended_cores must be more than 0, got {contended_cores}")
    programs = tuple(programs)
    timeout_s = check_timeout(timeout_s)
    max_memory = default_max_memory() if max_memory is None else check_max_memory(max_memory)
    job = _Job(next(_job_ids), programs, options, repeats, warmup, seed, check, timeout_s,
               max_memory, time_budget_s, min_repeats, rounds, contended_cores, retimes)
    settings = {"repeats": repeats, "warmup": warmup, "seed": seed, "timeout_s": timeout_s,
                "time_budget_s": time_budget_s, "min_repeats": min_repeats,
                "max_memory": max_memory, "rounds": rounds}
    with _pool_lock:
        lock = _locks[worker]
    with lock:
        current = _workers.get(worker)
        if current is None or not current.alive():
            if current is not None:
                current.stop()
            current = _workers[worker] = _Worker()
        try:
            results = current.ask(job, on_timing)
        except _WorkerLost as lost:
            results = [Measurement(correct=False, error=str(lost), error_kind=lost.kind)
                       for _ in programs]
        except BaseException:
            _workers.pop(worker, None)  # `ask` stopped it
            raise
        if any(r.error_kind == TRANSIENT for r in results):
            current.stop()  # out of memory or worse: the next job starts afresh
        if not current.alive():
            _workers.pop(worker, None)
    for result, prog in zip(results, programs):
        result.info.setdefault("machine", machine.facts())
        result.info["settings"] = settings
        result.info["program_hash"] = prog.hash()
    return results


@atexit.register
def shutdown() -> None:
    """Stop every worker process; runs at exit too, so no worker outlives its caller."""
    with _pool_lock:
        for number in list(_workers):
            with _locks[number]:
                _workers.pop(number).stop()
