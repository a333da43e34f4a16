"""`eqsched tune-model`: a model's tasks tuned under one budget, then run, checked and timed end
to end; a re-run on the same database measures nothing; bad input is one line."""

import json
import subprocess
import sys

import pytest
from test_cli import ENV, assert_one_line_error

from eqsched.db import Database
from eqsched.model import get_model, save_onnx
from eqsched.tools.tune_model import load_model, tune_model

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
