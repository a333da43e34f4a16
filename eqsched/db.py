"""The results database: every measured program of every exploration run, in one SQLite file.

Exploration stores each measurement the moment it has it, so an interrupted run resumes without
measuring anything twice, and runs on several machines can be exported, merged and compared.
Timings only compare on the machine and for the target that took them: each measurement carries a
fingerprint of its machine and the target its code was compiled for (`backend.Target.spec`, like
"host" or "host,-avx512f"), and `lookup`, `best` and `records` answer for this machine and one
target (the host unless told).

    with Database("results.db") as db:
        run = db.start_run(workload="matmul", size=[512, 512, 512], seed=0, budget={"trials": 64},
                           rules=["tile", "reorder"], cost_model="random",
                           machine=machine.facts(), versions=machine.versions())
        if db.lookup("matmul", [512, 512, 512], prog.hash()) is None:
            db.add(Record("matmul", [512, 512, 512], prog.hash(), "", {}, trace, m.times,
                          m.median_s, m.gflops, m.correct, m.error, run_id=run))
        db.finish_run(run, status="done", summary={"best_s": db.best("matmul", [512] * 3).median_s})
        db.lookup("matmul", [512, 512, 512], prog.hash(), target="host,-avx512f")  # another target

A measurement's error has a kind (`error_kind`): "transient" (a timeout, a dead worker, out of
memory, an interrupt: it may not happen again) or "deterministic" (a compile error, a wrong result,
an illegal program: it will). `lookup` never answers with a transient failure, and `add` replaces
one, so a rerun measures those programs again. The lookup key holds what decides an outcome
(`Record.settings`, `trials.Settings.outcome`: the `MEASUREMENT_SETTINGS` and the backend's code
generator, so an upgraded backend measures again what an older one timed). A run
records the process that runs it (pid, host, start time): `runs` shows a `running` run whose process
is gone as `abandoned`.

A whole model's tuning (`eqsched tune-model`) is one model run (`start_model_run`,
`finish_model_run`, `model_runs`) in a table of its own, beside the ordinary runs of its tasks.

Older databases are migrated when opened for writing and read as if migrated when opened
read-only (the file is not touched): version 1 (before targets) was compiled for the host; before
version 3 errors had no kind (those not clearly deterministic are taken as transient), measurements
no settings (they are their run's, as its config recorded them) and runs no process.

See docs/ARCHITECTURE.md §12 The database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import operator
import os
import re
import shutil
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import machine
from .backend.target import HOST

SCHEMA_VERSION = 4
RUN_STATUSES = ("done", "interrupted", "failed")
# What `runs` shows for a run still marked running whose process is gone (killed, crashed, its
# machine rebooted); it is never stored, and a batch re-runs it like an interrupted one.
ABANDONED = "abandoned"
ERROR_KINDS = ("transient", "deterministic")
# The fields of `trials.Settings` that decide a measurement's outcome besides the target and the
# thread count (both in the key already): the inputs checked against, and how many runs are
# timed. The timeout is not one: a success does not depend on it and a timeout is transient.
MEASUREMENT_SETTINGS = ("input_seed", "min_repeats", "repeats", "time_budget_s", "warmup")

_APP = "eqsched"
_SQLITE_MAGIC = b"SQLite format 3\x00"
# Long enough for another process's transaction (one insert, or one import) to finish.
_BUSY_TIMEOUT_S = 60.0
# Free space below which a file system counts as full: SQLite cannot even write a page of
# its -wal and -shm files.
_ROOM_NEEDED = 64 << 10

_UNIQUE_MEASUREMENT = ("CREATE UNIQUE INDEX measurements_once ON measurements "
                       "(key, program_hash, machine_fp, target, settings)")
_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE runs (
        id INTEGER PRIMARY KEY, workload TEXT NOT NULL, size TEXT NOT NULL, key TEXT NOT NULL,
        seed INTEGER, budget TEXT NOT NULL, rules TEXT NOT NULL, cost_model TEXT NOT NULL,
        machine TEXT NOT NULL, versions TEXT NOT NULL, config TEXT NOT NULL,
        started_at REAL NOT NULL, finished_at REAL, status TEXT NOT NULL, summary TEXT NOT NULL,
        pid INTEGER, host TEXT, process TEXT, learned_from TEXT NOT NULL DEFAULT 'null')""",
    "CREATE INDEX runs_by_key ON runs (key)",
    """CREATE TABLE measurements (
        id INTEGER PRIMARY KEY, run_id INTEGER REFERENCES runs (id), key TEXT NOT NULL,
        program_hash TEXT NOT NULL, machine_fp TEXT NOT NULL, structure TEXT NOT NULL,
        sizes TEXT NOT NULL, trace TEXT NOT NULL, times TEXT NOT NULL, median_s REAL,
        gflops REAL, correct INTEGER, error TEXT, predicted_s REAL, round INTEGER,
        created_at REAL NOT NULL, target TEXT NOT NULL DEFAULT 'host', error_kind TEXT,
        settings TEXT NOT NULL DEFAULT '{}', others_cores REAL, load REAL)""",
    _UNIQUE_MEASUREMENT,
)
_TABLES = ("meta", "measurements", "runs")
# Values computed from a measurement's program (a learned model's inputs), under a key that names
# how they were computed. A cache, not data: added to a database when it is opened for writing,
# absent from read-only ones that predate it, never exported. Older eqsched ignore the table, so
# it takes no schema version of its own.
_DERIVED_SCHEMA = """CREATE TABLE IF NOT EXISTS derived (
    measurement_id INTEGER NOT NULL REFERENCES measurements (id), key TEXT NOT NULL,
    value TEXT NOT NULL, PRIMARY KEY (measurement_id, key))"""
# A whole model tuned (`tools.tune_model`): its name and graph fingerprint, its settings, the
# machine and versions, status and process as a run's, and a summary (the tuning curve, end-to-end
# latencies and each task's time before and after). Its tasks' explorations are ordinary `runs`;
# this table only ties them into one model, so no consumer of `runs` ever meets a model. Added
# when a database is opened for writing, absent from older read-only files (read as no model
# runs), never exported, and ignored by older eqsched: no schema version of its own.
_MODEL_RUNS_SCHEMA = """CREATE TABLE IF NOT EXISTS model_runs (
    id INTEGER PRIMARY KEY, model TEXT NOT NULL, fingerprint TEXT NOT NULL,
    settings TEXT NOT NULL, machine TEXT NOT NULL, versions TEXT NOT NULL,
    machine_fp TEXT NOT NULL, started_at REAL NOT NULL, finished_at REAL, status TEXT NOT NULL,
    summary TEXT NOT NULL, pid INTEGER, host TEXT, process TEXT)"""
_MODEL_RUN_JSON = ("settings", "machine", "versions", "summary")

_RUN_COLUMNS = ("workload", "size", "key", "seed", "budget", "rules", "cost_model", "machine",
                "versions", "config", "started_at", "finished_at", "status", "summary", "pid",
                "host", "process", "learned_from")
_RUN_JSON = ("size", "budget", "rules", "machine", "versions", "config", "summary",
             "learned_from")
_MEASUREMENT_COLUMNS = ("run_id", "key", "program_hash", "machine_fp", "structure", "sizes",
                        "trace", "times", "median_s", "gflops", "correct", "error", "predicted_s",
                        "round", "created_at", "target", "error_kind", "settings",
                        "others_cores", "load")
_MEASUREMENT_JSON = ("sizes", "trace", "times", "settings")


class DatabaseError(ValueError):
    """A file that is not a usable eqsched database, or a malformed import; names the file."""


@dataclass
class Record:
    """One measured program. `add` fills `created_at` (when 0) and `machine_fp` (when "")."""

    workload: str
    size: list[int]
    program_hash: str  # Program.hash()
    structure: str  # eqsched.egraph.term.show(term), "" for hand-written programs
    sizes: dict[str, int]  # tile sizes, {"C.i|0/4": 8, ...}
    trace: list[dict]  # Schedule.trace: replayable steps
    times: list[float]  # every repeat's seconds, [] on error
    median_s: float | None
    gflops: float | None
    correct: bool | None  # against the numpy reference; None: not checked
    error: str | None  # compile error, crash or timeout
    predicted_s: float | None = None  # the cost model's prediction when it was chosen
    round: int | None = None
    run_id: int | None = None
    created_at: float = 0.0
    machine_fp: str = ""  # the measuring machine's fingerprint
    target: str = HOST  # the target the program was compiled for (backend.Target.spec)
    # "transient" or "deterministic" when there is an error (runner.Measurement.error_kind);
    # `add` classifies the error's text (`error_kind`) when it is None.
    error_kind: str | None = None
    # The settings that decided the outcome ({name: value} of MEASUREMENT_SETTINGS for explore's
    # measurements): part of the lookup key.
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The machine while it was timed (runner.Measurement): other processes' CPU use in cores'
    # worth, and the 1-minute load average; None when not timed or not known.
    others_cores: float | None = None
    load: float | None = None


def workload_key(workload: str, size: Sequence[int]) -> str:
    """The name of one problem, as stored: `workload_key("matmul", [512, 256, 64])` is
    "matmul/512x256x64"."""
    if not workload or "/" in workload:
        raise ValueError(f"workload name {workload!r} must be non-empty and contain no '/'")
    try:
        dims = [operator.index(d) for d in size]
    except TypeError:
        raise ValueError(f"size {size!r} of {workload} must be a sequence of integers") from None
    if any(d <= 0 for d in dims):
        raise ValueError(f"size {list(dims)} of {workload} must be positive")
    return f"{workload}/{'x'.join(map(str, dims))}"


def _split_key(key: str) -> tuple[str, list[int]]:
    workload, dims = key.rsplit("/", 1)
    return workload, [int(d) for d in dims.split("x")] if dims else []


# How runner.measure and trials word a failure that may not recur: a timeout, a dead worker, no
# memory, an interrupt; and the exceptions a job raises for such a reason.
_TRANSIENT_TEXT = ("timed out", "worker process died", "out of memory", "Cannot allocate memory",
                   "interrupted")
_TRANSIENT_EXCEPTIONS = ("MemoryError", "OSError", "TimeoutError", "KeyboardInterrupt")
# An exception the worker caught from one job (compiling, checking or running that program), as
# runner._serve words it: "BackendError: ... (at lower.py:120)".
_RAISED_BY_THE_JOB = re.compile(r"(\w+): .* \(at [\w.]+:\d+\)\Z", re.S)
_DETERMINISTIC_TEXT = ("wrong result", "no replayable trace")


def error_kind(error: str | None, declared: str | None = None) -> str | None:
    """The kind of a measurement's `error`: None without one, `declared` when the measurer said
    (one of ERROR_KINDS), else read from the text. A wrong result, a candidate without a trace and
    an exception the job itself raised are deterministic; a timeout, a dead worker, no memory and
    an interrupt transient, and so is anything not clearly deterministic: measuring it again costs
    a measurement, trusting it forever may cost the best program."""
    if error is None:
        return None
    if declared is not None:
        if declared not in ERROR_KINDS:
            raise ValueError(f"error kind {declared!r} is not one of {', '.join(ERROR_KINDS)}")
        return declared
    if error.startswith(_DETERMINISTIC_TEXT):  # trials' own words, whatever the message says
        return "deterministic"
    if any(marker in error for marker in _TRANSIENT_TEXT):
        return "transient"
    raised = _RAISED_BY_THE_JOB.match(error)
    if raised and raised.group(1) not in _TRANSIENT_EXCEPTIONS:
        return "deterministic"
    return "transient"


# How eqsched before schema version 3 measured the naive program (for the speedup), whatever the
# run's settings: one timed run, no warmup, no time budget.
_OLD_NAIVE_SETTINGS = {"min_repeats": 1, "repeats": 1, "time_budget_s": None, "warmup": 0}


def _old_measurement_settings(config: str | None, structure: str) -> str:
    """The settings of a measurement stored before version 3: its run's, from the config the run
    recorded; {} (matching no lookup: measured again) when the run recorded too little."""
    try:
        recorded = json.loads(config) if config else None
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict) or not set(MEASUREMENT_SETTINGS) <= set(recorded):
        return "{}"
    settings = {name: recorded[name] for name in MEASUREMENT_SETTINGS}
    if structure == "naive":
        settings.update(_OLD_NAIVE_SETTINGS)
    return json.dumps(settings, sort_keys=True)


def process_identity(pid: int) -> str | None:
    """What tells process `pid` from a later one given the same pid: this boot's id and the
    process's start time (Linux /proc); None when it does not exist, is a zombie, or there is no
    /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count after its last ')'.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in "ZX":  # dead, not yet reaped by its parent
        return None
    return f"{boot}/{fields[19]}"  # field 22, starttime


def _process_gone(pid: int | None, host: str | None, identity: str | None) -> bool:
    """Whether the process that recorded (pid, host, identity) has certainly ended. A run of
    another host, or of a database from before runs recorded their process, cannot be told."""
    if pid is None or host != socket.gethostname():
        return False
    if identity is not None:
        return process_identity(pid) != identity
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # someone else's process: alive
        return False
    return False


def machine_fingerprint() -> str:
    """A short hash of what makes timings comparable: the CPU model, LLVM's name and features for
    it, and the core count (cheap: no peak measurement)."""
    facts = machine.facts()
    identity = {k: facts[k] for k in ("cpu_model", "llvm_cpu_name", "llvm_cpu_features", "cores")}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


def _json(value: Any, what: str) -> str:
    # Sorted keys make equal content equal text, which is how imported runs are matched.
    try:
        return json.dumps(value, sort_keys=True, default=_numpy_scalar)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} is not JSON-able ({e})") from None


def _numpy_scalar(value: Any) -> Any:
    # A numeric search's tile sizes are often numpy integers; they are stored as plain numbers.
    if hasattr(value, "item") and not hasattr(value, "__len__"):
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r} is not JSON-able")


def _run_settings(config: dict | None) -> dict | None:
    """A run's measurement settings but its memory cap; runs stored before targets were compiled
    for the host."""
    if not isinstance(config, dict):
        return config
    return {"target": HOST, **{k: v for k, v in config.items() if k != "max_memory"}}


def _optional(convert, value):
    return None if value is None else convert(value)


class Database:
    """An eqsched results database (SQLite, WAL mode: several processes may write at once)."""

    def __init__(self, path: str | os.PathLike, *, readonly: bool = False,
                 machine_fp: str | None = None) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.machine_fp = machine_fp or machine_fingerprint()
        self._lock = threading.RLock()
        self._check_file()
        self._conn = self._connect()
        try:
            self._check_integrity()
            self._check_schema()
            if not readonly:
                self._conn.execute("PRAGMA journal_mode = WAL")
                self._conn.execute(_DERIVED_SCHEMA)
                self._conn.execute(_MODEL_RUNS_SCHEMA)
                self._check_writable()
        except (sqlite3.Error, UnicodeDecodeError) as e:
            self._conn.close()
            raise DatabaseError(f"{self.path}: cannot open it ({e})") from None
        except DatabaseError:
            self._conn.close()
            raise

    # ---- opening ---------------------------------------------------------------------------

    def _check_file(self) -> None:
        if self.path.is_dir():
            raise DatabaseError(f"{self.path} is a directory, not a database file")
        if not self.path.exists():
            if self.readonly:
                raise DatabaseError(f"{self.path} does not exist")
            if not self.path.parent.is_dir():
                raise DatabaseError(f"cannot create {self.path}: {self.path.parent} is not a "
                                    f"directory")
            if not os.access(self.path.parent, os.W_OK | os.X_OK):
                raise DatabaseError(f"cannot create {self.path}: {self.path.parent} is not "
                                    f"writable")
            return
        try:
            with open(self.path, "rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
        except OSError as e:
            raise DatabaseError(f"cannot read {self.path} ({e.strerror})") from None
        # An empty file (a fresh temporary file, say) becomes a new database.
        if head and head != _SQLITE_MAGIC:
            raise DatabaseError(f"{self.path} is not an eqsched database (file is not a SQLite "
                                f"database)")

    def _connect(self) -> sqlite3.Connection:
        target, uri = str(self.path), False
        if self.readonly:
            target, uri = self.path.resolve().as_uri() + "?mode=ro", True
        try:
            # Transactions are explicit (isolation_level=None); the lock makes one connection
            # safe for the measuring threads of one process.
            conn = sqlite3.connect(target, uri=uri, timeout=_BUSY_TIMEOUT_S,
                                   isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise DatabaseError(f"cannot open {self.path} ({e})") from None
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA foreign_keys = ON")
        # What migrating an old database computes (and a read-only one's views).
        conn.create_function("eqsched_error_kind", 1, error_kind, deterministic=True)
        conn.create_function("eqsched_old_settings", 2, _old_measurement_settings,
                             deterministic=True)
        return conn

    def _check_writable(self) -> None:
        """Commit a write now, so that a read-only file or directory, or a full disk, is found
        when the database is opened, not after an exploration's saturation."""
        try:
            with self._transaction():
                self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES "
                                   "('last_opened_for_writing', ?)", (repr(time.time()),))
        except sqlite3.Error as e:
            raise DatabaseError(f"{self.path}: cannot write to it ({e})") from None

    def _check_integrity(self) -> None:
        damaged = f"{self.path} is corrupt or truncated"
        # A damaged page can put arbitrary bytes into quick_check's own report.
        self._conn.text_factory = lambda raw: raw.decode(errors="replace")
        try:
            problems = [row[0] for row in self._conn.execute("PRAGMA quick_check")]
            page_size = self._conn.execute("PRAGMA page_size").fetchone()[0]
        except sqlite3.OperationalError as e:
            # Not the file's fault: it cannot be read or its companions (-wal, -shm) written
            # (a full disk, a file size limit, a read-only directory).
            where = self.path.resolve().parent
            hint = "" if os.access(where, os.W_OK) else (
                f"; {where} is not writable, and SQLite writes a WAL database's -shm file "
                f"beside it even to read")
            if not hint and shutil.disk_usage(where).free < _ROOM_NEEDED:
                hint = f"; the file system of {where} is full"
            raise DatabaseError(f"{self.path}: cannot open it ({e}{hint})") from None
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
            # A damaged schema can put arbitrary bytes into SQLite's error message too.
            raise DatabaseError(f"{damaged} ({e})") from None
        finally:
            self._conn.text_factory = str
        if problems != ["ok"]:
            report = problems[0].removeprefix("*** in database main ***").strip()
            raise DatabaseError(f"{damaged} ({' '.join(report.split())})")
        # SQLite reads a missing tail of the last page as zeros, which quick_check may accept.
        size = self.path.stat().st_size if self.path.exists() else 0
        if size % page_size:
            raise DatabaseError(f"{damaged} ({size} bytes is not a whole number of "
                                f"{page_size}-byte pages)")

    def _tables(self) -> list[str]:
        query = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        return [row[0] for row in self._conn.execute(query)]

    def _check_schema(self) -> None:
        tables = self._tables()
        if not tables and not self.readonly:
            with self._transaction():
                # Another process may have created the schema while this one waited for the lock.
                if not self._tables():
                    for statement in _SCHEMA:
                        self._conn.execute(statement)
                    self._conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                                           [("app", _APP), ("schema_version", SCHEMA_VERSION)])
            tables = self._tables()
        if not tables:
            raise DatabaseError(f"{self.path} is not an eqsched database (an empty SQLite "
                                f"database)")
        try:
            meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.Error:
            meta = {}
        if meta.get("app") != _APP:
            raise DatabaseError(f"{self.path} is not an eqsched database (a SQLite database with "
                                f"tables {', '.join(tables)})")
        version = str(meta.get("schema_version"))
        if not version.isdigit() or int(version) < 1:
            raise DatabaseError(f"{self.path} has an invalid schema version {version!r}")
        if int(version) > SCHEMA_VERSION:
            raise DatabaseError(f"{self.path} was written by a newer eqsched (schema version "
                                f"{version}; this eqsched reads version {SCHEMA_VERSION})")
        missing = sorted(set(_TABLES) - set(tables))
        if missing:
            raise DatabaseError(f"{self.path} is damaged: table {', '.join(missing)} is missing")
        if int(version) < SCHEMA_VERSION:
            self._migrate(int(version))
        for table, columns in (("runs", _RUN_COLUMNS), ("measurements", _MEASUREMENT_COLUMNS)):
            present = {row[1] for row in self._conn.execute(f"PRAGMA table_info({table})")}
            lacking = [c for c in ("id", *columns) if c not in present]
            if lacking:
                raise DatabaseError(f"{self.path} is damaged: table {table} lacks column "
                                    f"{', '.join(lacking)}")

    def _migrate(self, version: int) -> None:
        """Bring a database of an older schema `version` to this one. Version 2 added the target
        (version 1's measurements were compiled for the host; the target joins the record's
        identity); version 3 the error's kind, the measurement's settings (also in the
        identity), the machine's load while it was timed, and the run's process; version 4
        the stored measurements a run's learned model started from (not known before)."""
        added = {"measurements": [], "runs": []}  # (column, its value in an old row)
        if version < 2:
            added["measurements"].append(("target TEXT NOT NULL DEFAULT 'host'", f"'{HOST}'"))
        if version < 3:
            added["measurements"] += [
                ("error_kind TEXT", "eqsched_error_kind(error)"),
                ("settings TEXT NOT NULL DEFAULT '{}'",
                 "eqsched_old_settings((SELECT config FROM main.runs WHERE main.runs.id = "
                 "run_id), structure)"),
                ("others_cores REAL", "NULL"), ("load REAL", "NULL")]
            added["runs"] += [("pid INTEGER", "NULL"), ("host TEXT", "NULL"),
                              ("process TEXT", "NULL")]
        if version < 4:
            added["runs"].append(("learned_from TEXT NOT NULL DEFAULT 'null'", "'null'"))
        if self.readonly:
            # Temporary views shadow the tables for this connection only; the file is not
            # touched.
            for table, columns in added.items():
                if columns:
                    values = ", ".join(f"{value} AS {column.split()[0]}"
                                       for column, value in columns)
                    self._conn.execute(f"CREATE TEMP VIEW {table} AS SELECT *, {values} "
                                       f"FROM main.{table}")
            return
        with self._transaction():
            # Another process may have migrated it while this one waited for the lock.
            stored = self._conn.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
            if str(stored) != str(version):
                return
            for table, columns in added.items():
                for column, value in columns:
                    name = column.split()[0]
                    self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
                    self._conn.execute(f"UPDATE {table} SET {name} = {value}")
            self._conn.execute("DROP INDEX IF EXISTS measurements_once")
            self._conn.execute(_UNIQUE_MEASUREMENT)
            self._conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                               (str(SCHEMA_VERSION),))

    # ---- plumbing --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _sql(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._conn
            except (sqlite3.Error, UnicodeDecodeError) as e:
                raise DatabaseError(f"{self.path}: {what} failed ({e})") from None

    @contextlib.contextmanager
    def _transaction(self, mode: str = "IMMEDIATE") -> Iterator[None]:
        # IMMEDIATE takes the write lock up front, so a concurrent writer waits at BEGIN (where
        # the busy timeout applies) rather than failing halfway through; DEFERRED is a consistent
        # snapshot for reading.
        with self._lock:
            self._conn.execute(f"BEGIN {mode}")
            try:
                yield
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _writable(self) -> None:
        if self.readonly:
            raise DatabaseError(f"{self.path} was opened read-only")

    # ---- runs ------------------------------------------------------------------------------

    def start_run(self, *, workload: str, size: Sequence[int], seed: int | None,
                  budget: dict, rules: list[str], cost_model: str, machine: dict,
                  versions: dict, config: dict | None = None,
                  learned_from: dict | None = None) -> int:
        """Record the start of an exploration run by this process; returns its id for
        `Record.run_id`. `learned_from`: the stored measurements its learned model starts
        from (`training_set`), None for a model that learns from none."""
        pid = os.getpid()
        run = {"workload": workload, "size": list(size), "seed": seed, "budget": budget,
               "rules": rules, "cost_model": cost_model, "machine": machine,
               "versions": versions, "config": config, "started_at": time.time(),
               "finished_at": None, "status": "running", "summary": {}, "pid": pid,
               "host": socket.gethostname(), "process": process_identity(pid),
               "learned_from": learned_from}
        self._writable()
        with self._sql("start_run") as conn:
            return self._insert_run(conn, run)

    def _insert_run(self, conn: sqlite3.Connection, run: dict) -> int:
        row = self._run_row(run)
        cursor = conn.execute(f"INSERT INTO runs ({', '.join(_RUN_COLUMNS)}) "
                              f"VALUES ({', '.join('?' * len(_RUN_COLUMNS))})", row)
        return cursor.lastrowid

    @staticmethod
    def _run_row(run: dict) -> list:
        values = {**run, "key": workload_key(run["workload"], run["size"]),
                  "size": [operator.index(d) for d in run["size"]],
                  "seed": _optional(operator.index, run["seed"])}
        return [_json(values[c], f"run {c}") if c in _RUN_JSON else values[c]
                for c in _RUN_COLUMNS]

    def finish_run(self, run_id: int, *, status: str, summary: dict) -> None:
        """Mark a run finished: status is "done", "interrupted" or "failed"."""
        self._finish("runs", "run", run_id, status, summary)

    def _finish(self, table: str, what: str, run_id: int, status: str, summary: dict) -> None:
        """Set a row of `table` (runs or model_runs) finished with its status and summary."""
        if status not in RUN_STATUSES:
            raise ValueError(f"run status {status!r} is not one of {', '.join(RUN_STATUSES)}")
        self._writable()
        with self._sql(f"finish_{what.replace(' ', '_')}") as conn:
            cursor = conn.execute(
                f"UPDATE {table} SET status = ?, summary = ?, finished_at = ? WHERE id = ?",
                (status, _json(summary, f"{what} summary"), time.time(), run_id))
        if cursor.rowcount == 0:
            raise DatabaseError(f"{self.path} has no {what} {run_id}")

    def runs(self, workload: str | None = None, size: Sequence[int] | None = None) -> list[dict]:
        """Runs (oldest first) as dicts: id, workload, size, seed, budget, rules, cost_model,
        machine, versions, config, started_at, finished_at, status, summary, the pid, host
        and process identity of the process that ran it, and learned_from (`start_run`). A
        `running` run whose process is gone has the status ABANDONED."""
        where, params = self._where_workload(workload, size)
        with self._sql("reading runs") as conn:
            rows = conn.execute(f"SELECT * FROM runs {where} ORDER BY id", params).fetchall()
        runs = self._decode(rows, self._run_dict)
        for run in runs:
            if run["status"] == "running" and _process_gone(run["pid"], run["host"],
                                                            run["process"]):
                run["status"] = ABANDONED
        return runs

    def runs_like(self, workload: str, size: Sequence[int], *, seed: int | None, budget: dict,
                  rules: list[str], cost_model: str, config: dict | None) -> list[dict]:
        """The runs (oldest first, any status) of `workload` at `size` with exactly these
        settings, as `start_run` was given them: a batch skips a job one of them finished, and
        a run of the same settings again takes its learned model's start from them. The memory
        cap (`config`'s max_memory) does not tell two runs apart: it only decides whether a
        too-large candidate fails, transiently."""
        wanted = _run_settings(config)
        return [run for run in self.runs(workload, size)
                if run["seed"] == seed and run["cost_model"] == cost_model
                and run["budget"] == budget and run["rules"] == rules
                and _run_settings(run["config"]) == wanted]

    @staticmethod
    def _run_dict(row: sqlite3.Row) -> dict:
        out = {"id": row["id"]}
        for column in _RUN_COLUMNS:
            if column != "key":
                out[column] = json.loads(row[column]) if column in _RUN_JSON else row[column]
        return out

    @staticmethod
    def _where_workload(workload: str | None, size: Sequence[int] | None) -> tuple[str, list]:
        if size is not None:
            if workload is None:
                raise ValueError("a size needs a workload name")
            return "WHERE key = ?", [workload_key(workload, size)]
        if workload is not None:
            prefix = workload_key(workload, [])
            return "WHERE substr(key, 1, ?) = ?", [len(prefix), prefix]
        return "", []

    # ---- measurements ----------------------------------------------------------------------

    def add(self, record: Record) -> bool:
        """Store a measurement, committed at once. A program this machine (the record's
        `machine_fp`) already measured for the workload, the record's target and its settings
        is kept as it was (returns False), unless that measurement is a transient failure and
        this record is not: then this one replaces it."""
        self._writable()
        with self._sql("add") as conn, self._transaction():
            return self._insert_record(conn, record)

    def _insert_record(self, conn: sqlite3.Connection, record: Record) -> bool:
        """Insert `record` (in the caller's transaction) unless its program is stored for the
        same machine, target and settings; a stored transient failure gives way to a record
        that is not one (importing a file twice adds nothing the second time)."""
        record.size = [operator.index(d) for d in record.size]
        record.created_at = record.created_at or time.time()
        record.machine_fp = record.machine_fp or self.machine_fp
        record.error_kind = error_kind(record.error, record.error_kind)
        identity = [workload_key(record.workload, record.size), record.program_hash,
                    record.machine_fp, record.target,
                    _json(record.settings, f"record {record.program_hash}: settings")]
        transient = ("FROM measurements WHERE key = ? AND program_hash = ? AND machine_fp = ? "
                     "AND target = ? AND settings = ? AND error_kind = 'transient'")
        if record.error_kind != "transient":
            conn.execute(f"DELETE FROM derived WHERE measurement_id IN (SELECT id {transient})",
                         identity)
            conn.execute(f"DELETE {transient}", identity)
        values = {**dataclasses.asdict(record),
                  "key": workload_key(record.workload, record.size),
                  "correct": _optional(bool, record.correct),
                  "round": _optional(operator.index, record.round),
                  **{name: _optional(float, getattr(record, name))
                     for name in ("median_s", "gflops", "predicted_s", "others_cores", "load")}}
        row = [_json(values[c], f"record {record.program_hash}: {c}")
               if c in _MEASUREMENT_JSON else values[c] for c in _MEASUREMENT_COLUMNS]
        try:
            cursor = conn.execute(
                f"INSERT OR IGNORE INTO measurements ({', '.join(_MEASUREMENT_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(_MEASUREMENT_COLUMNS))})", row)
        except sqlite3.IntegrityError as e:
            if "FOREIGN KEY" not in str(e):
                raise
            raise DatabaseError(f"{self.path} has no run {record.run_id} (record "
                                f"{record.program_hash})") from None
        return cursor.rowcount == 1

    def lookup(self, workload: str, size: Sequence[int], program_hash: str,
               target: str = HOST, settings: dict[str, Any] | None = None) -> Record | None:
        """This machine's measurement of a program compiled for `target` and measured with
        `settings` (`Record.settings`, {} when None), if there is one that is not a transient
        failure (that one is for measuring again)."""
        found = self._select(
            "WHERE key = ? AND program_hash = ? AND machine_fp = ? AND target = ? AND "
            "settings = ? AND error_kind IS NOT 'transient'",
            [workload_key(workload, size), program_hash, self.machine_fp, target,
             _json(settings or {}, "lookup settings")])
        return found[0] if found else None

    def best(self, workload: str, size: Sequence[int], target: str = HOST) -> Record | None:
        """The fastest correct measurement on this machine for `target`."""
        found = self._select("WHERE key = ? AND machine_fp = ? AND target = ? AND correct = 1 "
                             "AND error IS NULL AND median_s IS NOT NULL "
                             "ORDER BY median_s, id LIMIT 1",
                             [workload_key(workload, size), self.machine_fp, target])
        return found[0] if found else None

    def records(self, workload: str | None = None, size: Sequence[int] | None = None, *,
                run_id: int | None = None, target: str | None = HOST,
                all_machines: bool = False) -> list[Record]:
        """Measurements in insertion order, of this machine unless `all_machines`, for `target`
        (every target when None)."""
        where, params = self._where_workload(workload, size)
        clauses = [where.removeprefix("WHERE ")] if where else []
        if run_id is not None:
            clauses.append("run_id = ?")
            params.append(run_id)
        if target is not None:
            clauses.append("target = ?")
            params.append(target)
        if not all_machines:
            clauses.append("machine_fp = ?")
            params.append(self.machine_fp)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return self._select(f"{where} ORDER BY id", params)

    def _select(self, clause: str, params: list) -> list[Record]:
        with self._sql("reading measurements") as conn:
            rows = conn.execute(f"SELECT * FROM measurements {clause}", params).fetchall()
        return self._decode(rows, self._record)

    def _decode(self, rows: list[sqlite3.Row], convert: Callable[[sqlite3.Row], Any]) -> list:
        # quick_check checks the b-trees, not the JSON inside a text column.
        try:
            return [convert(row) for row in rows]
        except ValueError as e:
            raise DatabaseError(f"{self.path} is damaged: a stored value does not decode "
                                f"({e})") from None

    @staticmethod
    def _record(row: sqlite3.Row) -> Record:
        workload, size = _split_key(row["key"])
        values = {c: json.loads(row[c]) if c in _MEASUREMENT_JSON else row[c]
                  for c in _MEASUREMENT_COLUMNS if c != "key"}
        values["correct"] = _optional(bool, values["correct"])
        return Record(workload=workload, size=size, **values)

    # ---- derived values --------------------------------------------------------------------

    def derived(self, key: str, ids: Sequence[int]) -> dict[int, list[float]]:
        """The values stored under `key` for the measurements `ids` (those that have them)."""
        if "derived" not in self._tables():
            return {}
        out: dict[int, list[float]] = {}
        with self._sql("reading derived values") as conn:
            for start in range(0, len(ids), 500):  # SQLite limits the parameters of a query
                chunk = [operator.index(i) for i in ids[start:start + 500]]
                rows = conn.execute(
                    f"SELECT measurement_id, value FROM derived WHERE key = ? AND measurement_id "
                    f"IN ({', '.join('?' * len(chunk))})", [key, *chunk]).fetchall()
                out.update((row[0], json.loads(row[1])) for row in rows)
        return out

    def store_derived(self, key: str, values: dict[int, list[float]]) -> None:
        """Keep `values` (measurement id -> numbers) under `key`, replacing what was there."""
        self._writable()
        rows = [(operator.index(i), key, _json([float(v) for v in vs], "derived value"))
                for i, vs in values.items()]
        with self._sql("store_derived"), self._transaction():
            self._conn.executemany("INSERT OR REPLACE INTO derived (measurement_id, key, value) "
                                   "VALUES (?, ?, ?)", rows)

    # ---- model runs ------------------------------------------------------------------------

    def start_model_run(self, *, model: str, fingerprint: str, settings: dict, machine: dict,
                        versions: dict) -> int:
        """Record the start of a model's tuning by this process (`tools.tune_model`); returns
        its id for `finish_model_run`."""
        self._writable()
        pid = os.getpid()
        row = {"model": model, "fingerprint": fingerprint,
               "settings": _json(settings, "model run settings"),
               "machine": _json(machine, "model run machine"),
               "versions": _json(versions, "model run versions"), "machine_fp": self.machine_fp,
               "started_at": time.time(), "status": "running", "summary": "{}", "pid": pid,
               "host": socket.gethostname(), "process": process_identity(pid)}
        with self._sql("start_model_run") as conn:
            cursor = conn.execute(f"INSERT INTO model_runs ({', '.join(row)}) "
                                  f"VALUES ({', '.join('?' * len(row))})", list(row.values()))
        return cursor.lastrowid

    def finish_model_run(self, run_id: int, *, status: str, summary: dict) -> None:
        """Mark a model run finished ("done", "interrupted" or "failed") with its summary."""
        self._finish("model_runs", "model run", run_id, status, summary)

    def model_runs(self, model: str | None = None) -> list[dict]:
        """Model runs (oldest first, of every machine: `machine_fp` says whose) as dicts: id,
        model, fingerprint, settings, machine, versions, machine_fp, started_at, finished_at,
        status, summary, pid, host, process; a `running` one whose process is gone is ABANDONED,
        as in `runs`. None in a database older than the table."""
        if "model_runs" not in self._tables():
            return []
        where, params = ("WHERE model = ?", [model]) if model is not None else ("", [])
        with self._sql("reading model runs") as conn:
            rows = conn.execute(f"SELECT * FROM model_runs {where} ORDER BY id",
                                params).fetchall()
        runs = self._decode(rows, lambda row: {
            k: json.loads(row[k]) if k in _MODEL_RUN_JSON else row[k] for k in row.keys()})
        for run in runs:
            if run["status"] == "running" and _process_gone(run["pid"], run["host"],
                                                            run["process"]):
                run["status"] = ABANDONED
        return runs

    # ---- JSON lines ------------------------------------------------------------------------

    def export_jsonl(self, path: str | os.PathLike, run_ids: Collection[int] | None = None
                     ) -> int:
        """Write every run and measurement (all machines) as JSON lines, or only the runs in
        `run_ids` and their measurements; returns the line count. A file that cannot be written
        is a DatabaseError."""
        # One snapshot, so that no exported measurement refers to a run started after the runs
        # were read.
        with self._sql("export"), self._transaction("DEFERRED"):
            runs = self.runs()
            records = self.records(target=None, all_machines=True)
        if run_ids is not None:
            runs = [run for run in runs if run["id"] in run_ids]
            records = [record for record in records if record.run_id in run_ids]
        try:
            with open(path, "w") as f:
                for run in runs:
                    f.write(json.dumps({"type": "run", **run}, sort_keys=True) + "\n")
                for record in records:
                    f.write(json.dumps({"type": "measurement", **dataclasses.asdict(record)},
                                       sort_keys=True) + "\n")
        except OSError as e:  # a full disk, a missing or read-only directory
            raise DatabaseError(f"cannot write {path} ({e.strerror})") from None
        return len(runs) + len(records)

    def import_jsonl(self, path: str | os.PathLike) -> int:
        """Add the runs and measurements of an `export_jsonl` file, all or nothing; returns the
        number of measurements added (ones already here are skipped). A run equal in content to
        one already here is reused; the file's measurements are re-linked to the runs' ids."""
        self._writable()
        runs, records = _read_jsonl(Path(path))
        with self._sql("import"), self._transaction():
            run_ids = {old: self._find_run(run) or self._insert_run(self._conn, run)
                       for old, run in runs.items()}
            added = 0
            for record in records:
                record.run_id = _optional(run_ids.__getitem__, record.run_id)
                added += self._insert_record(self._conn, record)
        return added

    def copy_to(self, path: str | os.PathLike) -> None:
        """A consistent copy of this whole database at `path` (SQLite's online backup: writers
        elsewhere may go on)."""
        with self._sql("copying"):
            target = sqlite3.connect(str(path))
            try:
                self._conn.backup(target)
            finally:
                target.close()

    def _find_run(self, run: dict) -> int | None:
        match = " AND ".join(f"{c} IS ?" for c in _RUN_COLUMNS)
        row = self._conn.execute(f"SELECT id FROM runs WHERE {match} ORDER BY id LIMIT 1",
                                 self._run_row(run)).fetchone()
        return row[0] if row else None

    # ---- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_NUMBER = (int, float)
_RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (int,), "workload": (str,), "size": (list,), "seed": (int, type(None)),
    "budget": (dict,), "rules": (list,), "cost_model": (str,), "machine": (dict,),
    "versions": (dict,), "config": (dict, type(None)), "started_at": _NUMBER,
    "finished_at": (*_NUMBER, type(None)), "status": (str,), "summary": (dict,),
    "pid": (int, type(None)), "host": (str, type(None)), "process": (str, type(None)),
    "learned_from": (dict, type(None)),
}
_RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "workload": (str,), "size": (list,), "program_hash": (str,), "structure": (str,),
    "sizes": (dict,), "trace": (list,), "times": (list,), "median_s": (*_NUMBER, type(None)),
    "gflops": (*_NUMBER, type(None)), "correct": (bool, type(None)), "error": (str, type(None)),
    "predicted_s": (*_NUMBER, type(None)), "round": (int, type(None)),
    "run_id": (int, type(None)), "created_at": _NUMBER, "machine_fp": (str,), "target": (str,),
    "error_kind": (str, type(None)), "settings": (dict,),
    "others_cores": (*_NUMBER, type(None)), "load": (*_NUMBER, type(None)),
}


def _read_jsonl(path: Path) -> tuple[dict[int, dict], list[Record]]:
    """Parse and check a whole file before anything is written."""
    runs: dict[int, dict] = {}
    records: list[tuple[int, Record]] = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DatabaseError(f"cannot read {path} ({e})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatabaseError(f"{path} line {number}: not JSON ({e.msg})") from None
        kind = obj.pop("type", None) if isinstance(obj, dict) else None
        if kind == "run":
            # exported before runs recorded their process and their model's training set
            for name in ("pid", "host", "process", "learned_from"):
                obj.setdefault(name, None)
            _check_fields(obj, _RUN_FIELDS, path, number)
            if obj["id"] in runs:
                raise DatabaseError(f"{path} line {number}: run {obj['id']} appears twice")
            runs[obj.pop("id")] = obj
        elif kind == "measurement":
            obj.setdefault("target", HOST)  # exported before targets: measured for the host
            obj.setdefault("error_kind", None)  # exported before kinds: classified on import
            obj.setdefault("settings", {})  # exported before settings: matched by no lookup
            for name in ("others_cores", "load"):  # exported before timings recorded the load
                obj.setdefault(name, None)
            _check_fields(obj, _RECORD_FIELDS, path, number)
            if obj["error_kind"] not in (None, *ERROR_KINDS):
                raise DatabaseError(f"{path} line {number}: measurement field error_kind is "
                                    f"{obj['error_kind']!r}, expected one of "
                                    f"{', '.join(ERROR_KINDS)} or null")
            if not obj["machine_fp"]:
                raise DatabaseError(f"{path} line {number}: measurement has no machine_fp")
            records.append((number, Record(**obj)))
        else:
            raise DatabaseError(f"{path} line {number}: expected an object with \"type\" "
                                f"\"run\" or \"measurement\"")
    for number, record in records:
        if record.run_id is not None and record.run_id not in runs:
            raise DatabaseError(f"{path} line {number}: measurement refers to run "
                                f"{record.run_id}, which the file does not contain")
    return runs, [record for _, record in records]


def _check_fields(obj: dict, fields: dict[str, tuple[type, ...]], path: Path,
                  number: int) -> None:
    kind = "run" if fields is _RUN_FIELDS else "measurement"
    where = f"{path} line {number}: {kind}"
    missing = sorted(set(fields) - set(obj))
    unknown = sorted(set(obj) - set(fields))
    if missing or unknown:
        problem = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}"
        raise DatabaseError(f"{where} fields: {problem}")
    for name, types in fields.items():
        # bool is an int to isinstance; a true/false where a number belongs is a malformed line.
        value = obj[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise DatabaseError(f"{where} field {name} is {type(value).__name__}, expected "
                                f"{' or '.join(t.__name__ for t in types)}")
    try:
        workload_key(obj["workload"], obj["size"])
    except ValueError as e:
        raise DatabaseError(f"{where}: {e}") from None


@dataclass(frozen=True)
class TrainingRow:
    """One correct measurement, as a cost model learns from it: `trace` replayed on the naive
    program of `workload` at `size` gives the measured program."""

    id: int  # the measurement's row id (the key of its derived values)
    workload: str
    size: tuple[int, ...]
    program_hash: str  # as stored: trials.measurement_key, "/threads=N" for parallel programs
    trace: list[dict]
    median_s: float

    @property
    def key(self) -> str:
        return workload_key(self.workload, self.size)


def training_rows(db: Database, machine_key: str | None = None, *, threads: int | None = None,
                  workloads: Sequence[str] | None = None, target: str = HOST,
                  until: int | None = None) -> list[TrainingRow]:
    """Every correct timed measurement of one machine and target, of every run and workload,
    oldest first. `machine_key`: a `machine_fingerprint` (CPU model, LLVM's CPU name and
    features, cores; default: the database's machine) and `target` (a `Target.spec`), so timings
    of two machines or two targets never mix. `threads`: leave out parallel programs timed with
    another thread count (a program without parallel loops runs the same on any). `workloads`:
    only these. `until`: only measurements with this row id or a lower one (stored earlier)."""
    clauses = ["machine_fp = ?", "target = ?", "correct = 1", "error IS NULL", "median_s > 0"]
    params: list[Any] = [machine_key or db.machine_fp, target]
    if until is not None:
        clauses.append("id <= ?")
        params.append(until)
    with db._sql("reading training rows") as conn:
        found = conn.execute(f"SELECT id, key, program_hash, trace, median_s FROM measurements "
                             f"WHERE {' AND '.join(clauses)} ORDER BY id", params).fetchall()
    wanted = None if workloads is None else set(workloads)
    rows = []
    for row in found:
        workload, size = _split_key(row["key"])
        if wanted is not None and workload not in wanted:
            continue
        timed_with = _threads_of(row["program_hash"])
        if threads is not None and timed_with is not None and timed_with != threads:
            continue
        trace = db._decode([row], lambda r: json.loads(r["trace"]))[0]
        rows.append(TrainingRow(row["id"], workload, tuple(size), row["program_hash"], trace,
                                float(row["median_s"])))
    return rows


def training_set(rows: Sequence[TrainingRow], machine_key: str) -> dict:
    """What `rows` (of `training_rows`) are, to find them again: the machine, the highest row id
    (`training_rows`' `until`), how many, and a digest of which. Row ids are those of the
    database read; in a copy of it (a batch task's) they are the same, and the rows another
    database imported are other rows: the count and digest tell."""
    digest = hashlib.sha256("\n".join(sorted(f"{r.key} {r.program_hash}" for r in rows))
                            .encode()).hexdigest()[:16]
    return {"machine": machine_key, "until": max((r.id for r in rows), default=0),
            "count": len(rows), "digest": digest}


def _threads_of(program_hash: str) -> int | None:
    """The thread count in a stored program hash (`trials.measurement_key`), None without."""
    _, sep, count = program_hash.partition("/threads=")
    return int(count) if sep and count.isdigit() else None


__all__ = ["ABANDONED", "Database", "DatabaseError", "ERROR_KINDS", "MEASUREMENT_SETTINGS",
           "Record", "RUN_STATUSES", "SCHEMA_VERSION", "TrainingRow", "error_kind",
           "machine_fingerprint", "process_identity", "training_rows", "training_set",
           "workload_key"]
