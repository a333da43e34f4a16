"""Measure a loop program: compile, check against the reference, time, in a worker process.

A generated kernel can crash (a bad index segfaults) or hang. Everything that runs generated code
happens in a persistent worker process (a fresh interpreter, never a fork), so a crash or a timeout
becomes a `Measurement` with an `error` and the caller goes on; the next call starts a new worker.

    m = measure(prog, repeats=10)
    m.correct, m.median_s, m.gflops, m.error

See docs/ARCHITECTURE.md §11 Measurement.
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from . import machine
from .backend import CompileOptions, aligned_copy, compile_program
from .ir import Program, naive_program
from .reference import compare, random_inputs, reference, tolerance

DEFAULT_TIMEOUT_S = 120.0
_REFERENCES_KEPT = 4  # per worker: candidates of one workload share one reference


@dataclass
class Measurement:
    """The outcome of `measure`. `error` is set when no result could be produced at all
    (compile error, crash, timeout); a wrong result is `correct=False` with `check_message`."""

    correct: bool | None  # None: not checked
    max_err: float | None = None
    median_s: float | None = None
    min_s: float | None = None
    times: list[float] = field(default_factory=list)
    gflops: float | None = None
    error: str | None = None
    check_message: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Job:
    program: Program
    options: CompileOptions | None
    repeats: int
    warmup: int
    seed: int
    check: bool
    time_budget_s: float | None = None
    min_repeats: int = 1


_TIMING = "timing"  # the worker's note that it starts timing (the result follows)


class _WorkerLost(Exception):
    """The worker died or timed out; the message says which."""


# ---- the worker process ---------------------------------------------------------------------

_references: OrderedDict[tuple[str, int], tuple[dict, dict]] = OrderedDict()


def _inputs_and_reference(prog: Program, seed: int, check: bool) -> tuple[dict, dict | None]:
    comp = prog.computation
    key = (naive_program(comp).hash(), seed)
    if key in _references:
        _references.move_to_end(key)
        inputs, expected = _references[key]
        return inputs, expected if check else None
    inputs = random_inputs(comp, seed)
    if not check:
        return inputs, None
    expected = reference(comp, inputs)
    _references[key] = (inputs, expected)
    while len(_references) > _REFERENCES_KEPT:
        _references.popitem(last=False)
    return inputs, expected


def kernel_inputs(prog: Program, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays a measurement hands the kernel: copies, so a stray store by the kernel cannot
    poison cached inputs, and 64-byte aligned like the outputs `Kernel.run` allocates, so the
    timing does not depend on where the allocator happened to put them (§11)."""
    return {b.name: aligned_copy(inputs[b.name]) for b in prog.inputs}


def _run(job: _Job, timing: Callable[[], None]) -> Measurement:
    prog = job.program
    kernel = compile_program(prog, job.options)
    info: dict[str, Any] = {"backend": kernel.info, "machine": machine.describe()}
    inputs, expected = _inputs_and_reference(prog, job.seed, job.check)
    args = kernel_inputs(prog, inputs)
    outputs = kernel.run(args)
    run = [*args.values(), *outputs.values()]
    result = Measurement(correct=None, info=info)
    if expected is not None:
        ok, max_err, message = compare(outputs, expected, tolerance(prog.computation))
        result.correct, result.max_err, result.check_message = ok, max_err, message
        if not ok:
            return result
    # A slow candidate should not eat the exploration's budget: past `time_budget_s` of warmup
    # and timing, stop (keeping at least `min_repeats` timed runs: one run on a noisy machine
    # can be far off, and the search would chase it; docs/ARCHITECTURE.md §17.5).
    spent, budget = 0.0, job.time_budget_s if job.time_budget_s is not None else math.inf
    timing()  # before the warmup, which gives the caller time to quiet down
    for _ in range(job.warmup):
        if spent > budget:
            break
        start = time.perf_counter()
        kernel(*run)
        spent += time.perf_counter() - start
    for _ in range(job.repeats):
        if len(result.times) >= job.min_repeats and spent > budget:
            break
        start = time.perf_counter()
        kernel(*run)
        result.times.append(time.perf_counter() - start)
        spent += result.times[-1]
    if result.times:
        result.median_s = statistics.median(result.times)
        result.min_s = min(result.times)
        result.gflops = prog.computation.flops / result.median_s / 1e9
    return result


def _serve(requests: Connection, replies: Connection) -> None:
    while True:
        try:
            job = requests.recv()
        except EOFError:
            return
        try:
            result = _run(job, lambda: replies.send(_TIMING))
        except Exception as err:  # every failure of one job is that job's result
            last = traceback.extract_tb(err.__traceback__)[-1]
            where = f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno})"
            result = Measurement(correct=False, error=f"{type(err).__name__}: {err}{where}")
        replies.send(result)


# ---- the parent side ------------------------------------------------------------------------


class _Worker:
    """A fresh interpreter running `_serve`, talking pickles over two pipes.

    It is started as `python -m eqsched.runner` rather than by multiprocessing's spawn, which
    re-imports the caller's main script in the child and fails for scripts without a
    `if __name__ == "__main__":` guard.
    """

    def __init__(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)  # import this same eqsched
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "eqsched.runner", str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w), env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # keep the caller's stdout clean (e.g. `--json`)
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.send = Connection(to_child_w, readable=False)
        self.recv = Connection(from_child_r, writable=False)

    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, job: _Job, timeout_s: float,
            on_timing: Callable[[bool], None] | None = None) -> Measurement:
        deadline = time.monotonic() + timeout_s
        timing = False
        try:
            self.send.send(job)
            while True:
                if not self.recv.poll(max(0.0, deadline - time.monotonic())):
                    self.stop()
                    raise _WorkerLost(f"timed out after {timeout_s:g} s (worker killed)")
                reply = self.recv.recv()
                if isinstance(reply, Measurement):
                    return reply
                timing = True
                if on_timing is not None:
                    on_timing(True)
        except KeyboardInterrupt:
            self.stop()  # its reply to this job would answer the next one
            raise
        except (EOFError, OSError):
            try:
                code = self.process.wait(5)  # the pipe closes a moment before the exit status
            except subprocess.TimeoutExpired:
                code = None
            self.stop()
            raise _WorkerLost(f"worker process died: {_exit_reason(code)}") from None
        finally:
            if timing and on_timing is not None:
                on_timing(False)

    def stop(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(5)
        self.send.close()
        self.recv.close()


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
    worker: int = 0,
    on_timing: Callable[[bool], None] | None = None,
) -> Measurement:
    """Compile `prog`, check it against the reference (before any timing), time `repeats` calls.

    Runs in persistent worker process number `worker` (callers measuring from several threads
    use one number each); `timeout_s` bounds the whole job (compile, reference, check, timing).
    Warmup and timing stop early once they have taken `time_budget_s`, but not before
    min(`min_repeats`, `repeats`) calls are timed. `on_timing(True)` is called when the worker
    starts warming up to time (after compiling and checking) and `on_timing(False)` when it is
    done, so a caller can keep its own work off the machine meanwhile. Never raises for a bad
    program: failures come back as `error`.
    """
    if repeats < 0 or warmup < 0 or min_repeats < 1:
        raise ValueError(f"repeats and warmup must be >= 0 and min_repeats >= 1, got {repeats}, "
                         f"{warmup} and {min_repeats}")
    job = _Job(prog, options, repeats, warmup, seed, check, time_budget_s, min_repeats)
    settings = {"repeats": repeats, "warmup": warmup, "seed": seed, "timeout_s": timeout_s,
                "time_budget_s": time_budget_s, "min_repeats": min_repeats}
    with _pool_lock:
        lock = _locks[worker]
    with lock:
        current = _workers.get(worker)
        if current is None or not current.alive():
            current = _workers[worker] = _Worker()
        try:
            result = current.ask(job, timeout_s, on_timing)
        except _WorkerLost as lost:
            del _workers[worker]
            result = Measurement(correct=False, error=str(lost))
        except KeyboardInterrupt:
            del _workers[worker]
            raise
    result.info.setdefault("machine", machine.facts())
    result.info["settings"] = settings
    result.info["program_hash"] = prog.hash()
    return result


@atexit.register
def shutdown() -> None:
    """Stop every worker process; runs at exit too, so no worker outlives its caller."""
    with _pool_lock:
        for number in list(_workers):
            with _locks[number]:
                _workers.pop(number).stop()


if __name__ == "__main__":
    # Serve from the imported module, not from `__main__`, so pickled results name
    # `eqsched.runner.Measurement`, which the parent can load.
    from eqsched.runner import _serve as serve

    # Ctrl-C reaches the whole process group; the parent decides what an interrupt means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    requests_fd, replies_fd = int(sys.argv[1]), int(sys.argv[2])
    serve(Connection(requests_fd, writable=False), Connection(replies_fd, readable=False))
