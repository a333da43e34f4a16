"""The bad-input table: inputs eqsched must refuse, each run through the real command line.

    PYTHONPATH=$PWD python bench/bad_input.py                 # every case: a markdown table
    PYTHONPATH=$PWD python bench/bad_input.py trace suite     # the cases whose name starts so

Each case runs `python -m eqsched ...` in a temporary directory of its own, holding the files
the case needs (a trace, a suite, a database that is not one). A few cases need a file system
in a particular state: a read-only database file or directory (a read-only mount as root,
else file modes) and a full file system (a 1 MiB tmpfs, root only; skipped otherwise).

Each row: the case, the command, its exit status and the first line of its stderr (the error
line, when progress lines came first). Every case must end in one line `eqsched: error: ...`
naming the problem, exit status 2 (the command line's usage error), within seconds: bad input
is refused before any saturation, exploration or measurement. The last line counts tracebacks,
"internal error" lines and exit status 0 on bad input, then the cases whose status was not 2 or
whose line lacked what names the problem; the script exits 1 if any count is not 0.
tests/test_bad_input.py runs a few cases of each kind through `run_case` in the suite.

See docs/ARCHITECTURE.md §14 Layering.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASE_TIMEOUT_S = 60.0  # a refused input takes about a second; one that runs may take many
USAGE_ERROR = 2

Setup = Callable[[Path, contextlib.ExitStack], None]


@dataclass(frozen=True)
class Case:
    """One bad input: `argv` after `eqsched`, run where `files` (name -> text) and `setup`
    have been made; `names` is what the error line must contain."""

    name: str
    argv: tuple[str, ...]
    names: str
    files: tuple[tuple[str, str], ...] = ()
    setup: Setup | None = None
    needs_root: bool = False  # a file system state only a mount makes (a full one)


@dataclass
class Row:
    case: Case
    status: int | str  # the exit status, "timeout" or "skipped (...)"
    line: str  # the error line: the first `eqsched: error` line of stderr, else its first line
    traceback: bool
    internal: bool
    seconds: float = 0.0  # the command's wall time

    @property
    def ran(self) -> bool:
        return isinstance(self.status, int)

    @property
    def as_expected(self) -> bool:
        return not self.ran or (self.status == USAGE_ERROR and self.case.names in self.line
                                and not self.traceback and not self.internal)


# ---- the file system states ---------------------------------------------------------------------


def _is_root() -> bool:
    return os.geteuid() == 0


def _mount_tmpfs(where: Path, stack: contextlib.ExitStack, size: str = "1m") -> None:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                   check=True, capture_output=True)
    stack.callback(subprocess.run, ["umount", "-l", str(where)], capture_output=True)


def _eqsched_database(path: Path) -> None:
    from eqsched.db import Database

    Database(path).close()


def _read_only_dir(name: str, database: str | None = None) -> Setup:
    """A directory `name` that cannot be written (holding an eqsched database `database`)."""

    def setup(work: Path, stack: contextlib.ExitStack) -> None:
        where = work / name
        if _is_root():  # root writes past file modes: a read-only mount stops it
            _mount_tmpfs(where, stack)
        else:
            where.mkdir()
        if database:
            _eqsched_database(where / database)
        if _is_root():
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True,
                           capture_output=True)
        else:
            where.chmod(0o555)
            stack.callback(where.chmod, 0o755)

    return setup


def _read_only_database(name: str) -> Setup:
    """An eqsched database file `name` that cannot be written, in a writable directory."""

    def setup(work: Path, stack: contextlib.ExitStack) -> None:
        path = work / name
        _eqsched_database(path)
        if _is_root():  # a read-only bind mount of the file itself
            subprocess.run(["mount", "--bind", str(path), str(path)], check=True,
                           capture_output=True)
            stack.callback(subprocess.run, ["umount", "-l", str(path)], capture_output=True)
            subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True,
                           capture_output=True)
        else:
            path.chmod(0o444)

    return setup


def _full_file_system(name: str, database: str | None = None) -> Setup:
    """A directory `name` on a file system with no room left (holding an eqsched database
    `database`, made before it filled up)."""

    def setup(work: Path, stack: contextlib.ExitStack) -> None:
        where = work / name
        _mount_tmpfs(where, stack)
        if database:
            _eqsched_database(where / database)
        with contextlib.suppress(OSError), open(where / "filler", "wb") as f:
            while True:
                f.write(bytes(1 << 16))
                f.flush()

    return setup


def _database(name: str) -> Setup:
    def setup(work: Path, stack: contextlib.ExitStack) -> None:
        _eqsched_database(work / name)

    return setup


def _directory(name: str) -> Setup:
    def setup(work: Path, stack: contextlib.ExitStack) -> None:
        (work / name).mkdir()

    return setup


def _foreign_sqlite(name: str) -> Setup:
    def setup(work: Path, stack: contextlib.ExitStack) -> None:
        with contextlib.closing(sqlite3.connect(work / name)) as conn:
            conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, path TEXT)")
            conn.commit()

    return setup


# ---- the cases ----------------------------------------------------------------------------------

SMALL = ("--size", "16,16,16")
EXPLORE = ("explore", "matmul", *SMALL, "--trials", "2", "--batch", "2", "--repeats", "1",
           "--cost-model", "analytic")
RUN = ("run", "matmul", *SMALL, "--repeats", "1", "--warmup", "0", "--no-print")
SPACE = ("space", "matmul", "--size", "8,8,8")
DISTRIBUTION = ("experiment", "distribution", "matmul", "--size", "8,8,8", "--samples", "2",
                "--repeats", "1")
RANKING = ("experiment", "ranking", "matmul", "--size", "8,8,8", "--samples", "4",
           "--repeats", "1")


def _explore(name: str, option: str, value: str, names: str) -> Case:
    return Case(name, (*EXPLORE, f"{option}={value}"), names)


def _trace(name: str, doc: object, names: str, size: bool = True) -> Case:
    """`eqsched run` of the trace `doc` (JSON text when a str, else dumped as JSON)."""
    text = doc if isinstance(doc, str) else json.dumps(doc)
    argv = (*RUN, "--schedule", "t.json") if size else (
        "run", "matmul", "--repeats", "1", "--warmup", "0", "--no-print", "--schedule", "t.json")
    return Case(f"trace: {name}", argv, names, files=(("t.json", text),))


def _step(op: str, **args: object) -> dict:
    return {"version": 1, "workload": "matmul", "size": [16, 16, 16],
            "steps": [{"op": op, "args": args}]}


SUITE_DEFAULTS = ('[defaults]\ntrials = 2\nbatch = 2\nrepeats = 1\nthreads = 1\n'
                  'cost_model = "analytic"\n')
MATMUL_ENTRY = '[[explore]]\nworkload = "matmul"\nsizes = [[16, 16, 16]]\n'


def _suite(name: str, text: str, names: str) -> Case:
    return Case(f"suite: {name}", ("batch", "s.toml", "--db", "x.db"), names,
                files=(("s.toml", text),))


def _suite_key(line: str, names: str) -> Case:
    """A suite whose one exploration also sets `line`."""
    return _suite(line, SUITE_DEFAULTS + MATMUL_ENTRY + line + "\n", names)


def _suite_sizes(line: str, names: str, name: str | None = None) -> Case:
    """A suite whose one exploration of matmul gives its sizes as `line`."""
    return _suite(name or line, SUITE_DEFAULTS + '[[explore]]\nworkload = "matmul"\n' + line
                  + "\n", names)


CASES: list[Case] = [
    # --timeout and --seconds: more than 0, finite
    *(_explore(f"explore --timeout {v}", "--timeout", v, f"got '{v}'")
      for v in ("0", "-1", "nan", "inf", "1e400", "abc")),
    Case("run --timeout 0", (*RUN, "--timeout=0"), "timeout must be more than 0"),
    *(_explore(f"explore --seconds {v}", "--seconds", v, f"got '{v}'")
      for v in ("0", "-1", "nan", "inf", "1e400", "abc")),
    # the other options of explore
    _explore("explore --trials 0", "--trials", "0", "--trials must be >= 1"),
    _explore("explore --trials -3", "--trials", "-3", "--trials must be >= 1"),
    _explore("explore --trials abc", "--trials", "abc", "invalid int value: 'abc'"),
    _explore("explore --batch 0", "--batch", "0", "--batch must be >= 1"),
    _explore("explore --population 1", "--population", "1", "--population must be >= 2"),
    _explore("explore --jobs 0", "--jobs", "0", "--jobs must be >= 1"),
    _explore("explore --repeats 0", "--repeats", "0", "--repeats must be >= 1"),
    _explore("explore --threads 0", "--threads", "0", "--threads must be >= 1"),
    _explore("explore --seed -1", "--seed", "-1", "seed must be from 0"),
    _explore("explore --seed 2**64", "--seed", str(2**64), "seed must be from 0"),
    _explore("explore --seed abc", "--seed", "abc", "seed must be an integer"),
    _explore("explore --max-memory lots", "--max-memory", "lots", "a size like 8G"),
    _explore("explore --max-memory 1K", "--max-memory", "1K", "at least 256 MiB"),
    _explore("explore --max-memory 200%", "--max-memory", "200%", "from 0 to 100"),
    Case("run --max-memory 99999999999999T", (*RUN, "--max-memory", "99999999999999T"),
         "at most 1 EiB"),
    _explore("explore --target z80", "--target", "z80", "bad --target"),
    _explore("explore --target host,+nosuch", "--target", "host,+nosuch", "nosuch"),
    _explore("explore --cost-model best", "--cost-model", "best", "unknown cost model 'best'"),
    _explore("explore --rules -nosuch", "--rules", "-nosuch", "unknown rule 'nosuch'"),
    _explore("explore --rules ,", "--rules", ",", "names no rule"),
    _explore("explore --limits iterations=0", "--limits", "iterations=0", "iterations must be"),
    _explore("explore --limits enodes=-5", "--limits", "enodes=-5", "enodes must be"),
    _explore("explore --limits seconds=nan", "--limits", "seconds=nan", "seconds must be"),
    _explore("explore --limits seconds=-1", "--limits", "seconds=-1", "seconds must be"),
    _explore("explore --limits iterations=2.5", "--limits", "iterations=2.5", "not a number"),
    _explore("explore --limits depth=3", "--limits", "depth=3", "bad --limits item"),
    _explore("explore --limits iterations twice", "--limits", "iterations=3,iterations=4",
             "given twice"),
    _explore("explore --size 16,16", "--size", "16,16", "takes 3 sizes"),
    _explore("explore --size 16,16,0", "--size", "16,16,0", "K must be positive"),
    _explore("explore --size 1e3,16,16", "--size", "1e3,16,16", "bad --size"),
    _explore("explore --size (too big)", "--size", "100000,100000,100000", "over the memory cap"),
    Case("explore of an unknown workload", ("explore", "matmull", "--size", "16,16,16"),
         "unknown workload 'matmull'"),
    # --save-trace, checked before the exploration
    _explore("--save-trace in a missing directory", "--save-trace", "nodir/t.json",
             "cannot write the trace"),
    Case("--save-trace to a directory", (*EXPLORE, "--save-trace", "adir"), "is a directory",
         setup=_directory("adir")),
    _explore("--save-trace ''", "--save-trace", "", "no file name"),
    Case("--save-trace in a read-only directory", (*EXPLORE, "--save-trace", "ro/t.json"),
         "cannot write the trace", setup=_read_only_dir("ro")),
    Case("--save-trace on a full file system", (*EXPLORE, "--save-trace", "full/t.json"),
         "No space left", setup=_full_file_system("full"), needs_root=True),
    # databases
    Case("--db a directory", (*EXPLORE, "--db", "adir"), "is a directory",
         setup=_directory("adir")),
    Case("--db not SQLite", (*EXPLORE, "--db", "bad.db"), "not an eqsched database",
         files=(("bad.db", "not a database\n"),)),
    Case("--db another program's SQLite", (*EXPLORE, "--db", "photos.db"),
         "not an eqsched database", setup=_foreign_sqlite("photos.db")),
    Case("--db in a missing directory", (*EXPLORE, "--db", "nodir/x.db"), "not a directory"),
    Case("--db read-only file", (*EXPLORE, "--db", "ro.db"), "cannot write",
         setup=_read_only_database("ro.db")),
    Case("--db in a read-only directory", (*EXPLORE, "--db", "ro/x.db"), "not writable",
         setup=_read_only_dir("ro", database="x.db")),
    Case("--db new in a read-only directory", (*EXPLORE, "--db", "ro/new.db"), "not writable",
         setup=_read_only_dir("ro")),
    Case("--db on a full file system", (*EXPLORE, "--db", "full/x.db"), "full",
         setup=_full_file_system("full", database="x.db"), needs_root=True),
    Case("--db new on a full file system", (*EXPLORE, "--db", "full/new.db"), "full",
         setup=_full_file_system("full"), needs_root=True),
    Case("runs --db missing", ("runs", "--db", "nosuch.db"), "does not exist"),
    Case("runs --db not SQLite", ("runs", "--db", "bad.db"), "not an eqsched database",
         files=(("bad.db", "not a database\n"),)),
    Case("report --db missing", ("report", "--db", "nosuch.db", "--no-numpy", "--no-space"),
         "does not exist"),
    # eqsched run --schedule: malformed traces
    _trace('"loops": "C.i"', _step("reorder", loops="C.i"), "loops must be a list"),
    _trace('"loops": [1, 2]', _step("reorder", loops=[1, 2]), "loops must be a list"),
    _trace('"loops": [["C.i"], "C.j"]', _step("reorder", loops=[["C.i"], "C.j"]),
           "loops must be a list"),
    _trace('"loop": 3', _step("vectorize", loop=3), "loop must be a name"),
    _trace('"loop": ["C.j"]', _step("vectorize", loop=["C.j"]), "loop must be a name"),
    _trace('"loop": null', _step("unroll", loop=None), "loop must be a name"),
    _trace('"block": ["C.update"]', _step("inline", block=["C.update"]), "block must be"),
    _trace('"at": ["C.i"]', _step("cache_write", block="C.update", at=["C.i"]), "at must be"),
    _trace('"buffer": ["B"]', _step("pack", block="C.update", buffer=["B"], dim=1, factor=4),
           "buffer must be"),
    _trace('"dim": "1"', _step("pack", block="C.update", buffer="B", dim="1", factor=4),
           "dim must be an integer"),
    _trace('"dim": 1.0', _step("pack", block="C.update", buffer="B", dim=1.0, factor=4),
           "dim must be an integer"),
    _trace('"dim": 9', _step("pack", block="C.update", buffer="B", dim=9, factor=4),
           "dim 9 is not a dimension"),
    _trace('"factor": 0', _step("pack", block="C.update", buffer="B", dim=1, factor=0),
           "the factor must be a positive integer"),
    _trace('"factors": 16', _step("split", loop="C.i", factors=16), "factors must be a list"),
    _trace('"factors": "4,4"', _step("split", loop="C.i", factors="4,4"),
           "factors must be a list"),
    _trace('"factors": ["4", "4"]', _step("split", loop="C.i", factors=["4", "4"]),
           "factors must be a list"),
    _trace('"factors": [true, 16]', _step("split", loop="C.i", factors=[True, 16]),
           "factors must be a list"),
    _trace('"factors": [3, 5] (do not divide 16)', _step("split", loop="C.i", factors=[3, 5]),
           "does not divide 16"),
    _trace('"factors": [0, 16]', _step("split", loop="C.i", factors=[0, 16]),
           "factors must be positive"),
    _trace('"factors": [-4, -4]', _step("split", loop="C.i", factors=[-4, -4]),
           "factors must be positive"),
    _trace("unknown loop", _step("split", loop="C.q", factors=[4, 4]), "no loop named 'C.q'"),
    _trace("unknown block", _step("inline", block="Z"), "no block named 'Z'"),
    _trace("unknown op", _step("tile", loop="C.i"), "unknown primitive 'tile'"),
    _trace('"op": ["split"]', {"version": 1, "steps": [{"op": ["split"], "args": {}}]},
           "unknown primitive"),
    _trace("a missing argument", _step("split", loop="C.i"), "args must be exactly"),
    _trace("an extra argument", _step("split", loop="C.i", factors=[4, 4], x=1),
           "args must be exactly"),
    _trace("a step without args", {"version": 1, "steps": [{"op": "split"}]},
           "not an object with exactly 'op' and 'args'"),
    _trace("a step that is a list", {"version": 1, "steps": [["split", "C.i"]]},
           "not an object with exactly 'op' and 'args'"),
    _trace("not JSON", "this is not JSON", "cannot read it as JSON"),
    _trace("an empty file", "", "cannot read it as JSON"),
    _trace("a JSON array", [1, 2, 3], "expected an object"),
    _trace("no steps", {"version": 1}, "expected an object with a list of steps"),
    _trace("steps not a list", {"version": 1, "steps": {"a": 1}}, "a list of steps"),
    _trace("version 2", {"version": 2, "steps": []}, "version 2, expected 1"),
    _trace('"size": "16"', {"version": 1, "size": "16", "steps": []},
           "size must be a list of integers", size=False),
    _trace('"size": 16', {"version": 1, "size": 16, "steps": []},
           "size must be a list of integers", size=False),
    _trace('"size": [16, "a", 16]', {"version": 1, "size": [16, "a", 16], "steps": []},
           "N must be an integer", size=False),
    _trace('"size": [16, 16]', {"version": 1, "size": [16, 16], "steps": []},
           "takes 3 sizes", size=False),
    _trace('"workload": 5', {"version": 1, "workload": 5, "steps": []},
           "workload must be a workload name"),
    _trace("another workload's trace", {"version": 1, "workload": "softmax", "steps": []},
           "is for workload 'softmax'"),
    Case("run --schedule missing", (*RUN, "--schedule", "nosuch.json"), "No such file"),
    Case("run --seed -1", (*RUN, "--seed", "-1"), "seed must be from 0"),
    Case("run --repeats 0", (*RUN, "--repeats", "0"), "--repeats must be >= 1"),
    Case("run --warmup -1", (*RUN, "--warmup", "-1"), "--warmup >= 0"),
    Case("run --size 16,16", ("run", "matmul", "--size", "16,16"), "takes 3 sizes"),
    Case("run of an unknown workload", ("run", "nosuch"), "unknown workload 'nosuch'"),
    Case("run --target z80", (*RUN, "--target", "z80"), "bad --target"),
    # eqsched batch: malformed suites
    _suite("[explore] (a table, not [[explore]])", '[explore]\nworkload = "matmul"\n',
           "explore must be [[explore]] tables"),
    _suite('explore = "matmul"', 'explore = "matmul"\n', "explore must be [[explore]] tables"),
    _suite("explore = [1, 2]", "explore = [1, 2]\n", "explore must be [[explore]] tables"),
    _suite('explore = ["matmul"]', 'explore = ["matmul"]\n',
           "explore must be [[explore]] tables"),
    _suite("defaults = [1]", "defaults = [1]\n" + MATMUL_ENTRY, "defaults must be a table"),
    _suite('defaults = "x"', 'defaults = "x"\n' + MATMUL_ENTRY, "defaults must be a table"),
    _suite("[[defaults]]", "[[defaults]]\ntrials = 2\n" + MATMUL_ENTRY,
           "defaults must be a table"),
    _suite("no [[explore]]", SUITE_DEFAULTS, "no [[explore]] entries"),
    _suite("an empty file", "", "no [[explore]] entries"),
    _suite("not TOML", "this is [not toml", "not valid TOML"),
    _suite("an unknown section", "[other]\nx = 1\n" + MATMUL_ENTRY, "unknown section 'other'"),
    _suite("an unknown key in [defaults]", "[defaults]\nfoo = 1\n" + MATMUL_ENTRY,
           "unknown key 'foo'"),
    _suite_key("foo = 1", "unknown key 'foo'"),
    _suite_key("seed = []", "seed = [] lists no value"),
    _suite_key("trials = []", "trials = [] lists no value"),
    _suite_key("seed = -1", "seed must be from 0"),
    _suite_key("population = 1", "population must be a whole number of at least 2"),
    _suite_key("trials = 0", "trials = 0 must be positive"),
    _suite_key("threads = 0", "threads = 0 must be positive"),
    _suite_key("trials = 2.5", "has the wrong type"),
    _suite_key("trials = true", "has the wrong type"),
    _suite_key("trials = [[2]]", "has the wrong type"),
    _suite_key("seconds = 0", "seconds must be more than 0"),
    _suite_key("seconds = -1.5", "seconds must be more than 0"),
    _suite_key("seconds = nan", "seconds must be more than 0"),
    _suite_key("seconds = inf", "seconds must be more than 0"),
    _suite_key('seconds = "10"', "has the wrong type"),
    _suite_key('rules = "-nosuch"', "unknown rule 'nosuch'"),
    _suite_key('rules = ""', "names no rule"),
    _suite_key('cost_model = "best"', "unknown cost model 'best'"),
    _suite_key('target = "z80"', "z80"),
    _suite_key('max_memory = "lots"', "a size like 8G"),
    _suite_key("size = [16, 16, 16]", "give sizes or size, not both"),
    _suite_sizes('sizes = "16,16,16"', "a size is a list of integers"),
    _suite_sizes("sizes = 16", "a size is a list of integers"),
    _suite_sizes("sizes = []", "sizes = [] lists no size"),
    _suite_sizes("sizes = [[]]", "takes 3 sizes"),
    _suite_sizes('sizes = [["16", "16", "16"]]', "M must be an integer"),
    _suite_sizes('sizes = ["tiny"]', "a size is a list of integers"),
    _suite_sizes("sizes = [[100000, 100000, 100000]]", "over the memory cap",
                 name="a size too big"),
    _suite("an unknown workload", SUITE_DEFAULTS + '[[explore]]\nworkload = "matmull"\n',
           "unknown workload 'matmull'"),
    _suite("no workload", SUITE_DEFAULTS + "[[explore]]\nsizes = [[16, 16, 16]]\n",
           "'workload' must be a workload name"),
    _suite("workload = 3", SUITE_DEFAULTS + "[[explore]]\nworkload = 3\n",
           "'workload' must be a workload name"),
    _suite("an exploration listed twice", SUITE_DEFAULTS + MATMUL_ENTRY + MATMUL_ENTRY,
           "is listed twice"),
    Case("batch of a missing suite", ("batch", "nosuch.toml"), "cannot read suite"),
    Case("batch --jobs 0", ("batch", "s.toml", "--jobs", "0"), "--jobs must be >= 1",
         files=(("s.toml", SUITE_DEFAULTS + MATMUL_ENTRY),)),
    Case("batch --db not SQLite", ("batch", "s.toml", "--db", "bad.db"),
         "not an eqsched database",
         files=(("s.toml", SUITE_DEFAULTS + MATMUL_ENTRY), ("bad.db", "not a database\n"))),
    Case("batch --target z80", ("batch", "s.toml", "--target", "z80"), "z80",
         files=(("s.toml", SUITE_DEFAULTS + MATMUL_ENTRY),)),
    Case("batch --executor foo", ("batch", "s.toml", "--executor", "foo"), "invalid choice",
         files=(("s.toml", SUITE_DEFAULTS + MATMUL_ENTRY),)),
    # space, machine, rules, the experiments
    Case("space --sample -1", (*SPACE, "--sample", "-1"), "--sample must be >= 0"),
    Case("space --seed -3", (*SPACE, "--seed", "-3", "--sample", "1"), "seed must be from 0"),
    Case("space --rules ,", (*SPACE, "--rules", ","), "names no rule"),
    Case("space --limits seconds=inf", (*SPACE, "--limits", "seconds=inf"), "seconds must be"),
    Case("space --dot in a missing directory", (*SPACE, "--dot", "nodir/g.svg"),
         "cannot write the graph"),
    Case("space --dot .", (*SPACE, "--dot", "."), "not a file name"),
    Case("machine --target z80", ("machine", "--target", "z80"), "bad --target"),
    Case("rules check of an unknown rule", ("rules", "check", "nosuch", "--no-measure"),
         "unknown rule 'nosuch'"),
    Case("rules check --programs 0", ("rules", "check", "tile", "--programs", "0"),
         "--programs and --trials must be >= 1"),
    Case("rules list --module (not Python)", ("rules", "list", "--module", "bad.db"),
         "not a Python file", files=(("bad.db", "not python\n"),)),
    Case("rules list --module missing", ("rules", "list", "--module", "nosuch.py"),
         "no rule module"),
    Case("compare --samples 0", ("experiment", "compare", "matmul", "--size", "8,8,8",
                                 "--samples", "0"), "--samples must be >= 1"),
    Case("compare --rules-a ,", ("experiment", "compare", "matmul", "--size", "8,8,8",
                                 "--rules-a", ","), "names no rule"),
    Case("compare --seed -1", ("experiment", "compare", "matmul", "--size", "8,8,8",
                               "--seed", "-1"), "seed must be from 0"),
    Case("distribution --bins 0", (*DISTRIBUTION, "--bins", "0"), "--bins must be >= 1"),
    Case("distribution --plot in a missing directory", (*DISTRIBUTION, "--plot", "nodir/h.png"),
         "cannot write the plot"),
    Case("ranking --folds 1", (*RANKING, "--folds", "1"), "--folds must be >= 2"),
    Case("ranking --plot without --curves", (*RANKING, "--plot", "c.png"), "needs --curves"),
    Case("ranking --models ,", (*RANKING, "--models", ","), "names no cost model"),
    Case("ranking --curves --db missing", (*RANKING, "--curves", "--db", "nosuch.db"),
         "does not exist"),
    Case("ranking --curves --test-share nan", (*RANKING, "--curves", "--db", "x.db",
                                               "--test-share", "nan"), "--test-share must be",
         setup=_database("x.db")),
    Case("ranking --curves --counts a,b", (*RANKING, "--curves", "--db", "x.db", "--counts",
                                           "a,b"), "--counts must be"),
    Case("an unknown command", ("nosuchcmd",), "invalid choice: 'nosuchcmd'"),
    Case("no command", (), "the following arguments are required"),
]


# ---- running them -------------------------------------------------------------------------------


def _first_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("eqsched: error")),
                lines[0] if lines else "")


def run_case(case: Case, timeout_s: float = CASE_TIMEOUT_S) -> Row:
    """Run `case` through `python -m eqsched` in a fresh temporary directory."""
    if case.needs_root and not _is_root():
        return Row(case, "skipped (needs root for a tmpfs mount)", "", False, False)
    with tempfile.TemporaryDirectory(prefix="eqsched-bad-input-") as tmp, \
            contextlib.ExitStack() as stack:
        work = Path(tmp)
        for name, text in case.files:
            (work / name).write_text(text)
        if case.setup:
            try:
                case.setup(work, stack)
            except (OSError, subprocess.CalledProcessError) as e:
                return Row(case, f"skipped (setup failed: {e})", "", False, False)
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [
                   os.environ.get("PYTHONPATH")])])}
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-m", "eqsched", *case.argv], cwd=work,
                                  env=env, capture_output=True, text=True, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
            return Row(case, "timeout", _first_error(stderr), "Traceback" in stderr, False,
                       timeout_s)
        seconds = time.perf_counter() - started
    output = done.stdout + done.stderr
    return Row(case, done.returncode, _first_error(done.stderr),
               "Traceback (most recent call last)" in output, "internal error" in output,
               seconds)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(rows: Sequence[Row]) -> str:
    """The markdown table and the count line."""
    out = ["| case | command | exit status | first line of stderr |", "|---|---|---|---|"]
    for row in rows:
        command = "eqsched " + shlex.join(row.case.argv)
        mark = "" if row.as_expected else " **(!)**"
        out.append(f"| {_cell(row.case.name)} | `{_cell(command)}` | {row.status}{mark} | "
                   f"{_cell(row.line)} |")
    out.append("")
    out.append(summary(rows))
    return "\n".join(out)


def summary(rows: Sequence[Row]) -> str:
    ran = [r for r in rows if r.ran]
    tracebacks = sum(r.traceback for r in rows)
    internal = sum(r.internal for r in rows)
    exit0 = sum(r.status == 0 for r in ran)
    unexpected = sum(not r.as_expected for r in rows)
    timeouts = sum(r.status == "timeout" for r in rows)
    skipped = len(rows) - len(ran) - timeouts
    slowest = max(ran, key=lambda r: r.seconds, default=None)
    return (f"tracebacks: {tracebacks}, internal errors: {internal}, exit 0 on bad input: "
            f"{exit0}; not refused as expected (status other than {USAGE_ERROR}, or a line not "
            f"naming the problem): {unexpected}, timed out: {timeouts}; {len(ran)} cases ran"
            + (f" (the slowest in {slowest.seconds:.1f} s: {slowest.case.name})"
               if slowest else "") + f", {skipped} skipped")


def failed(rows: Sequence[Row]) -> bool:
    return any(r.traceback or r.internal or r.status in (0, "timeout") or not r.as_expected
               for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="run only the cases whose name starts so")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.prefixes
             or any(c.name.startswith(p) for p in args.prefixes)]
    rows = []
    for n, case in enumerate(cases, 1):
        print(f"[{n}/{len(cases)}] {case.name}", file=sys.stderr, flush=True)
        rows.append(run_case(case))
    print(table(rows))
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
