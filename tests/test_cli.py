"""The `eqsched` command, run as a user would: a subprocess, its stdout, stderr and exit status."""

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import eqsched
from eqsched.backend import Target
from eqsched.ir import naive_program
from eqsched.schedule import Schedule, save_trace
from eqsched.workloads import get_workload

# The subprocess imports the same eqsched as these tests (a checkout or an installed copy).
ENV = {**os.environ,
       "PYTHONPATH": os.pathsep.join([str(Path(eqsched.__file__).resolve().parent.parent),
                                      os.environ.get("PYTHONPATH", "")])}


def eqsched_cmd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eqsched", *args], capture_output=True,
                          text=True, env=ENV, timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess, fragment: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("eqsched: error: "), proc.stderr
    assert fragment in lines[-1]
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def matmul_trace(tmp_path_factory) -> Path:
    sch = Schedule(naive_program(get_workload("matmul").build(32, 32, 16)))
    sch.split("C.j", [2, 16])
    sch.reorder("C.i", "C.j.0", "C.k", "C.j.1")
    sch.vectorize("C.j.1")
    path = tmp_path_factory.mktemp("traces") / "matmul-32.json"
    save_trace(path, sch.trace, workload="matmul", size=[32, 32, 16])
    return path


def test_workloads_lists_names_params_and_default_sizes():
    proc = eqsched_cmd("workloads")
    assert proc.returncode == 0
    assert any(line.split()[:3] == ["matmul", "M,N,K", "512,512,512"]
               for line in proc.stdout.splitlines())


def test_ctrl_c_while_the_command_starts_is_its_interrupt_not_a_traceback():
    # Importing the command line takes a second or more: a Ctrl-C 0.3 s in lands there, where
    # it had been Python's KeyboardInterrupt traceback from inside some import.
    proc = subprocess.Popen([sys.executable, "-m", "eqsched", "workloads", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err.strip()) == (130, "", "eqsched: interrupted")


def test_the_eqsched_command_runs_the_guarded_entry_point():
    scripts = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert scripts["project"]["scripts"] == {"eqsched": "eqsched.__main__:run"}


def test_workloads_json_is_a_list_of_objects():
    rows = json.loads(eqsched_cmd("workloads", "--json").stdout)
    conv = next(r for r in rows if r["name"] == "conv2d_nchw")
    assert conv["default_size"] == [1, 64, 56, 56, 64, 3, 3, 1, 1]
    assert conv["params"][-2:] == ["stride", "pad"]


def test_run_small_matmul_prints_the_program_and_the_figures():
    proc = eqsched_cmd("run", "matmul", "--size", "64,64,64", "--repeats", "3")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "for C.k in range(64):" in out
    assert "correct: True" in out and "GFLOPS" in out and "% of the target's calibrated peak" in out


def test_run_json_prints_exactly_one_object(matmul_trace):
    proc = eqsched_cmd("run", "matmul", "--schedule", str(matmul_trace), "--repeats", "2",
                       "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # fails on any extra output
    assert report["workload"] == "matmul" and report["size"] == [32, 32, 16]  # from the trace
    assert report["correct"] is True and len(report["times"]) == 2
    assert report["median_s"] > 0 and report["gflops"] > 0 and report["peak_gflops"] > 0
    assert 0 < report["percent_of_peak"] == pytest.approx(
        100 * report["gflops"] / report["peak_gflops"])
    assert [s["op"] for s in report["trace"]] == ["split", "reorder", "vectorize"]
    assert "vectorized(16)" in report["program"] and len(report["program_hash"]) == 16
    assert report["machine"]["versions"]["llvm"] and report["backend"]["opt_level"] == 3
    assert "for C.i in range" in proc.stderr  # the program goes to stderr with --json


def test_run_no_print_keeps_only_the_figures():
    proc = eqsched_cmd("run", "softmax", "--size", "4,40", "--repeats", "1", "--no-print")
    assert proc.returncode == 0, proc.stderr
    assert "for " not in proc.stdout and "correct: True" in proc.stdout


def test_unknown_workload_is_a_one_line_error():
    assert_one_line_error(eqsched_cmd("run", "no_such_workload"), "unknown workload")


@pytest.mark.parametrize("size,fragment", [
    ("64,64", "takes 3 sizes"),
    ("64,x,64", "bad --size '64,x,64'"),
    ("64,0,64", "N must be positive"),
])
def test_bad_sizes_are_one_line_errors(size, fragment):
    assert_one_line_error(eqsched_cmd("run", "matmul", "--size", size), fragment)


def test_a_split_that_does_not_divide_is_a_one_line_error(tmp_path):
    path = tmp_path / "bad-split.json"
    path.write_text(json.dumps({"version": 1, "workload": "matmul", "size": [30, 30, 30],
                                "steps": [{"op": "split", "args": {"loop": "C.i",
                                                                   "factors": [7, -1]}}]}))
    assert_one_line_error(eqsched_cmd("run", "matmul", "--schedule", str(path)),
                          "7 does not divide 30")


def test_malformed_and_missing_traces_are_one_line_errors(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    assert_one_line_error(eqsched_cmd("run", "matmul", "--schedule", str(path)), "JSON")
    assert_one_line_error(eqsched_cmd("run", "matmul", "--schedule", str(tmp_path / "none")),
                          "cannot read")


def test_a_trace_for_another_workload_is_refused(matmul_trace):
    assert_one_line_error(eqsched_cmd("run", "softmax", "--schedule", str(matmul_trace)),
                          "is for workload 'matmul'")


def test_usage_mistakes_are_one_line_errors_too():
    assert_one_line_error(eqsched_cmd("run"), "required: workload")
    assert_one_line_error(eqsched_cmd("run", "matmul", "--repeats", "0"), "--repeats")
    assert_one_line_error(eqsched_cmd("run", "matmul", "--threads", "0"), "--threads must be")


def test_run_times_on_the_threads_it_is_given():
    proc = eqsched_cmd("run", "matmul", "--size", "32,32,16", "--repeats", "1", "--json",
                       "--no-print", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["backend"]["threads"] == 1


def test_run_compiles_for_the_target_it_is_given():
    proc = eqsched_cmd("run", "matmul", "--size", "32,32,16", "--repeats", "1", "--json",
                       "--no-print", "--target", "host,-avx512f")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["correct"] is True and report["target"] == "host,-avx512f"
    assert report["backend"]["vector_bits"] == 256 and report["backend"]["cpu_features"]


# Every command that compiles or builds a space takes --target and refuses a bad one in one line
# before it compiles or saturates anything (a database it was given is not even created).
TARGET_COMMANDS = {
    "run": ["run", "matmul", "--size", "8,8,8"],
    "explore": ["explore", "matmul", "--size", "8,8,8", "--db", "{tmp}/x.db"],
    "space": ["space", "matmul", "--size", "8,8,8"],
    "batch": ["batch", "{tmp}/suite.toml", "--db", "{tmp}/x.db"],
    "compare": ["experiment", "compare", "matmul", "--size", "8,8,8"],
    "distribution": ["experiment", "distribution", "matmul", "--size", "8,8,8", "--db",
                     "{tmp}/x.db"],
    "ranking": ["experiment", "ranking", "matmul", "--size", "8,8,8", "--db", "{tmp}/x.db"],
    "rules check": ["rules", "check", "vectorize", "--workloads", "matmul"],
    "machine": ["machine"],
}


@pytest.mark.parametrize("command", sorted(TARGET_COMMANDS))
@pytest.mark.parametrize("target, fragment", [
    ("nosuchcpu", "LLVM knows no x86 CPU of that name"),
    ("host,+nosuch", "'nosuch' is not an x86 feature LLVM knows"),
])
def test_a_bad_target_is_a_one_line_error_before_anything_is_done(tmp_path, command, target,
                                                                  fragment):
    (tmp_path / "suite.toml").write_text('[[explore]]\nworkload = "matmul"\n')
    args = [a.format(tmp=tmp_path) for a in TARGET_COMMANDS[command]]
    assert_one_line_error(eqsched_cmd(*args, "--target", target), fragment)
    assert not (tmp_path / "x.db").exists()


BAD_LIMITS = [
    ("--timeout", "inf", "timeout must be more than 0 and at most 86400 seconds, got 'inf'"),
    ("--timeout", "nan", "timeout must be more than 0"),
    ("--timeout", "0", "timeout must be more than 0"),
    ("--max-memory", "1K", "max memory must be at least 256 MiB"),
    ("--max-memory", "lots", "max memory must be a size like 8G, 512M or 50%, got 'lots'"),
]


@pytest.mark.parametrize("command, option, value, fragment", [
    (command, *bad) for command in ("run", "explore", "batch") for bad in BAD_LIMITS
    if not (command == "batch" and bad[0] == "--timeout")])  # a suite has no timeout
def test_a_bad_timeout_or_memory_cap_is_a_one_line_error_before_anything_is_done(
        tmp_path, command, option, value, fragment):
    (tmp_path / "suite.toml").write_text('[[explore]]\nworkload = "matmul"\n')
    args = [a.format(tmp=tmp_path) for a in TARGET_COMMANDS[command]]
    assert_one_line_error(eqsched_cmd(*args, option, value), fragment)
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("command", ["run", "explore", "batch"])
def test_a_size_too_big_for_the_memory_cap_is_refused_before_anything_is_done(tmp_path,
                                                                               command):
    # 3 x 10^10 floats, in float32 and the reference's float64: about 335 GiB.
    (tmp_path / "suite.toml").write_text(
        '[[explore]]\nworkload = "matmul"\nsizes = [[100000, 100000, 100000]]\n')
    args = [a.format(tmp=tmp_path) for a in TARGET_COMMANDS[command]]
    if command != "batch":
        args[args.index("--size") + 1] = "100000,100000,100000"
    proc = eqsched_cmd(*args, "--max-memory", "8G")
    assert_one_line_error(proc, "matmul at this size needs about 335 GiB of buffers")
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "over the memory cap of 8 GiB (--max-memory)")
    assert not (tmp_path / "x.db").exists()


def test_every_command_that_compiles_takes_a_target(capsys):
    # The help of one process's parser: eight interpreters printing it took 34 s of the suite.
    from eqsched.cli import main

    for command in (["run"], ["explore"], ["space"], ["batch"], ["experiment", "compare"],
                    ["experiment", "distribution"], ["experiment", "ranking"],
                    ["rules", "check"]):
        with pytest.raises(SystemExit) as done:
            main([*command, "--help"])
        assert done.value.code == 0 and "--target" in capsys.readouterr().out, command


def test_runs_lists_every_run_with_its_status(tmp_path):
    from eqsched.db import Database

    path = tmp_path / "x.db"
    with Database(path) as db:
        kwargs = dict(workload="matmul", size=[16, 16, 16], seed=0, budget={}, rules=[],
                      cost_model="random", machine={}, versions={})
        done = db.start_run(**kwargs)
        db.finish_run(done, status="done", summary={"trials": 4, "best_gflops": 1.5})
        db.start_run(**kwargs)  # this process's: running
    proc = eqsched_cmd("runs", "--db", str(path))
    assert proc.returncode == 0, proc.stderr
    head, first, second = proc.stdout.splitlines()
    assert head.split()[:3] == ["run", "problem", "status"]
    assert first.split()[:6] == ["1", "matmul", "16,16,16", "done", "4", "-"]
    assert second.split()[3] == "running" and f"{os.getpid()}@" in second
    listed = json.loads(eqsched_cmd("runs", "--db", str(path), "--json").stdout)
    assert [r["status"] for r in listed] == ["done", "running"]
    assert_one_line_error(eqsched_cmd("runs", "--db", str(tmp_path / "none.db")),
                          "none.db does not exist")


def test_machine_reports_the_calibrated_peak():
    facts = json.loads(eqsched_cmd("machine", "--json").stdout)
    model = facts["machine_model"]
    assert facts["peak_gflops_per_core"] == round(
        model["fma_per_cycle"] * model["vector_lanes"] * 2 * model["hz"] / 1e9, 1)
    assert facts["cores"] >= 1
    assert facts["machine_model"]["target"] == "host"


def test_machine_calibrate_measures_the_target_again_into_the_cache(tmp_path):
    if "avx2" not in Target.host().isa:
        pytest.skip("no AVX2 on this CPU")
    env = {**ENV, "EQSCHED_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "eqsched", "machine", "--calibrate", "--target",
                           "host,-avx512f"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "8 float32 lanes, 16 registers" in proc.stdout and "DRAM" in proc.stdout
    cached = [p.name for p in tmp_path.iterdir()]
    if "unsteady" in proc.stderr:  # a busy machine: used, one line of warning, not cached
        assert proc.stderr.count("\n") == 2 and cached == [], proc.stderr
    else:
        assert [name.startswith("machine-host_-avx512f-") for name in cached] == [True]
    assert_one_line_error(eqsched_cmd("machine", "--target", "host,-nosuchfeature"),
                          "nosuchfeature")


def test_every_package_of_the_checkout_is_installed_by_pyproject():
    """pyproject lists packages by hand (rules/ and extract/ are mapped into eqsched): a new
    subpackage missing from the list would be absent from the installed copy CI tests."""
    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(root).parts)
             for p in (root / "eqsched").rglob("__init__.py")}
    assert found | {"eqsched.rules", "eqsched.extract"} == listed
