"""Batch exploration: a suite of workloads x sizes x configurations, resumable from the database.

    eqsched batch examples/suites/small.toml --jobs 2 --db runs.db
    eqsched batch suite.toml --executor ray [--ray-address auto]
    eqsched batch suite.toml --target host,-avx512f

A suite is a TOML file. `[defaults]` sets configuration keys for every exploration; each
`[[explore]]` names a workload, its `sizes` (lists of ints, or "small" / "default") and may
override keys. A key given a list is crossed with the others:

    [defaults]
    trials = 16
    threads = 1
    [[explore]]
    workload = "matmul"
    sizes = [[128, 128, 128], [256, 256, 256]]
    cost_model = ["analytic", "random"]        # 2 sizes x 2 models = 4 explorations

Keys: trials, seconds, seed, batch, population (the search's; default its own), threads,
repeats, rules (a spec like "-pack"), cost_model,
target (like "host,-avx512f"; `--target` sets it for a suite that does not), max_memory (the
measuring worker's memory cap, like "8G" or "50%"; `--max-memory` sets it for a suite that does
not; it does not tell two runs apart). A target LLVM does
not know, or one this machine cannot run, fails the whole suite before any job starts.
A size too big for the memory cap fails the suite too. Every exploration ends in one SQLite
database, which only this process (the driver) writes: a job explores into a snapshot of it and
sends its rows back. An exploration whose run already finished in the database is not run again;
an interrupted one is re-run and measures nothing it already stored. `--jobs` local processes,
one per job, run at once; `--executor ray` hands the same jobs to Ray tasks instead. A job whose
process dies is retried once; the others go on. The snapshots live beside the database
(`runs.db.tasks/`) while the batch runs; when the driver is killed outright, the next batch on
the database merges what its tasks stored.

    suite = Suite.load("suite.toml")
    result = run_batch(suite, "runs.db", jobs=2)
    print(result.table())

See docs/ARCHITECTURE.md §10 Exploration.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..args import (
    MEMORY_HELP,
    TARGET_HELP,
    CliError,
    max_memory_arg,
    max_memory_bytes,
    resumable_interrupt,
)

CONFIG_KEYS = {"trials": int, "seconds": (int, float), "seed": int, "batch": int,
               "population": int, "threads": int, "repeats": int, "rules": str,
               "cost_model": str, "target": str, "max_memory": (int, str)}
DEFAULTS = {"trials": 64, "seconds": None, "seed": 0, "batch": 16, "population": None,
            "threads": None,
            "repeats": 10, "rules": None, "cost_model": "learned", "target": "host",
            "max_memory": None}


class BatchError(ValueError):
    """A malformed suite: names the file, the entry and the field."""


@dataclass(frozen=True)
class Job:
    workload: str
    size: tuple[int, ...]
    config: tuple[tuple[str, Any], ...]  # sorted (key, value) pairs, every key of DEFAULTS

    @property
    def key(self) -> str:
        given = " ".join(f"{k}={v}" for k, v in self.config if v is not None)
        return f"{self.workload}/{'x'.join(map(str, self.size))} {given}"

    def settings(self) -> dict[str, Any]:
        return dict(self.config)


@dataclass
class Suite:
    path: str
    jobs: list[Job]

    @classmethod
    def load(cls, path: str | Path, target: str = "host", max_memory: int | None = None
             ) -> Suite:
        """The suite in the TOML file at `path`; `target` and `max_memory` for jobs that set
        none."""
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise BatchError(f"cannot read suite {path}: {e.strerror}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise BatchError(f"{path}: not valid TOML ({e})") from None
        return cls.from_dict(data, str(path), target, max_memory)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "<suite>",
                  target: str = "host", max_memory: int | None = None) -> Suite:
        from ..runner import TooLargeError, check_fits_in_memory
        from ..workloads import get_workload

        base = {**DEFAULTS, **_config({"target": target}, f"{where} (the batch's target)")}
        if max_memory is not None:
            base.update(_config({"max_memory": max_memory}, f"{where} (the batch's max memory)"))
        unknown = set(data) - {"defaults", "explore"}
        if unknown:
            raise BatchError(f"{where}: unknown section {sorted(unknown)[0]!r} (use [defaults] "
                             f"and [[explore]])")
        defaults = data.get("defaults", {})
        if not isinstance(defaults, dict):
            raise BatchError(f"{where}: defaults must be a table ([defaults] with key = value "
                             f"lines), got {_toml_kind(defaults)}")
        defaults = _config(defaults, f"{where} [defaults]")
        entries = data.get("explore", [])
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            what = _toml_kind(entries) if not isinstance(entries, list) else \
                "an array holding " + " and ".join(sorted({_toml_kind(e) for e in entries
                                                           if not isinstance(e, dict)}))
            raise BatchError(f"{where}: explore must be [[explore]] tables, each with a "
                             f"workload, got {what}")
        if not entries:
            raise BatchError(f"{where}: no [[explore]] entries")
        jobs: list[Job] = []
        for n, entry in enumerate(entries, 1):
            at = f"{where} [[explore]] #{n}"
            entry = dict(entry)
            name = entry.pop("workload", None)
            if not isinstance(name, str):
                raise BatchError(f"{at}: 'workload' must be a workload name")
            try:
                wl = get_workload(name)
            except Exception as e:
                raise BatchError(f"{at}: {e}") from None
            if "sizes" in entry and "size" in entry:
                raise BatchError(f"{at}: give sizes or size, not both")
            sizes = entry.pop("sizes", entry.pop("size", "default"))
            if sizes == []:
                raise BatchError(f"{at}: sizes = [] lists no size")
            sizes = sizes if isinstance(sizes, list) and sizes and isinstance(
                sizes[0], (list, str)) else [sizes]
            resolved = [_size(wl, s, at) for s in sizes]
            overrides = _config(entry, at)
            merged = {**base, **defaults, **overrides}
            lists = {k: v if isinstance(v, list) else [v] for k, v in merged.items()}
            for size in resolved:
                for values in itertools.product(*lists.values()):
                    job = Job(wl.name, size, tuple(sorted(zip(lists, values))))
                    try:  # before any job starts
                        check_fits_in_memory(wl.build(*size), job.settings()["max_memory"])
                    except TooLargeError as e:
                        raise BatchError(f"{at}: {e}") from None
                    jobs.append(job)
        keys = [j.key for j in jobs]
        dup = next((k for k in keys if keys.count(k) > 1), None)
        if dup:
            raise BatchError(f"{where}: exploration {dup!r} is listed twice")
        return cls(where, jobs)


def _toml_kind(value: Any) -> str:
    """What a TOML value is, in TOML's words."""
    kinds = ((bool, "a boolean"), (dict, "a table ([name], not [[name]])"), (list, "an array"),
             (str, "a string"), (int, "an integer"), (float, "a float"))
    return next((word for kind, word in kinds if isinstance(value, kind)), "a date or time")


def _size(wl: Any, spec: Any, at: str) -> tuple[int, ...]:
    if spec in ("small", "default"):
        return wl.small_size if spec == "small" else wl.default_size
    if not isinstance(spec, list):
        raise BatchError(f"{at}: a size is a list of integers, \"small\" or \"default\", "
                         f"not {spec!r}")
    try:
        return wl.check_size(tuple(spec))
    except Exception as e:
        raise BatchError(f"{at}: {e}") from None


def _config(table: dict[str, Any], at: str) -> dict[str, Any]:
    from ..backend import Target, TargetError
    from ..explore import check_population, check_seconds
    from ..extract import COST_MODELS
    from ..rules import resolve
    from ..trials import check_seed

    out = {}
    for key, value in table.items():
        if key not in CONFIG_KEYS:
            raise BatchError(f"{at}: unknown key {key!r} (keys: {', '.join(CONFIG_KEYS)})")
        values = value if isinstance(value, list) else [value]
        if not values:  # crossed with the other keys, it would leave no exploration at all
            raise BatchError(f"{at}: {key} = [] lists no value")
        for v in values:
            kind = CONFIG_KEYS[key]
            if isinstance(v, bool) or not isinstance(v, kind):
                raise BatchError(f"{at}: {key} = {v!r} has the wrong type")
            try:
                if key == "seed":
                    check_seed(v)
                elif key == "seconds":
                    check_seconds(v)
                elif key == "population":
                    check_population(v)
            except ValueError as e:
                raise BatchError(f"{at}: {e}") from None
            if kind is int and key != "seed" and v < 1:
                raise BatchError(f"{at}: {key} = {v} must be positive")
            if key == "cost_model" and v not in COST_MODELS:
                raise BatchError(f"{at}: unknown cost model {v!r} (known: "
                                 f"{', '.join(sorted(COST_MODELS))})")
            if key == "rules":
                try:
                    resolve(v)
                except Exception as e:
                    raise BatchError(f"{at}: {e}") from None
        if key == "target":
            # Normalized, so that two spellings of one target are one job.
            try:
                specs = [Target.parse(v) for v in values]
                for t in specs:
                    t.check_runs_here()
            except TargetError as e:
                raise BatchError(f"{at}: {e}") from None
            value = [t.spec for t in specs] if isinstance(value, list) else specs[0].spec
        if key == "max_memory":  # in bytes, so that 8G and 8192M are one job
            try:
                caps = [max_memory_bytes(v) for v in values]
            except ValueError as e:
                raise BatchError(f"{at}: {e}") from None
            value = caps if isinstance(value, list) else caps[0]
        out[key] = value
    return out


# ---- one job ----------------------------------------------------------------------------------


def finished_row(job: Job, db_path: str) -> dict[str, Any] | None:
    """The summary of a finished run of exactly this job in the database, if there is one."""
    from ..db import Database
    from ..explore import POPULATION
    from ..rules import resolve
    from ..trials import Settings

    c = job.settings()
    if not Path(db_path).exists():
        return None
    settings = asdict(Settings(repeats=c["repeats"], threads=c["threads"], target=c["target"]))
    budget = {"trials": c["trials"], "seconds": c["seconds"], "batch": c["batch"],
              "population": c["population"] or POPULATION}
    rules = [r.name for r in resolve(c["rules"])]
    with Database(db_path, readonly=True) as db:
        for run in db.runs_like(job.workload, list(job.size), seed=c["seed"], budget=budget,
                                rules=rules, cost_model=c["cost_model"], config=settings):
            if run["status"] == "done":
                return _row(job, "done", run["summary"], measured=0, note="from db")
    return None


def explore_job(job: Job, db_path: str) -> dict[str, Any]:
    """Explore one job into the database at `db_path` (in a batch, the task's private copy);
    returns its summary row. Never raises for a failed exploration: the error is the row's."""
    c = job.settings()
    try:
        from ..explore import POPULATION, explore  # a second or more: Ctrl-C may come meanwhile
        from ..trials import Settings

        result = explore(job.workload, job.size, trials=c["trials"], seconds=c["seconds"],
                         db=db_path, seed=c["seed"], cost_model=c["cost_model"],
                         rules=c["rules"], batch=c["batch"],
                         population=c["population"] or POPULATION,
                         settings=Settings(repeats=c["repeats"], threads=c["threads"],
                                           target=c["target"], max_memory=c["max_memory"]))
    except KeyboardInterrupt:
        return _row(job, "interrupted", {}, note="interrupted while setting up")
    except Exception as e:  # recorded in the table; the other jobs go on
        return _row(job, "failed", {}, note=f"{type(e).__name__}: {e}".splitlines()[0])
    status = "interrupted" if result.interrupted else "done"
    return _row(job, status, result.to_json(), measured=result.measured)


def _row(job: Job, status: str, summary: dict[str, Any], measured: int | None = None,
         note: str = "") -> dict[str, Any]:
    return {"job": job.key, "workload": job.workload, "size": list(job.size),
            "config": job.settings(), "status": status, "trials": summary.get("trials"),
            "measured": summary.get("measured") if measured is None else measured,
            "best_gflops": summary.get("best_gflops"),
            "percent_of_peak": summary.get("percent_of_peak"),
            "speedup_over_naive": summary.get("speedup_over_naive"),
            "wall_s": summary.get("wall_s"), "note": note}


# ---- tasks: one writer ------------------------------------------------------------------------
#
# A task (a local process or a Ray task) never opens the batch's database. It explores into its
# own copy, a snapshot of the batch's database taken when the task is handed out (so it looks up
# what earlier jobs measured), and gives back the rows of its new runs as JSON lines, which the
# driver alone imports. SQLite files are thus never shared between processes or hosts, and a task
# that dies leaves the batch's database as it was.
#
# The copies live beside the database, in TASKS_DIR/driver-*/, one directory per driver, locked
# while it lives. A driver killed outright (kill -9, the OOM killer, a reboot) leaves its
# directory behind with what its tasks stored; the next batch on the database merges it.

TASK_DB = "task.db"
TASK_ROWS = "rows.jsonl"
TASK_RESULT = "row.json"
SNAPSHOT_RUNS = "snapshot_runs.json"  # the ids of the runs the task database began with
TASKS_DIR = ".tasks"  # "runs.db.tasks" beside "runs.db": its drivers' task databases
_DRIVER_LOCK = "lock"  # in a driver's directory: locked (flock) while the driver lives


def _task(job: Job, work_dir: str) -> dict[str, Any]:
    """Explore `job` into `work_dir`'s task database (a snapshot of the batch's); write the new
    runs' rows to TASK_ROWS; returns the summary row."""

    row = explore_job(job, str(Path(work_dir) / TASK_DB))
    _export_new_runs(work_dir, _snapshot_runs(Path(work_dir)))
    return row


def _export_new_runs(work_dir: str, before: set[int]) -> None:
    """The rows of the task database's runs not in `before` as JSON lines in TASK_ROWS; a run
    that never finished (its task died) is marked interrupted first, so that it resumes."""
    from ..db import Database

    with Database(Path(work_dir) / TASK_DB) as db:
        new = [run for run in db.runs() if run["id"] not in before]
        for run in new:
            if run["status"] not in ("done", "interrupted", "failed"):  # running, abandoned
                db.finish_run(run["id"], status="interrupted", summary=run["summary"])
        db.export_jsonl(Path(work_dir) / TASK_ROWS, run_ids={run["id"] for run in new})


def _snapshot(db_path: str, work_dir: Path) -> None:
    """Copy the batch's database into `work_dir` as the task's (read-only: the driver may be
    writing it)."""
    from ..db import Database

    work_dir.mkdir(parents=True, exist_ok=True)
    with Database(db_path, readonly=True) as db:
        db.copy_to(work_dir / TASK_DB)
    with Database(work_dir / TASK_DB, readonly=True) as copy:
        runs = [run["id"] for run in copy.runs()]
    (work_dir / SNAPSHOT_RUNS).write_text(json.dumps(runs))


def _snapshot_runs(work_dir: Path) -> set[int]:
    return set(json.loads((work_dir / SNAPSHOT_RUNS).read_text()))


def _merge(db_path: str, rows_file: Path) -> int:
    """Import a task's rows into the batch's database (the driver is its only writer); returns
    the measurements added."""
    from ..db import Database

    if not rows_file.exists():
        return 0
    with Database(db_path) as db:
        return db.import_jsonl(rows_file)


def tasks_dir(db_path: str | Path) -> Path:
    """Where the batch drivers of the database at `db_path` keep their tasks' databases."""
    return Path(f"{db_path}{TASKS_DIR}")


@contextlib.contextmanager
def _driver_scratch(db_path: str) -> Iterator[Path]:
    """This driver's directory for its tasks' databases (in `tasks_dir`), locked while it lives.
    Removed when it ends unless a task's database in it was not merged (the database could not
    be written, say): that, like the directory of a driver killed outright, is left to
    `_recover_tasks`."""
    root = tasks_dir(db_path)
    for attempt in (1, 2):
        root.mkdir(exist_ok=True)
        try:
            scratch = Path(tempfile.mkdtemp(prefix="driver-", dir=root))
            break
        except FileNotFoundError:  # another driver ending removed the empty root meanwhile
            if attempt == 2:
                raise
    # Locked under another name, then renamed: `_recover_tasks` passes over a directory
    # without a lock file (being created) and one whose lock is held (its driver lives).
    lock = open(scratch / f"{_DRIVER_LOCK}.new", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.rename(scratch / f"{_DRIVER_LOCK}.new", scratch / _DRIVER_LOCK)
        yield scratch
    finally:
        # A task's directory is removed once its rows are merged: one still here was not.
        if not any(p.is_dir() for p in scratch.iterdir()):
            shutil.rmtree(scratch, ignore_errors=True)
        lock.close()
        with contextlib.suppress(OSError):  # not empty: another driver's directory is there
            root.rmdir()


def _recover_tasks(db_path: str) -> int:
    """Merge what the tasks of drivers that were killed outright stored in their databases
    (their runs marked interrupted, so that they resume); returns the measurements added."""
    root = tasks_dir(db_path)
    added = 0
    for scratch in sorted(root.glob("driver-*")) if root.is_dir() else []:
        try:
            lock = open(scratch / _DRIVER_LOCK)
        except OSError:  # being created, or being removed by its driver
            continue
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its driver is alive
                continue
            for work_dir in sorted(p for p in scratch.iterdir() if p.is_dir()):
                # Without SNAPSHOT_RUNS the snapshot was still being taken: no task ran on it.
                if (work_dir / SNAPSHOT_RUNS).exists() and (work_dir / TASK_DB).exists():
                    _export_new_runs(str(work_dir), _snapshot_runs(work_dir))
                    added += _merge(db_path, work_dir / TASK_ROWS)
                shutil.rmtree(work_dir)
            shutil.rmtree(scratch)
    with contextlib.suppress(OSError):
        root.rmdir()
    return added


# ---- executors --------------------------------------------------------------------------------

def _process_main(job: Job, work_dir: str, driver: int) -> None:
    """A local task process of the driver with pid `driver`: explore `job` in `work_dir`, its
    summary row into TASK_RESULT."""
    # A task outliving its driver (kill -9) would explore into a copy nobody merges: it dies
    # with it (Linux: PR_SET_PDEATHSIG), and its measuring worker with it (§11).
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, ctypes.c_ulong(signal.SIGKILL), *[ctypes.c_ulong(0)] * 3)
    if os.getppid() != driver:  # the driver died before the signal was asked for
        os._exit(1)
    # Ctrl-C during the exploration stops it after its current measurement and marks its run
    # interrupted; before it, the job is interrupted with nothing to hand back. The process
    # starts with SIGINT blocked (`_start_task`): one that came while it was starting up, when
    # it would have been Python's KeyboardInterrupt traceback, is delivered here.
    signal.signal(signal.SIGINT, _interrupt_once)
    try:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            row = _task(job, work_dir)
        except KeyboardInterrupt:  # before its exploration was under way
            row = _row(job, "interrupted", {}, note="interrupted while starting")
        (Path(work_dir) / TASK_RESULT).write_text(json.dumps(row))
    except Exception as e:  # its exploration's failures are in its row: this is handing it back
        # One line, not multiprocessing's traceback; the driver tries again (a full disk, say).
        print(f"eqsched: error: {job.key}: {e}".splitlines()[0], file=sys.stderr)
        sys.exit(1)


def _start_task(process: multiprocessing.process.BaseProcess) -> None:
    """Start a task process with SIGINT blocked: until `_process_main` takes it over, a Ctrl-C
    would be Python's KeyboardInterrupt traceback (importing takes a second or more). The mask
    is inherited across the spawn; `multiprocessing`'s resource tracker, started first, would
    unblock it when it starts its own process."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _interrupt_once(signum: int, frame: Any) -> None:
    # The terminal's Ctrl-C and the driver's both arrive: a second one must not cut short the
    # exploration's own handling of the first (marking its run interrupted, exporting its rows).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


Progress = Callable[[str, dict[str, Any]], None]
RETRIES = 1  # a task whose process died is run once more


def _run_local(jobs: list[Job], db_path: str, workers: int, scratch: Path, say: Progress
               ) -> tuple[list, bool]:
    """Each job in its own process, `workers` at once: a process that dies (killed, out of
    memory) costs only its job, which is retried once; what it measured before is kept."""
    from multiprocessing.connection import wait as wait_for

    context = multiprocessing.get_context("spawn")
    rows: dict[Job, dict[str, Any]] = {}
    queue = [(job, 0) for job in jobs]
    running: dict[Any, tuple[Job, int, Path]] = {}  # process -> job, attempt, work dir
    interrupted = False
    try:
        while queue or running:
            while queue and len(running) < workers:
                job, attempt = queue.pop(0)
                work_dir = scratch / f"job{jobs.index(job)}-{attempt}"
                _snapshot(db_path, work_dir)
                process = context.Process(target=_process_main,
                                          args=(job, str(work_dir), os.getpid()),
                                          daemon=True)
                _start_task(process)
                running[process] = (job, attempt, work_dir)
            ended = wait_for([p.sentinel for p in running])
            for process in [p for p in running if p.sentinel in ended]:
                process.join()
                job, attempt, work_dir = running.pop(process)
                row = _collect(job, process.exitcode, work_dir, db_path)
                if row["status"] == "died" and attempt < RETRIES:
                    say("retry", row)
                    queue.insert(0, (job, attempt + 1))
                    continue
                if row["status"] == "died":
                    row["status"] = "failed"
                rows[job] = row
                say("job", row)
                if row["status"] == "interrupted":
                    # Ctrl-C reached the job, but this process did not raise
                    # KeyboardInterrupt (seen once in CI): stop all the same.
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        interrupted = True
        for process in running:  # their explorations stop after their current measurement
            if process.is_alive():
                os.kill(process.pid, signal.SIGINT)
        for process, (job, _, work_dir) in running.items():
            process.join()
            rows[job] = _collect(job, process.exitcode, work_dir, db_path)
            if rows[job]["status"] == "died":
                rows[job]["status"] = "interrupted"
    return [rows.get(j) or _row(j, "not run", {}) for j in jobs], interrupted


def _collect(job: Job, exitcode: int | None, work_dir: Path, db_path: str) -> dict[str, Any]:
    """The row of a finished task process, its rows merged into the batch's database; a task
    that died is "died" (what it stored before is merged all the same)."""
    result = work_dir / TASK_RESULT
    if exitcode == 0 and result.exists():
        row = json.loads(result.read_text())
    else:
        # Exported again: the process may have died while writing TASK_ROWS.
        if (work_dir / TASK_DB).exists():
            _export_new_runs(str(work_dir), _snapshot_runs(work_dir))
        how = f"signal {-exitcode}" if exitcode is not None and exitcode < 0 else \
            f"exit status {exitcode}"
        row = _row(job, "died", {}, note=f"its process died ({how})")
    _merge(db_path, work_dir / TASK_ROWS)
    shutil.rmtree(work_dir, ignore_errors=True)
    return row


def _ray_task(job: Job, snapshot: bytes, snapshot_runs: list[int]) -> tuple[dict, str]:
    """A Ray task: explore `job` in a temporary copy of the batch's database (`snapshot`, the
    file's bytes); returns the summary row and the new runs' rows as JSON lines."""
    with tempfile.TemporaryDirectory(prefix="eqsched-task-") as work_dir:
        (Path(work_dir) / TASK_DB).write_bytes(snapshot)
        (Path(work_dir) / SNAPSHOT_RUNS).write_text(json.dumps(snapshot_runs))
        row = _task(job, work_dir)
        return row, (Path(work_dir) / TASK_ROWS).read_text()


def _run_ray(jobs: list[Job], db_path: str, address: str | None, scratch: Path, say: Progress
             ) -> tuple[list, bool]:
    """The jobs as Ray tasks: each gets a snapshot of the batch's database and sends back its
    rows, which this process writes; a task whose worker died is retried once."""
    try:
        import ray
        from ray.exceptions import RayError
    except ImportError:
        raise BatchError("--executor ray needs Ray: pip install 'eqsched[ray]'") from None
    if not ray.is_initialized():
        try:
            ray.init(address=address or "auto", log_to_driver=False)
        except ConnectionError:
            if address:
                raise BatchError(f"no Ray cluster at {address}") from None
            print("eqsched: no Ray cluster found; starting a local one", file=sys.stderr)
            ray.init(log_to_driver=False)
    remote = ray.remote(num_cpus=1, max_retries=0)(_ray_task)

    def submit(job: Job, attempt: int) -> Any:
        work_dir = scratch / f"job{jobs.index(job)}-{attempt}"
        _snapshot(db_path, work_dir)
        ref = remote.remote(job, (work_dir / TASK_DB).read_bytes(),
                            sorted(_snapshot_runs(work_dir)))
        refs[ref] = (job, attempt, work_dir)
        return ref

    refs: dict[Any, tuple[Job, int, Path]] = {}
    pending = [submit(job, 0) for job in jobs]
    rows: dict[Job, dict[str, Any]] = {}
    interrupted = False

    def finish(ref: Any) -> dict[str, Any]:
        job, attempt, work_dir = refs[ref]
        try:
            row, task_rows = ray.get(ref)
        except RayError as e:
            note = f"its Ray task failed ({type(e).__name__})"
            row, task_rows = _row(job, "died", {}, note=note), ""
        (work_dir / TASK_ROWS).write_text(task_rows)
        _merge(db_path, work_dir / TASK_ROWS)
        shutil.rmtree(work_dir, ignore_errors=True)
        return row

    try:
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                job, attempt, _ = refs[ref]
                row = finish(ref)
                if row["status"] == "died" and attempt < RETRIES:
                    say("retry", row)
                    pending.append(submit(job, attempt + 1))
                    continue
                if row["status"] == "died":
                    row["status"] = "failed"
                rows[job] = row
                say("job", row)
    except KeyboardInterrupt:
        interrupted = True
        for ref in pending:
            ray.cancel(ref)  # a running task gets KeyboardInterrupt: its run is "interrupted"
        for ref in pending:
            row = finish(ref)
            rows[refs[ref][0]] = {**row, "status": "interrupted"} if row["status"] == "died" \
                else row
    return [rows.get(j) or _row(j, "not run", {}) for j in jobs], interrupted


@dataclass
class BatchResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    wall_s: float = 0.0

    def table(self) -> str:
        head = ("job", "status", "trials", "measured", "GFLOPS", "% peak", "x naive", "wall s")
        lines = [head]
        for r in self.rows:
            lines.append((r["job"], r["status"] + (f" ({r['note']})" if r["note"] else ""),
                          _cell(r["trials"]), _cell(r["measured"]), _cell(r["best_gflops"]),
                          _cell(r["percent_of_peak"]), _cell(r["speedup_over_naive"]),
                          _cell(r["wall_s"])))
        widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
        return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(line, widths)))
                         for line in lines)

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "interrupted": self.interrupted, "wall_s": self.wall_s}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def run_batch(suite: Suite, db: str | Path, jobs: int = 1, executor: str = "local",
              ray_address: str | None = None, progress: Progress | None = None) -> BatchResult:
    """Run every job of `suite` into the database at `db`; see the module docstring. First,
    what tasks of a batch on `db` whose driver was killed stored is merged (`progress` hears
    "recovered" with the number of measurements); then each job's row is reported ("job", or
    "retry" when its process died)."""
    if jobs < 1:
        raise BatchError(f"jobs must be >= 1, got {jobs}")
    if executor not in ("local", "ray"):
        raise BatchError(f"unknown executor {executor!r} (local or ray)")
    db_path = str(Path(db).resolve())
    from ..db import Database

    Database(db_path).close()  # a corrupt or foreign file fails here, before any job starts
    say = progress or (lambda event, data: None)
    started = time.perf_counter()
    recovered = _recover_tasks(db_path)
    if recovered:
        say("recovered", {"measurements": recovered})
    done = {job: finished_row(job, db_path) for job in suite.jobs}
    for row in done.values():
        if row is not None:
            say("job", row)
    todo = [job for job in suite.jobs if done[job] is None]
    with _driver_scratch(db_path) as scratch:
        if not todo:
            ran, interrupted = {}, False
        elif executor == "ray":
            rows, interrupted = _run_ray(todo, db_path, ray_address, scratch, say)
            ran = dict(zip(todo, rows))
        else:
            rows, interrupted = _run_local(todo, db_path, jobs, scratch, say)
            ran = dict(zip(todo, rows))
    rows = [done[job] or ran[job] for job in suite.jobs]
    return BatchResult(rows, interrupted, time.perf_counter() - started)


# ---- command line -----------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = sub.add_parser("batch", help="run a suite of explorations (TOML), resumable")
    p.add_argument("suite", help="a suite file, like examples/suites/small.toml")
    p.add_argument("--jobs", type=int, default=1, help="explorations at once (default 1)")
    p.add_argument("--db", default="eqsched.db", help="results database (default eqsched.db)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local worker processes (default) or Ray tasks")
    p.add_argument("--ray-address", help="a Ray cluster's address (default: RAY_ADDRESS or "
                                         "the running cluster; else a local one)")
    p.add_argument("--target", default="host",
                   help=TARGET_HELP + "; for the jobs whose suite sets no target")
    p.add_argument("--max-memory", type=max_memory_arg,
                   help=MEMORY_HELP + "; for the jobs whose suite sets none")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(run=_cmd_batch)


def _cmd_batch(args: Any) -> int:
    from ..db import DatabaseError

    if args.jobs < 1:
        raise CliError(f"--jobs must be >= 1, got {args.jobs}")
    try:
        suite = Suite.load(args.suite, args.target, args.max_memory)
        print(f"eqsched: {len(suite.jobs)} explorations from {args.suite}", file=sys.stderr)

        def show(event: str, row: dict[str, Any]) -> None:
            if event == "recovered":
                print(f"eqsched: merged {row['measurements']} measurements that tasks of an "
                      f"earlier batch stored but did not hand back (its driver was killed or "
                      f"failed)", file=sys.stderr)
                return
            gf = row["best_gflops"]
            status = "retrying" if event == "retry" else row["status"]
            print(f"  {status:>11}: {row['job']}" + (f"  {gf:.1f} GFLOPS" if gf else "")
                  + (f"  ({row['note']})" if row["note"] else ""), file=sys.stderr)

        result = run_batch(suite, args.db, jobs=args.jobs, executor=args.executor,
                           ray_address=args.ray_address or os.environ.get("RAY_ADDRESS"),
                           progress=show)
    except (BatchError, DatabaseError) as err:
        raise CliError(str(err)) from None
    except OSError as err:  # the tasks' files beside the database: a full disk, say
        raise CliError(f"cannot write {err.filename or 'the tasks files'} ({err.strerror})"
                       ) from None
    print(json.dumps(result.to_json()) if args.json else result.table())
    if result.interrupted:
        return resumable_interrupt()
    return 1 if any(r["status"] == "failed" for r in result.rows) else 0
