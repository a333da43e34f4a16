"""The report: an HTML page whose every figure is a real PNG, from a database of explorations,
and a page per model tuned by tune-model."""

import shutil
import sqlite3
import subprocess
import sys
import warnings

import pytest
from conftest import small_search

from eqsched.db import Database
from eqsched.explore import Settings, explore

pytest.importorskip("matplotlib")

from eqsched.tools.report import (  # noqa: E402
    Exploration,
    ReportError,
    latency_curve,
    plot_predictions,
    plot_progress,
    plot_standing,
    write_report,
)

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "r.db"
    with pytest.MonkeyPatch.context() as monkeypatch:
        small_search(monkeypatch)  # the report reads explorations; any search makes them
        for model in ("analytic", "random"):
            explore("matmul", (16, 16, 16), trials=4, batch=2, db=path, cost_model=model,
                    settings=Settings(repeats=2, warmup=0, threads=1, contended_cores=None))
    return path


@pytest.fixture(scope="module")
def page(db, tmp_path_factory):
    """The whole report of `db` (space counts and numpy included): its folder and Report."""
    out = tmp_path_factory.mktemp("page")
    return out, write_report(db, out, numpy=True, space=True)


def test_the_page_shows_every_exploration_and_figure(page):
    out, report = page
    page = (out / "index.html").read_text()
    pngs = [f for f in report.files if f.suffix == ".png"]
    assert {f.name for f in pngs} == {"progress_matmul_16x16x16.png",
                                      "predicted_matmul_16x16x16.png", "space.png",
                                      "standing.png"}
    for f in pngs:
        data = f.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
        assert f'src="{f.name}"' in page
    assert [r["configuration"].split(",")[0] for r in report.rows] == ["analytic", "random"]
    assert all(r["trials"] == 4 and r["measured"] == 4 and r["best_gflops"] > 0
               for r in report.rows)
    assert all(r["x_numpy"] > 0 for r in report.rows)  # numpy timed on this machine
    assert page.count("<tr>") == 1 + 2


def test_space_counts_are_cached_beside_the_page(page, db, tmp_path):
    counts = (page[0] / "space_counts.json").read_text()
    assert '"without tile"' in counts and '"all rules"' in counts
    report = write_report(db, tmp_path, numpy=False, space=False)
    assert "space.png" not in {f.name for f in report.files}
    assert all(r["x_numpy"] is None for r in report.rows)


def test_a_models_task_is_reported_without_numpy_or_space_pages(tmp_path, monkeypatch):
    # A task is a computation made at run time (no registered workload): nothing rebuilds its
    # space or has a numpy version of it; its progress and predictions are shown.
    from eqsched.task_tuning import Task, tune_tasks
    from eqsched.workloads import get_workload

    small_search(monkeypatch)
    task = Task("dense", get_workload("matmul").build(8, 16, 16))
    tune_tasks([task], 4, slice_trials=2, db=tmp_path / "t.db", cost_model="random",
               rules=["tile", "vectorize"], settings=Settings(repeats=2, warmup=0, threads=1,
                                                                contended_cores=None, finalists=0))
    report = write_report(tmp_path / "t.db", tmp_path / "page", numpy=True, space=True)
    assert sorted(f.stem.split("_")[0] for f in report.files if f.suffix == ".png") == [
        "predicted", "progress", "standing"]
    assert [(r["trials"], r["x_numpy"]) for r in report.rows] == [(4, None)]


def test_an_empty_or_foreign_database_is_one_line(tmp_path):
    Database(tmp_path / "empty.db").close()
    with pytest.raises(ReportError, match="holds no explorations or model runs to report"):
        write_report(tmp_path / "empty.db", tmp_path / "out")
    (tmp_path / "junk.db").write_text("not a database")
    done = subprocess.run([sys.executable, "-m", "eqsched", "report", "--db", "junk.db"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "eqsched: error: junk.db is not an eqsched database (file is not a SQLite database)"]


def test_building_the_report_writes_nothing_to_stderr(db, tmp_path):
    done = subprocess.run([sys.executable, "-m", "eqsched", "report", "--db", str(db), "--out",
                           str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no matplotlib warning (empty legend, layout) on the way


def test_figures_of_an_exploration_with_nothing_measured_warn_nothing(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    empty = Exploration("matmul", [16, 16, 16], "analytic, seed 0, 4 trials, default rules",
                        [{"summary": {}}], [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        files = [plot_progress(plt, empty.key, [empty], tmp_path / "progress.png"),
                 plot_predictions(plt, empty.key, [empty], tmp_path / "predicted.png"),
                 plot_standing(plt, [empty], {}, tmp_path / "standing.png")]
    assert all(f.read_bytes().startswith(PNG) for f in files)


def test_a_report_that_could_not_be_written_is_refused_before_it_is_built(db, tmp_path):
    """Its page cannot be written (here a directory holds its name): refused in one line
    before numpy is timed or a space counted, not by a traceback at the end."""
    (tmp_path / "out" / "index.html").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "eqsched", "report", "--db", str(db), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"eqsched: error: cannot write the report to {tmp_path / 'out' / 'index.html'}: it is "
        f"a directory"]
    assert list((tmp_path / "out").iterdir()) == [tmp_path / "out" / "index.html"]


@pytest.fixture(scope="module")
def model_db(tmp_path_factory):
    """A tiny MLP tuned for one slice (its first task tuned, its second left at its default
    schedule), recorded as a model run beside its tasks' explorations."""
    from eqsched.model import get_model
    from eqsched.tools.tune_model import tune_model

    path = tmp_path_factory.mktemp("model") / "m.db"
    model = get_model("mlp", batch=2, inputs=16, hidden=8, outputs=4)
    result = tune_model(model, 8, db=path, threads=1, population=16)
    assert result.correct, result.check
    return path


def test_a_model_gets_a_page_linked_from_the_index_with_each_task_before_and_after(
        model_db, tmp_path):
    report = write_report(model_db, tmp_path, numpy=False, space=False)
    (model,) = report.models
    assert (model["model"], model["runs"], model["status"], model["tasks"]) == ("mlp", 1,
                                                                                "done", 2)
    index = (tmp_path / "index.html").read_text()
    assert f'<a href="{model["page"]}">mlp</a>' in index
    page = (tmp_path / model["page"]).read_text()
    assert '<a href="index.html">' in page
    for task, kernel in (("matmul_add_relu", "database"), ("matmul_add", "default")):
        row = page.split(f"<tr><td>{task}</td>")[1].split("</tr>")[0]
        assert f"<td>{kernel}</td>" in row and row.count(" µs</td>") == 4  # before and after
    assert "<th>total</th>" in page and "end to end" in page
    pngs = [f for f in report.files if f.suffix == ".png"
            and f.name.startswith(model["page"].removesuffix(".html"))]
    assert sorted(f.name.rsplit("_", 1)[1] for f in pngs) == ["latency.png", "tasks.png"]
    for f in pngs:
        assert f.read_bytes().startswith(PNG) and f'src="{f.name}"' in page


def test_the_latency_curve_starts_at_the_default_schedules_and_follows_the_objective():
    run = {"summary": {
        "tasks": [{"weight": 1, "default_kernel_s": 4.0}, {"weight": 3, "default_kernel_s": 1.0}],
        "curve": [{"trials": 16, "best_s": [2.0, None]}, {"trials": 32, "best_s": [2.0, 0.5]}]}}
    # A task not yet tuned counts at its default schedule's time.
    assert latency_curve(run) == ([0, 16, 32], [4.0 + 3.0, 2.0 + 3.0, 2.0 + 1.5])
    assert latency_curve({"summary": {}}) == ([], [])


def test_model_runs_alone_make_a_report_and_two_graphs_of_one_name_two_pages(model_db,
                                                                             tmp_path):
    with Database(model_db, readonly=True) as db:
        (tuned,) = db.model_runs()
    with Database(tmp_path / "models.db") as db:
        for fingerprint in ("aaaa", "bbbb"):
            run = db.start_model_run(model="mlp", fingerprint=fingerprint,
                                     settings=tuned["settings"], machine=tuned["machine"],
                                     versions=tuned["versions"])
            db.finish_model_run(run, status="done", summary=tuned["summary"])
        # A run killed before it recorded anything: its page says so.
        db.start_model_run(model="mlp", fingerprint="aaaa", settings=tuned["settings"],
                           machine=tuned["machine"], versions=tuned["versions"])
    done = subprocess.run([sys.executable, "-m", "eqsched", "report", "--db", "models.db",
                           "--out", "out"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.strip().endswith("and 2 model pages")
    index = (tmp_path / "out" / "index.html").read_text()
    assert "Explorations" not in index and index.count('<a href="model_mlp_') == 2
    page = (tmp_path / "out" / "model_mlp_aaaa.html").read_text()
    assert page.count("<h3>") == 2 and "Nothing recorded" in page


def test_an_older_database_without_model_runs_still_reports(db, tmp_path):
    old = tmp_path / "old.db"
    shutil.copy(db, old)
    with sqlite3.connect(old) as conn:  # as written by an eqsched before model runs
        conn.execute("DROP TABLE IF EXISTS model_runs")
    conn.close()
    report = write_report(old, tmp_path / "out", numpy=False, space=False)
    assert report.models == [] and len(report.rows) == 2
    assert "Models" not in (tmp_path / "out" / "index.html").read_text()
