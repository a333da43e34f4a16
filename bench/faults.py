"""Fault injection: real explorations and a real `--jobs 2` batch are killed, interrupted, fed
broken kernels, starved of disk and confused by stray modules at random moments; each is then run
again to completion, and the table counts what the faults cost.

    PYTHONPATH=$PWD python bench/faults.py                      # every fault once, both scenarios
    PYTHONPATH=$PWD python bench/faults.py --repeats 3 --seed 7
    PYTHONPATH=$PWD python bench/faults.py --only kill9 segfault --scenarios explore

Faults (FAULTS), each on `eqsched explore` and on `eqsched batch --jobs 2` (two workloads):
  kill9         kill -9 of the explorer (of the batch's driver)
  sigterm       SIGTERM to it
  sigint        Ctrl-C: SIGINT to its process group
  worker-kill9  kill -9 of a measuring worker
  task-kill9    kill -9 of one of the batch's task processes (batch only)
  segfault      candidates whose kernel stores far outside its buffer (SIGSEGV)
  hang          a candidate whose kernel never returns (past --timeout)
  alloc         a candidate that allocates gigabytes, past --max-memory
  full-disk     the database's filesystem fills up (a tmpfs mounted for it: needs root)
  stray-module  a statistics.py and a numpy.py that raise, in the current directory

A moment is drawn from a seeded RNG over the duration of a clean run of the same scenario
(measured first). The command runs as `python bench/faults.py drive ARGS`: the real command
(`eqsched.__main__.run`, what `eqsched` runs), in a process that journals every measurement it
receives from a worker and every record it stores, and, for the kernel faults, hands the worker a
broken program in place of some candidates (the library has no test hook; the batch's task
processes import this file as their main module and so are instrumented the same way). Then,
per trial:

  measured      measurements the faulted commands took + those their reruns took (a kill
                early leaves more for the rerun)
  lost          measurements received before the fault that are not in the database after the
                rerun, or that were missing after the fault and the rerun measured again. Not
                counted: a result received by a process killed with SIGKILL before it stored it
                (in flight: nothing can save it), and one the full disk refused (noted).
  twice         measurements taken while the database already held a stored result that was not
                a transient failure (a transient one is measured again on purpose).
  orphans       processes of the trial (found by a tag in their environment) still alive 10 s
                after the command ended; they are killed.
  left running  runs that say `running`, or `abandoned` with no later `done` run of the same job.
  wrong best    done runs whose best program, rebuilt from its stored trace, has another hash or
                computes a wrong result, or is one of the broken programs.
  tracebacks    Python tracebacks on the commands' stderr.
  unfinished    reruns that did not exit 0 with every job's last run `done`.

The kernel faults also check each broken candidate's stored error and kind (segfault:
deterministic; hang and alloc: transient). The script exits 1 if any count is not 0.
See docs/ARCHITECTURE.md §12 The database.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

THIS = Path(__file__).resolve()
JOURNAL_ENV = "EQSCHED_FAULTS_JOURNAL"  # where a driven process journals its measurements
TAG_ENV = "EQSCHED_FAULTS_TAG"  # in the environment of every process a trial starts
INJECT_ENV = "EQSCHED_FAULTS_INJECT"  # "segfault:0,5": break the 1st and 6th candidate measured

EXTERNAL = ("kill9", "sigterm", "sigint", "worker-kill9", "task-kill9", "full-disk")
KERNEL_FAULTS = ("segfault", "hang", "alloc")
FAULTS = ("kill9", "sigterm", "sigint", "worker-kill9", "task-kill9", *KERNEL_FAULTS,
          "full-disk", "stray-module")
# What a broken candidate's stored error must say, and its kind (docs/ARCHITECTURE.md §11).
EXPECTED = {"segfault": ("killed by SIGSEGV", "deterministic"),
            "hang": ("timed out", "transient"),
            "alloc": ("out of memory", "transient")}
ORPHAN_GRACE_S = 10.0  # the worker's watchdog polls every 0.5 s; the parent-death signal is at once
MAX_MEMORY = "1G"  # the workers' cap: the broken `alloc` candidate asks for 2 GiB
TIMEOUT_S = 10  # per candidate: a hanging one costs this much
TRANSIENT = "transient"


# ---- inside the driven process ----------------------------------------------------------------


def identity(key: str, target: str, settings: dict[str, Any]) -> str:
    """A measurement's identity as the database keys it (the workload is in the program's hash)."""
    return json.dumps([key, target, settings], sort_keys=True)


class Journal:
    """Appends one JSON line per event, one write each (whole lines even from several threads and
    processes, and nothing buffered for a kill -9 to lose)."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: str, ident: str, **more: Any) -> None:
        line = json.dumps({"event": event, "id": ident, "pid": os.getpid(), "t": time.time(),
                           **more})
        os.write(self.fd, line.encode() + b"\n")


def broken(fault: str, program: Any) -> Any:
    """The candidate `program` made to fail as `fault` says: a store 10^12 elements past its
    buffer (SIGSEGV), its whole body inside an endless loop, or (alloc) a program whose two
    intermediates take 1 GiB each."""
    from eqsched.ir import Block, Loop, LoopKind, map_nodes, naive_program
    from eqsched.workloads import get_workload

    if fault == "segfault":
        last = program.blocks()[-1].name  # a block that stores into the output

        def far(node: Any) -> Any:
            if isinstance(node, Block) and node.name == last:
                return replace(node, indices=(node.indices[0] + 10**12, *node.indices[1:]))
            return None

        return program.with_body(map_nodes(program.body, far))
    if fault == "hang":
        return program.with_body((Loop("forever", 10**15, LoopKind.SERIAL, program.body),))
    if fault == "alloc":
        return naive_program(get_workload("mm_exp_mm").build(16384, 1, 16384, 1))
    raise ValueError(f"no broken program for fault {fault!r}")


def instrument() -> None:
    """Journal every measurement this process receives (`trials.Settings.measure`) and every
    record it stores (`db.Database.add`); break the candidates INJECT_ENV names (counted in the
    order this process measures them, the naive program aside)."""
    from eqsched import db, trials
    from eqsched.ir import naive_program

    journal = Journal(os.environ[JOURNAL_ENV])
    fault, _, positions = os.environ.get(INJECT_ENV, "").partition(":")
    chosen = {int(p) for p in positions.split(",") if p}
    seen = Counter()  # candidates measured so far
    lock = threading.Lock()
    measure, add = trials.Settings.measure, db.Database.add

    def measuring(settings: Any, program: Any, **kwargs: Any) -> Any:
        ident = identity(trials.measurement_key(program, settings), settings.target,
                         settings.outcome())
        injected = None
        if fault and program.hash() != naive_program(program.computation).hash():
            with lock:
                position = seen["candidates"]
                seen["candidates"] += 1
            injected = fault if position in chosen else None
        m = measure(settings, broken(injected, program) if injected else program, **kwargs)
        error = m.error or (m.check_message if m.correct is False else None)
        journal.write("received", ident, kind=m.error_kind, error=error, injected=injected)
        return m

    def adding(database: Any, record: Any) -> bool:
        ident = identity(record.program_hash, record.target, record.settings)
        try:
            added = add(database, record)
        except Exception as err:
            journal.write("store_failed", ident, error=str(err)[:300])
            raise
        journal.write("stored", ident, db=database.path.name)
        return added

    trials.Settings.measure = measuring
    db.Database.add = adding


def drive(args: list[str]) -> int:
    """`eqsched ARGS` (the command's entry point, `eqsched.__main__.run`), instrumented when
    JOURNAL_ENV is set. SIGINT is Python's default, as in a terminal: started from a background
    shell, the harness and so this process would ignore it, and a Ctrl-C would change nothing.
    A Ctrl-C while `instrument` imports eqsched ends the process as one while the command
    imports itself does."""
    from eqsched import __main__ as command

    sys.argv[1:] = args
    if os.environ.get(JOURNAL_ENV):
        signal.signal(signal.SIGINT, command._interrupted_while_starting)
        instrument()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return command.run()


# A batch's task processes are spawned: they import this file as `__mp_main__`, not `__main__`.
if __name__ == "__mp_main__" and os.environ.get(JOURNAL_ENV):
    instrument()


# ---- scenarios --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    workload: str
    size: tuple[int, ...]
    rules: str  # a small rule set keeps the search (and so a trial) to seconds


@dataclass(frozen=True)
class Scenario:
    """An exploration (one job) or a `--jobs 2` batch (several), `trials` candidates each."""

    name: str
    jobs: tuple[Job, ...]
    trials: int
    batch: int

    def command(self, db: Path, seed: int, work: Path) -> list[str]:
        """The eqsched arguments of this scenario (a batch's suite file written into `work`)."""
        settings = ["--max-memory", MAX_MEMORY]
        if self.name == "explore":
            (job,) = self.jobs
            return ["explore", job.workload, "--size", ",".join(map(str, job.size)),
                    f"--rules={job.rules}", "--trials", str(self.trials), "--batch",
                    str(self.batch), "--threads", "1", "--repeats", "3", "--cost-model",
                    "analytic", "--seed", str(seed), "--timeout", str(TIMEOUT_S), *settings,
                    "--db", str(db), "--json"]
        suite = work / "suite.toml"
        entries = "".join(f'[[explore]]\nworkload = "{j.workload}"\nsizes = [{list(j.size)}]\n'
                          f'rules = "{j.rules}"\n' for j in self.jobs)
        suite.write_text(f"[defaults]\ntrials = {self.trials}\nbatch = {self.batch}\n"
                         f"threads = 1\nrepeats = 3\ncost_model = \"analytic\"\nseed = {seed}\n"
                         f"\n{entries}")
        return ["batch", str(suite), "--jobs", "2", *settings, "--db", str(db), "--json"]

    def applies(self, fault: str) -> bool:
        return fault != "task-kill9" or self.name == "batch"


MATMUL = Job("matmul", (16, 16, 16), "reorder,unroll,vectorize")
CONV = Job("conv2d_nchw", (1, 4, 6, 6, 4, 3, 3, 1, 1), "reorder,vectorize")
SCENARIOS = {"explore": Scenario("explore", (MATMUL,), trials=12, batch=4),
             "batch": Scenario("batch", (MATMUL, CONV), trials=12, batch=4)}
# What tests/test_faults.py runs: seconds per command.
SMALL_MATMUL = Job("matmul", (8, 8, 8), "reorder,vectorize")
SMALL_CONV = Job("conv2d_nchw", (1, 2, 4, 4, 2, 3, 3, 1, 1), "reorder,vectorize")
SMALL = {"explore": Scenario("explore", (SMALL_MATMUL,), trials=6, batch=2),
         "batch": Scenario("batch", (SMALL_MATMUL, SMALL_CONV), trials=6, batch=2)}


# ---- the trial's processes --------------------------------------------------------------------


def tagged_processes(tag: str) -> dict[int, str]:
    """Live processes whose environment holds TAG_ENV=`tag`: pid -> command line."""
    needle = f"\0{TAG_ENV}={tag}\0".encode()
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in b"\0" + environ:  # a zombie's environment reads empty
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


def reap_orphans(tag: str) -> int:
    """How many processes of `tag` outlive the grace period (then killed, by pid)."""
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = tagged_processes(tag)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(left)


@dataclass
class Command:
    """One eqsched command of a trial, started in its own session (so Ctrl-C can reach its whole
    process group, as a terminal's does); output in files."""

    process: subprocess.Popen
    tag: str
    stdout: Path
    stderr: Path
    started: float

    @classmethod
    def start(cls, args: list[str], *, cwd: Path, tag: str, journal: Path, out: Path,
              inject: str | None = None) -> Command:
        env = {**os.environ, TAG_ENV: tag, JOURNAL_ENV: str(journal)}
        env.pop(INJECT_ENV, None)
        if inject:
            env[INJECT_ENV] = inject
        stdout, stderr = out.with_suffix(".out"), out.with_suffix(".err")
        with open(stdout, "wb") as o, open(stderr, "wb") as e:
            process = subprocess.Popen([sys.executable, str(THIS), "drive", *args], cwd=cwd,
                                       env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        return cls(process, tag, stdout, stderr, time.monotonic())

    def ended(self) -> bool:
        return self.process.poll() is not None

    def wait(self, limit_s: float) -> int | None:
        """The exit status; None when it ran past `limit_s` (then its group is killed)."""
        try:
            return self.process.wait(max(0.0, limit_s - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            return None

    def tracebacks(self) -> int:
        return self.stderr.read_text(errors="replace").count("Traceback (most recent call last)")

    def last_error_line(self) -> str:
        lines = [ln for ln in self.stderr.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1] if lines else ""


def first_matching(tag: str, pattern: str, until: Callable[[], bool]) -> int | None:
    """A process of `tag` whose command line holds `pattern`, polled for until `until()`."""
    while not until():
        found = [pid for pid, cmd in tagged_processes(tag).items() if pattern in cmd]
        if found:
            return found[0]
        time.sleep(0.02)
    return None


# ---- the full disk ----------------------------------------------------------------------------


class SmallDisk:
    """A tmpfs of its own (mounting one needs root) that can be filled to the last byte."""

    SIZE = "48m"

    def __init__(self, path: Path):
        self.path = path
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.SIZE}", "tmpfs",
                               str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            path.rmdir()
            raise OSError(f"cannot mount a tmpfs ({done.stderr.strip() or 'needs root'})")
        self.filler = path / "filler"

    def fill(self) -> None:
        fd = os.open(self.filler, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            for chunk in (1 << 20, 4096, 1):  # to the last byte
                try:
                    while os.write(fd, b"\0" * chunk):
                        pass
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        with contextlib.suppress(OSError):
            self.path.rmdir()


@contextlib.contextmanager
def database_dir(fault: str, work: Path):
    """Where the trial's database lives: a small tmpfs for the full disk, else `work`."""
    if fault != "full-disk":
        yield work, None
        return
    disk = SmallDisk(work / "disk")
    try:
        yield disk.path, disk
    finally:
        disk.unmount()


STRAY = "raise ImportError('a stray module in the current directory was imported')\n"


# ---- one trial --------------------------------------------------------------------------------


@dataclass
class Moment:
    """When an external fault strikes: `after_s` seconds into the command, once it has received
    `after_received` measurements."""

    after_s: float = 0.0
    after_received: int = 0


@dataclass
class Outcome:
    """What one trial counted, and what else went wrong (`problems`) or is worth saying."""

    measured: tuple[int, int] = (0, 0)  # by the faulted command, by the rerun
    lost: int = 0
    twice: int = 0
    orphans: int = 0
    left_running: int = 0
    wrong_best: int = 0
    tracebacks: int = 0
    unfinished: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    COUNTS = ("lost", "twice", "orphans", "left_running", "wrong_best", "tracebacks", "unfinished")

    def failed(self) -> bool:
        return bool(self.problems) or any(getattr(self, c) for c in self.COUNTS)

    def __str__(self) -> str:
        counts = [f"{c.replace('_', ' ')} {getattr(self, c)}" for c in self.COUNTS
                  if getattr(self, c)]
        return "; ".join([*(["FAILED"] if self.failed() else ["ok"]), *counts, *self.problems,
                          *self.notes])


def events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stored_results(db_path: Path) -> set[str]:
    """The identities of the database's measurements that are not transient failures."""
    from eqsched.db import Database

    if not db_path.exists():
        return set()
    with Database(db_path, readonly=True) as db:
        return {identity(r.program_hash, r.target, r.settings)
                for r in db.records(target=None) if r.error_kind != TRANSIENT}


def run_ids(db_path: Path) -> set[int]:
    from eqsched.db import Database

    if not db_path.exists():
        return set()
    with Database(db_path, readonly=True) as db:
        return {run["id"] for run in db.runs()}


def run_trial(scenario: Scenario, fault: str, rng: random.Random, work: Path,
              moment: Moment) -> Outcome:
    """`scenario` with `fault` at `moment`, then again to completion; what it cost."""
    out = Outcome()
    seed = rng.randrange(1 << 16)
    cwd = work / "cwd"
    cwd.mkdir(parents=True)
    if fault == "stray-module":
        for name in ("statistics.py", "numpy.py"):
            (cwd / name).write_text(STRAY)
    inject = None
    if fault in KERNEL_FAULTS:  # the hang costs a timeout each: one of them
        count = 1 if fault == "hang" else 2
        inject = f"{fault}:{','.join(map(str, sorted(rng.sample(range(scenario.trials), count))))}"
    with database_dir(fault, work) as (where, disk):
        db = where / "faults.db"
        args = scenario.command(db, seed, work)
        journals = [work / "journal-1.jsonl", work / "journal-2.jsonl"]
        first = Command.start(args, cwd=cwd, tag=f"{os.getpid()}-{work.name}-1",
                              journal=journals[0], out=work / "first", inject=inject)
        struck, killed = strike(fault, first, moment, journals[0], disk, out)
        code = first.wait(limit_s=600)
        out.orphans += reap_orphans(first.tag)
        out.tracebacks += first.tracebacks()
        judge_first_exit(fault, code, struck, first, out)
        if disk is not None:
            disk.free()
        after_fault, first_runs = stored_results(db), run_ids(db)
        second = Command.start(args, cwd=cwd, tag=f"{os.getpid()}-{work.name}-2",
                               journal=journals[1], out=work / "second")
        code = second.wait(limit_s=600)
        out.orphans += reap_orphans(second.tag)
        out.tracebacks += second.tracebacks()
        if code != 0:
            out.unfinished += 1
            out.problems.append(f"the rerun exited {code}: {second.last_error_line()[:120]}")
        first_events, second_events = events(journals[0]), events(journals[1])
        out.measured = tuple(sum(e["event"] == "received" for e in run)
                             for run in (first_events, second_events))
        count_measurements(first_events, second_events, after_fault, stored_results(db),
                           killed, out)
        injected = check_injected(fault, first_events, out)
        check_runs(db, scenario, injected, first_runs, out)
    return out


def strike(fault: str, command: Command, moment: Moment, journal: Path,
           disk: SmallDisk | None, out: Outcome) -> tuple[bool, set[int]]:
    """Deliver an external fault at `moment`: whether it struck the running command, and the
    pids it killed with SIGKILL (whatever they had received but not stored is in flight, not
    lost)."""
    if fault not in EXTERNAL:
        return False, set()
    while not command.ended() and (
            time.monotonic() - command.started < moment.after_s
            or sum(e["event"] == "received" for e in events(journal)) < moment.after_received):
        time.sleep(0.02)
    if command.ended():
        out.notes.append("ended before the fault")
        return False, set()
    pid = command.process.pid
    if fault == "full-disk":
        disk.fill()
        return True, set()
    if fault in ("kill9", "sigterm"):
        alive = set(tagged_processes(command.tag))
        os.kill(pid, signal.SIGKILL if fault == "kill9" else signal.SIGTERM)
        return True, alive if fault == "kill9" else set()  # its children die with it
    if fault == "sigint":
        os.killpg(pid, signal.SIGINT)
        return True, set()
    pattern = "_worker_main" if fault == "worker-kill9" else "spawn_main"
    victim = first_matching(command.tag, pattern, command.ended)
    if victim is None:
        out.notes.append(f"no {fault.removesuffix('-kill9')} process to kill")
        return False, set()
    children = {p for p, cmd in tagged_processes(command.tag).items() if p != victim and
                _parent(p) == victim}
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim, signal.SIGKILL)
    return True, {victim, *children}


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def judge_first_exit(fault: str, code: int | None, struck: bool, command: Command,
                     out: Outcome) -> None:
    """The faulted command's exit status must be what the fault allows."""
    # A signal before eqsched's handler is in place (Python starting) or after it is gone
    # (Python ending, the command's work done) ends the process at once.
    allowed = {"kill9": {-signal.SIGKILL}, "sigterm": {130, -signal.SIGTERM},
               "sigint": {130, -signal.SIGINT},
               # a batch whose job failed on the full disk exits 1, a failed command 2
               "full-disk": {0, 1, 2}}.get(fault, {0})
    if fault in EXTERNAL and not struck:
        allowed = {0}  # it ended first
    if code is None:
        out.problems.append("the faulted command did not end within 600 s")
    elif code not in allowed:
        out.problems.append(f"the faulted command exited {code}: "
                            f"{command.last_error_line()[:120]}")
    elif code == 2:
        if not command.last_error_line().startswith("eqsched: error: "):
            out.problems.append(f"exit 2 without a one-line error: "
                                f"{command.last_error_line()[:120]}")
        out.notes.append(_pathless(command.last_error_line().removeprefix("eqsched: error: ")))
    elif code == 1:  # a batch with a failed job: its row says why
        failed = [ln.split("(", 1)[-1] for ln in command.stderr.read_text().splitlines()
                  if ln.strip().startswith("failed:")]
        if not failed:
            out.problems.append(f"exit 1 without a failed job: {command.last_error_line()[:120]}")
        out.notes.extend(f"a job failed: {_pathless(why)}" for why in failed)


def _pathless(message: str) -> str:
    """`message` with each absolute path cut to its file name (the table groups equal notes)."""
    return re.sub(r"/\S*/", "", message)[:90]


def count_measurements(first: list[dict], second: list[dict], after_fault: set[str],
                       final: set[str], killed: set[int], out: Outcome) -> None:
    """Lost and twice, from the two commands' journals and the database after each."""
    exempt: set[tuple[str, int]] = set()  # (identity, pid): in flight, or refused by the disk
    ended = {(e["id"], e["pid"]): e["event"] for e in first if e["event"] != "received"}
    in_flight = refused = 0
    for e in first:
        if e["event"] != "received" or e["kind"] == TRANSIENT:
            continue
        how = ended.get((e["id"], e["pid"]))
        if how is None and e["pid"] in killed:
            exempt.add((e["id"], e["pid"]))
            in_flight += 1
        elif how == "store_failed":
            exempt.add((e["id"], e["pid"]))
            refused += 1
    received_again = {e["id"] for e in second if e["event"] == "received"}
    for ident in {e["id"] for e in first if e["event"] == "received" and e["kind"] != TRANSIENT
                  and (e["id"], e["pid"]) not in exempt}:
        if ident not in final or (ident not in after_fault and ident in received_again):
            out.lost += 1
    for run, before in ((first, set()), (second, after_fault)):
        held = set(before)  # what this command could have looked up, as it went
        for e in run:
            if e["event"] != "received":
                continue
            if e["id"] in held:
                out.twice += 1
            if e["kind"] != TRANSIENT and (e["id"], e["pid"]) not in exempt:
                held.add(e["id"])
    if in_flight:
        out.notes.append(f"{in_flight} in flight at the kill")
    if refused:
        out.notes.append(f"{refused} refused by the full disk")


def check_injected(fault: str, first: list[dict], out: Outcome) -> dict[str, str]:
    """Each broken candidate's error and kind; the broken candidates' program hashes, with the
    kind of what their measurement stored."""
    broken_ones = [e for e in first if e["event"] == "received" and e.get("injected")]
    if fault in KERNEL_FAULTS and not broken_ones:
        out.notes.append("no broken candidate was measured")
    text, kind = EXPECTED.get(fault, ("", ""))
    for e in broken_ones:
        if text not in (e["error"] or "") or e["kind"] != kind:
            out.problems.append(f"a {fault} candidate came back {e['kind']}: "
                                f"{(e['error'] or 'no error')[:80]}")
    if fault == "stray-module":
        errors = [e["error"] for e in first if e["event"] == "received" and e["error"]]
        if errors:
            out.problems.append(f"{len(errors)} measurements failed beside stray modules: "
                                f"{errors[0][:80]}")
    if broken_ones:
        out.notes.append(f"{len(broken_ones)} broken")
    return {json.loads(e["id"])[0]: e["kind"] for e in broken_ones}


def check_runs(db_path: Path, scenario: Scenario, injected: dict[str, str], first_runs: set[int],
               out: Outcome) -> None:
    """Runs left running, jobs not done, and every done run's best rebuilt and checked. A broken
    candidate must not be the best of the faulted command's runs; nor of the rerun's unless its
    broken measurement was transient (the rerun measured the real program then)."""
    from eqsched.db import ABANDONED, Database

    with Database(db_path, readonly=True) as db:
        runs = db.runs()
        records = db.records(target=None)

    def job_of(run: dict) -> str:
        return json.dumps([run[k] for k in ("workload", "size", "seed", "budget", "rules",
                                            "cost_model", "config")], sort_keys=True)

    done_after: dict[str, int] = {}
    for run in runs:
        if run["status"] == "done":
            done_after[job_of(run)] = run["id"]
    for run in runs:
        if run["status"] == "running" or (run["status"] == ABANDONED and
                                          done_after.get(job_of(run), -1) < run["id"]):
            out.left_running += 1
    for job in scenario.jobs:
        mine = [r for r in runs if r["workload"] == job.workload and tuple(r["size"]) == job.size]
        if not mine or mine[-1]["status"] != "done":
            out.unfinished += 1
            out.problems.append(f"{job.workload}'s last run is "
                                f"{mine[-1]['status'] if mine else 'missing'}")
    for run in runs:
        best = run["summary"].get("best_hash")
        if run["status"] == "done" and best is not None:
            broken_here = {h for h, kind in injected.items()
                           if run["id"] in first_runs or kind != TRANSIENT}
            problem = best_problem(run, best, records, broken_here)
            if problem:
                out.wrong_best += 1
                out.problems.append(problem)


def best_problem(run: dict, best: str, records: list, injected: set[str]) -> str | None:
    """Why a run's reported best is wrong, if it is: rebuilt from its stored trace, it must be
    the program of that hash and compute what numpy computes; it must not be a broken one."""
    from eqsched.backend import CompileOptions, Target
    from eqsched.ir import naive_program
    from eqsched.runner import measure
    from eqsched.schedule import Schedule
    from eqsched.workloads import get_workload

    if best in injected:
        return f"run {run['id']} reported a broken program as its best"
    stored = [r for r in records if r.program_hash.split("/threads=")[0] == best and r.correct
              and r.workload == run["workload"] and r.size == run["size"]]
    if not stored:
        return f"run {run['id']}'s best {best} has no correct measurement in the database"
    naive = naive_program(get_workload(run["workload"]).build(*run["size"]))
    program = Schedule.replay(naive, stored[0].trace).program
    if program.hash() != best:
        return f"run {run['id']}'s best trace rebuilds {program.hash()}, not {best}"
    target = (run["config"] or {}).get("target", "host")
    m = measure(program, repeats=1, warmup=0, options=CompileOptions(target=Target.parse(target)))
    if not m.correct:
        return (f"run {run['id']}'s best {best} computes a wrong result: "
                f"{m.error or m.check_message}")
    return None


# ---- the table --------------------------------------------------------------------------------


def clean_run_seconds(scenario: Scenario, work: Path) -> float:
    """How long `scenario` takes from an empty database, nothing injected (a fault's moment is
    drawn over it); raises if the clean run fails."""
    work.mkdir(parents=True)
    started = time.monotonic()
    command = Command.start(scenario.command(work / "clean.db", 0, work), cwd=work,
                            tag=f"{os.getpid()}-clean-{scenario.name}",
                            journal=work / "journal.jsonl", out=work / "clean")
    code = command.wait(limit_s=900)
    reap_orphans(command.tag)
    if code != 0:
        raise RuntimeError(f"the clean {scenario.name} run exited {code}: "
                           f"{command.last_error_line()}")
    return time.monotonic() - started


HEAD = ("fault", "scenario", "trials", "measured", "lost", "twice", "orphans", "left running",
        "wrong best", "tracebacks", "unfinished", "notes")


def table(rows: Iterable[tuple[str, str, list[Outcome]]]) -> str:
    lines = [HEAD]
    for fault, scenario, outcomes in rows:
        notes = Counter(n for o in outcomes for n in [*o.problems, *o.notes])
        measured = [sum(o.measured[i] for o in outcomes) for i in (0, 1)]
        lines.append((fault, scenario, str(len(outcomes)), "+".join(map(str, measured)),
                      *(str(sum(getattr(o, c) for o in outcomes)) for c in Outcome.COUNTS),
                      "; ".join(f"{n} (x{k})" if k > 1 else n for n, k in notes.items())))
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEAD) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[-1]
                     for line in lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["drive"]:
        return drive(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="seed of the moments and the runs")
    ap.add_argument("--repeats", type=int, default=1, help="trials per fault and scenario")
    ap.add_argument("--only", nargs="+", choices=FAULTS, metavar="FAULT",
                    help=f"only these faults ({', '.join(FAULTS)})")
    ap.add_argument("--scenarios", nargs="+", choices=tuple(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--keep", action="store_true", help="keep the trials' directories")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    faults = args.only or list(FAULTS)
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="eqsched-faults-"))
    started = time.monotonic()
    print(f"seed {args.seed}, {args.repeats} trial(s) per fault and scenario, in {root}",
          flush=True)
    rows = []
    try:
        for name in args.scenarios:
            scenario = SCENARIOS[name]
            clean_s = clean_run_seconds(scenario, root / f"clean-{name}")
            print(f"{name}: a clean run takes {clean_s:.1f} s", flush=True)
            for fault in faults:
                if not scenario.applies(fault):
                    continue
                outcomes = []
                for n in range(args.repeats):
                    moment = Moment(after_s=rng.uniform(0.05, 0.95) * clean_s)
                    work = root / f"{name}-{fault}-{n}"
                    work.mkdir()
                    try:
                        outcome = run_trial(scenario, fault, rng, work, moment)
                    except OSError as e:
                        if fault != "full-disk":
                            raise
                        print(f"  {fault}: skipped ({e})", flush=True)
                        break
                    outcomes.append(outcome)
                    print(f"  {fault} #{n} at {moment.after_s:.1f} s: {outcome}", flush=True)
                if outcomes:
                    rows.append((fault, name, outcomes))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(table(rows))
    print(f"\nwall time {time.monotonic() - started:.0f} s, seed {args.seed}")
    return 1 if any(o.failed() for _, _, outcomes in rows for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
