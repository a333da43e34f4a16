"""`eqsched tune-model`: a model's tasks tuned under one budget, then run, checked and timed end
to end; a re-run on the same database measures nothing; bad input is one line."""

import json
import subprocess
import sys

import numpy as np
import pytest
from test_cli import ENV, assert_one_line_error

from eqsched.db import Database, workload_key
from eqsched.explore import computation_key
from eqsched.model import ModelBuilder, get_model, save_onnx
from eqsched.model.tasks import extract_tasks
from eqsched.tools.tune_model import load_model, model_fingerprint, tune_model

TINY_MLP = {"batch": 2, "inputs": 16, "hidden": 8, "outputs": 4}


def tune_model_cmd(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eqsched", "tune-model", *args],
                          capture_output=True, text=True, env=ENV, timeout=600, cwd=cwd)


def test_a_tuned_model_is_correct_end_to_end_and_a_rerun_measures_nothing(tmp_path):
    model = get_model("mlp", **TINY_MLP)
    db = tmp_path / "m.db"
    first = tune_model(model, 8, db=db, threads=1, population=16)
    assert first.correct, first.check
    assert first.onnxruntime.startswith("correct against onnxruntime")
    assert first.trials == 8 and first.measured > 0
    assert [t["name"] for t in first.tasks] == ["matmul_add_relu", "matmul_add"]
    assert any(t["kernel"] == "database" for t in first.tasks)
    assert first.latency_s > 0 and first.default_latency_s > 0
    with Database(db) as d:
        stored = len(d.records())
    again = tune_model(model, 8, db=db, threads=1, population=16)
    assert again.measured == 0 and again.correct
    with Database(db) as d:
        assert len(d.records()) == stored
        runs = d.model_runs()
    assert [r["id"] for r in runs] == [first.run_id, again.run_id]  # a re-run is a run too
    assert [r["status"] for r in runs] == ["done", "done"]


def test_the_model_run_records_the_curve_and_each_task_before_and_after(tmp_path):
    model = get_model("mlp", **TINY_MLP)
    result = tune_model(model, 24, db=tmp_path / "m.db", threads=1, population=16,
                        scheduler="round-robin", seed=3, early_stopping=None)
    with Database(tmp_path / "m.db", readonly=True) as d:
        (run,) = d.model_runs("mlp")
    assert (run["model"], run["fingerprint"]) == ("mlp", model_fingerprint(model))
    assert run["settings"] == {"scheduler": "round-robin", "trials": 24, "seed": 3,
                               "threads": 1, "target": "host", "population": 16,
                               "early_stopping": None, "conv": "direct"}
    assert run["versions"]["python"] and run["machine"]["cores"] >= 1
    summary = run["summary"]
    assert summary["latency_s"] == result.latency_s and summary["correct"] is True
    assert summary["default_latency_s"] == result.default_latency_s
    # A slice of 16 trials each: the first task, then the second with the 8 left.
    curve = summary["curve"]
    assert [(p["trials"], p["task"]) for p in curve] == [(16, "matmul_add_relu"),
                                                        (24, "matmul_add")]
    assert curve[0]["objective_s"] is None and curve[0]["best_s"][1] is None
    assert curve[1]["objective_s"] == pytest.approx(
        sum(t["weight"] * s for t, s in zip(summary["tasks"], curve[1]["best_s"])))
    assert summary["tasks"] == result.tasks
    # Each task under the key its measurements are stored under, its kernel timed alone
    # with its default schedule and again as tuned.
    keys = [workload_key(*computation_key(t.computation)) for t in extract_tasks(model)]
    assert [t["key"] for t in summary["tasks"]] == keys
    assert [t["trials"] for t in summary["tasks"]] == [16, 8]
    for task in summary["tasks"]:
        assert task["kernel"] in ("database", "default") and task["weight"] == 1
        assert task["default_kernel_s"] > 0 and task["tuned_kernel_s"] > 0


def test_an_interrupted_model_run_is_recorded_interrupted(tmp_path, monkeypatch):
    from eqsched.compiled_model import CompiledModel

    model = get_model("mlp", **TINY_MLP)
    db = tmp_path / "m.db"

    def stop_after_the_first_slice(event, data):
        if event == "tasks":
            raise KeyboardInterrupt

    # Ctrl-C while tuning ends the rounds; the model is still compiled, checked and timed.
    cut = tune_model(model, 24, db=db, threads=1, population=16,
                     progress=stop_after_the_first_slice)
    assert cut.interrupted and cut.correct and len(cut.curve) == 1

    def interrupted_check(self, *args, **kwargs):
        raise KeyboardInterrupt

    # Ctrl-C after tuning (here while checking) ends the call; the run keeps what it got to.
    monkeypatch.setattr(CompiledModel, "check", interrupted_check)
    with pytest.raises(KeyboardInterrupt):
        tune_model(model, 16, db=db, threads=1, population=16)
    with Database(db) as d:
        first, second = d.model_runs()
    assert first["status"] == second["status"] == "interrupted"
    assert first["summary"]["interrupted"] is True and len(first["summary"]["curve"]) == 1
    # Before and after are timed side by side once the check passed: neither was reached.
    assert "default_latency_s" not in second["summary"] and "latency_s" not in second["summary"]
    assert [t["trials"] for t in second["summary"]["tasks"]] == [16, 0]


def test_the_command_interrupted_while_tuning_says_how_to_resume(tmp_path, monkeypatch, capsys):
    import eqsched.tools.tune_model as tune_model_module
    from eqsched.cli import main

    def interrupted_after_a_slice(model, trials, **kwargs):
        def progress(event, data):
            kwargs["progress"](event, data)
            if event == "tasks":
                raise KeyboardInterrupt

        return tune_model(model, trials, **{**kwargs, "progress": progress})

    monkeypatch.setattr(tune_model_module, "tune_model", interrupted_after_a_slice)
    size = [arg for name, n in TINY_MLP.items() for arg in ("--param", f"{name}={n}")]
    code = main(["tune-model", "mlp", *size, "--trials", "24", "--threads", "1",
                 "--population", "16", "--db", str(tmp_path / "m.db")])
    out, err = capsys.readouterr()
    assert code == 130 and "after 16 trials" in out
    assert err.splitlines()[-1] == ("eqsched: interrupted; every measurement so far is in the "
                                    "database, run the same command again to resume")


def test_the_fingerprint_tells_two_graphs_of_one_name_apart_but_not_their_weights():
    small, wide = get_model("mlp", **TINY_MLP), get_model("mlp", **{**TINY_MLP, "hidden": 16})
    assert small.name == wide.name and model_fingerprint(small) != model_fingerprint(wide)

    def scaled(matrix: float, scale: float):
        b = ModelBuilder("scaled")
        product = b.matmul(b.input("x", (2, 3)), b.weight("w", np.full((3, 4), matrix)))
        return b.build(b.mul(product, b.weight("s", np.array(scale))))

    # Another matrix changes no kernel; another one-element weight is folded into one.
    assert model_fingerprint(scaled(1.0, 2.0)) == model_fingerprint(scaled(0.5, 2.0))
    assert model_fingerprint(scaled(1.0, 2.0)) != model_fingerprint(scaled(1.0, 3.0))


def test_the_command_tunes_an_onnx_file_and_prints_one_json_object(tmp_path):
    path = tmp_path / "mlp.onnx"
    save_onnx(get_model("mlp", **TINY_MLP), path)
    done = tune_model_cmd(str(path), "--trials", "4", "--population", "16", "--threads", "1",
                          "--db", str(tmp_path / "m.db"), "--json", "--scheduler", "round-robin")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert {"model", "trials", "latency_s", "correct", "tasks"} <= set(out)
    assert out["correct"] is True and out["trials"] == 4 and out["scheduler"] == "round-robin"
    assert out["onnxruntime"].startswith("correct against onnxruntime")
    assert out["run_id"] == 1 and out["curve"][-1]["trials"] == 4
    for task in out["tasks"]:
        assert {"name", "weight", "trials", "best_gflops", "latency_s"} <= set(task)


@pytest.mark.parametrize("args, message", [
    (["nosuch"], "unknown model 'nosuch'"),
    (["mlp", "--param", "batch"], "--param takes NAME=INTEGER"),
    (["mlp", "--param", "depth=3"], "mlp has no parameter 'depth'"),
    (["missing.onnx"], "missing.onnx: no such file"),
    (["mlp", "--scheduler", "fancy"], "unknown task scheduler 'fancy'"),
    (["mlp", "--trials", "0"], "--trials must be >= 1"),
    (["mlp", "--population", "1"], "--population must be >= 2"),
    (["mlp", "--target", "z80"], "target 'z80'"),
    (["mlp", "--early-stopping", "0"], "--early-stopping takes a count of trials >= 1 or 'off'"),
    (["mlp", "--conv", "winograd"], "mlp: no convolution Winograd F(2x2, 3x3) computes"),
])
def test_bad_input_is_one_line_before_anything_is_tuned(tmp_path, args, message):
    done = tune_model_cmd(*args, "--db", str(tmp_path / "m.db"), cwd=tmp_path)
    assert_one_line_error(done, message)
    assert not (tmp_path / "m.db").exists()


def test_an_onnx_file_takes_no_size_parameters(tmp_path):
    path = tmp_path / "mlp.onnx"
    save_onnx(get_model("mlp", **TINY_MLP), path)
    with pytest.raises(ValueError, match="an ONNX file's shapes are its own"):
        load_model(str(path), {"batch": 2})
    assert load_model(str(path)).inputs == get_model("mlp", **TINY_MLP).inputs
