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

Keys: trials, seconds, seed, batch, threads, repeats, rules (a spec like "-pack"), cost_model,
target (like "host,-avx512f"; `--target` sets it for a suite that does not), max_memory (the
measuring worker's memory cap, like "8G" or "50%"; `--max-memory` sets it for a suite that does
not; it does not tell two runs apart). A target LLVM does
not know, or one this machine cannot run, fails the whole suite before any job starts.
Every exploration writes to one SQLite database (it takes concurrent writers). An exploration
whose run already finished in the database is not run again; an interrupted one is re-run and
measures nothing it already stored. Local worker processes run `--jobs` explorations at once;
`--executor ray` hands the same jobs to Ray tasks instead (the database path must be on storage
every Ray node sees).

    suite = Suite.load("suite.toml")
    result = run_batch(suite, "runs.db", jobs=2)
    print(result.table())

See docs/ARCHITECTURE.md §10 Exploration.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import signal
import sys
import time
import tomllib
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..args import MEMORY_HELP, TARGET_HELP, CliError, max_memory_arg, max_memory_bytes
from ..backend.target import HOST

CONFIG_KEYS = {"trials": int, "seconds": (int, float), "seed": int, "batch": int,
               "threads": int, "repeats": int, "rules": str, "cost_model": str, "target": str,
               "max_memory": (int, str)}
DEFAULTS = {"trials": 64, "seconds": None, "seed": 0, "batch": 16, "threads": None,
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
        from ..workloads import get_workload

        base = {**DEFAULTS, **_config({"target": target}, f"{where} (the batch's target)")}
        if max_memory is not None:
            base.update(_config({"max_memory": max_memory}, f"{where} (the batch's max memory)"))
        unknown = set(data) - {"defaults", "explore"}
        if unknown:
            raise BatchError(f"{where}: unknown section {sorted(unknown)[0]!r} (use [defaults] "
                             f"and [[explore]])")
        defaults = _config(data.get("defaults", {}), f"{where} [defaults]")
        entries = data.get("explore", [])
        if not isinstance(entries, list) or not entries:
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
            sizes = entry.pop("sizes", entry.pop("size", "default"))
            sizes = sizes if isinstance(sizes, list) and sizes and isinstance(
                sizes[0], (list, str)) else [sizes]
            resolved = [_size(wl, s, at) for s in sizes]
            overrides = _config(entry, at)
            merged = {**base, **defaults, **overrides}
            lists = {k: v if isinstance(v, list) else [v] for k, v in merged.items()}
            for size in resolved:
                for values in itertools.product(*lists.values()):
                    jobs.append(Job(wl.name, size, tuple(sorted(zip(lists, values)))))
        keys = [j.key for j in jobs]
        dup = next((k for k in keys if keys.count(k) > 1), None)
        if dup:
            raise BatchError(f"{where}: exploration {dup!r} is listed twice")
        return cls(where, jobs)


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
    from ..extract import COST_MODELS
    from ..rules import resolve

    out = {}
    for key, value in table.items():
        if key not in CONFIG_KEYS:
            raise BatchError(f"{at}: unknown key {key!r} (keys: {', '.join(CONFIG_KEYS)})")
        values = value if isinstance(value, list) else [value]
        for v in values:
            kind = CONFIG_KEYS[key]
            if isinstance(v, bool) or not isinstance(v, kind):
                raise BatchError(f"{at}: {key} = {v!r} has the wrong type")
            if kind is int and v < (0 if key == "seed" else 1):
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
    from ..rules import resolve
    from ..trials import Settings

    c = job.settings()
    if not Path(db_path).exists():
        return None
    # The memory cap only decides whether a too-large candidate fails (transiently): a run
    # finished under another cap is this job's.
    settings = asdict(Settings(repeats=c["repeats"], threads=c["threads"], target=c["target"]))
    settings.pop("max_memory")
    budget = {"trials": c["trials"], "seconds": c["seconds"], "batch": c["batch"]}
    rules = [r.name for r in resolve(c["rules"])]
    with Database(db_path, readonly=True) as db:
        for run in db.runs(job.workload, list(job.size)):
            if (run["status"] == "done" and run["seed"] == c["seed"]
                    and run["cost_model"] == c["cost_model"] and run["budget"] == budget
                    and run["rules"] == rules and _config_of(run) == settings):
                return _row(job, "done", run["summary"], measured=0, note="from db")
    return None


def _config_of(run: dict) -> Any:
    """A run's measurement settings but its memory cap; runs stored before targets were compiled
    for the host."""
    config = run["config"]
    if not isinstance(config, dict):
        return config
    return {"target": HOST, **{k: v for k, v in config.items() if k != "max_memory"}}


def run_job(job: Job, db_path: str) -> dict[str, Any]:
    """Explore one job into the database; returns its summary row. Never raises for a failed
    exploration: the error is the row's."""
    from ..explore import explore
    from ..trials import Settings

    done = finished_row(job, db_path)
    if done is not None:
        return done
    c = job.settings()
    try:
        result = explore(job.workload, job.size, trials=c["trials"], seconds=c["seconds"],
                         db=db_path, seed=c["seed"], cost_model=c["cost_model"],
                         rules=c["rules"], batch=c["batch"],
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


# ---- executors --------------------------------------------------------------------------------

_busy = False
_stop: Any = None  # set by the parent on Ctrl-C: queued jobs then do not start


def _worker_init(stop: Any) -> None:
    # An idle pool process ignores Ctrl-C (dying would break the pool); a busy one stops its
    # exploration, which keeps what it measured and marks its run interrupted.
    global _stop
    _stop = stop

    def on_sigint(signum: int, frame: Any) -> None:
        if _busy:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)


def _pool_job(job: Job, db_path: str) -> dict[str, Any]:
    global _busy
    if _stop is not None and _stop.is_set():
        return _row(job, "not run", {}, note="interrupted before it started")
    _busy = True
    try:
        return run_job(job, db_path)
    finally:
        _busy = False


Progress = Callable[[str, dict[str, Any]], None]


def _run_local(jobs: list[Job], db_path: str, workers: int, say: Progress) -> tuple[list, bool]:
    rows: dict[Job, dict[str, Any]] = {}
    interrupted = False
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init,
                             initargs=(stop,)) as pool:
        futures = {}
        for job in jobs:
            futures[pool.submit(_pool_job, job, db_path)] = job
        pending = set(futures)
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    rows[futures[f]] = f.result()
                    say("job", rows[futures[f]])
                    if rows[futures[f]]["status"] == "interrupted":
                        # Ctrl-C reached the job, but this process did not raise
                        # KeyboardInterrupt (seen once in CI): stop all the same.
                        raise KeyboardInterrupt
        except KeyboardInterrupt:
            interrupted = True
            stop.set()
            for f in pending:
                f.cancel()
            for f in pending:  # running explorations stop after their current measurement
                if f.cancelled():
                    continue
                try:
                    rows[futures[f]] = f.result()
                except BaseException as e:
                    rows[futures[f]] = _row(futures[f], "interrupted", {}, note=str(e))
    return [rows.get(j) or _row(j, "not run", {}) for j in jobs], interrupted


def _run_ray(jobs: list[Job], db_path: str, address: str | None, say: Progress
             ) -> tuple[list, bool]:
    try:
        import ray
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
    remote = ray.remote(num_cpus=1)(run_job)
    refs = {remote.remote(job, db_path): job for job in jobs}
    rows: dict[Job, dict[str, Any]] = {}
    interrupted = False
    pending = list(refs)
    try:
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                rows[refs[ref]] = ray.get(ref)
                say("job", rows[refs[ref]])
    except KeyboardInterrupt:
        interrupted = True
        for ref in pending:
            ray.cancel(ref)  # a running task gets KeyboardInterrupt: its run is "interrupted"
        for ref in pending:
            try:
                rows[refs[ref]] = ray.get(ref)
            except BaseException:
                rows[refs[ref]] = _row(refs[ref], "interrupted", {})
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
    """Run every job of `suite` into the database at `db`; see the module docstring."""
    if jobs < 1:
        raise BatchError(f"jobs must be >= 1, got {jobs}")
    if executor not in ("local", "ray"):
        raise BatchError(f"unknown executor {executor!r} (local or ray)")
    db_path = str(Path(db).resolve())
    from ..db import Database

    Database(db_path).close()  # a corrupt or foreign file fails here, before any job starts
    say = progress or (lambda event, data: None)
    started = time.perf_counter()
    if executor == "ray":
        rows, interrupted = _run_ray(suite.jobs, db_path, ray_address, say)
    else:
        rows, interrupted = _run_local(suite.jobs, db_path, jobs, say)
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

    try:
        suite = Suite.load(args.suite, args.target, args.max_memory)
        print(f"eqsched: {len(suite.jobs)} explorations from {args.suite}", file=sys.stderr)

        def show(event: str, row: dict[str, Any]) -> None:
            gf = row["best_gflops"]
            print(f"  {row['status']:>11}: {row['job']}" + (f"  {gf:.1f} GFLOPS" if gf else "")
                  + (f"  ({row['note']})" if row["note"] else ""), file=sys.stderr)

        result = run_batch(suite, args.db, jobs=args.jobs, executor=args.executor,
                           ray_address=args.ray_address or os.environ.get("RAY_ADDRESS"),
                           progress=show)
    except (BatchError, DatabaseError) as err:
        raise CliError(str(err)) from None
    print(json.dumps(result.to_json()) if args.json else result.table())
    if result.interrupted:
        print("eqsched: interrupted; every measurement so far is in the database, run the same "
              "command again to resume", file=sys.stderr)
        return 130
    return 1 if any(r["status"] == "failed" for r in result.rows) else 0
