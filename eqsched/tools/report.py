"""An HTML report of a results database, with PNG plots (`pip install 'eqsched[report]'`).

    eqsched report --db runs.db --out report/       # report/index.html and its PNGs
    report = write_report("runs.db", "report/", numpy=True, space=True)
    report.files, report.rows

An exploration is every run with the same workload, size, seed, rules, cost model, budget and
measurement settings (a resumed run continues its exploration). The page has a table of
explorations and four kinds of figure: best GFLOPS against trials; predicted against measured
time per round; the size of each problem's space with each rule left out; and each exploration's
best program against numpy (timed now, one thread) and this machine's peak. The database is
only read; the counts per rule (one saturation per rule) are cached beside the page.
"""

from __future__ import annotations

import html
import json
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..db import Database, DatabaseError, workload_key


class ReportError(ValueError):
    """An empty database, or a report that cannot be written."""


@dataclass
class Exploration:
    workload: str
    size: list[int]
    label: str  # the configuration, as shown
    runs: list[dict]
    records: list = field(default_factory=list)  # measured by this exploration, in order

    @property
    def key(self) -> str:
        return workload_key(self.workload, self.size)

    @property
    def summary(self) -> dict:
        return self.runs[-1]["summary"]


@dataclass
class Report:
    out_dir: Path
    files: list[Path]
    rows: list[dict[str, Any]]


def _configuration(run: dict) -> tuple:
    return (run["workload"], tuple(run["size"]), run["seed"], tuple(run["rules"]),
            run["cost_model"], json.dumps(run["budget"], sort_keys=True),
            json.dumps(run["config"], sort_keys=True))


def _label(run: dict, default_rules: list[str]) -> str:
    rules = "default rules" if sorted(run["rules"]) == sorted(default_rules) else \
        "rules " + ",".join(run["rules"])
    threads = run["config"].get("threads")
    return (f"{run['cost_model']}, seed {run['seed']}, {run['budget'].get('trials')} trials, "
            f"{rules}" + (f", {threads} thread{'s' * (threads != 1)}" if threads else ""))


def explorations(db: Database) -> list[Exploration]:
    from ..rules import default_rules

    defaults = [r.name for r in default_rules()]
    groups: dict[tuple, Exploration] = {}
    for run in db.runs():
        key = _configuration(run)
        if key not in groups:
            groups[key] = Exploration(run["workload"], list(run["size"]),
                                      _label(run, defaults), [])
        groups[key].runs.append(run)
    for exp in groups.values():
        ids = {r["id"] for r in exp.runs}
        exp.records = [r for r in db.records(exp.workload, exp.size, all_machines=True)
                       if r.run_id in ids and r.structure != "naive"]
    return sorted(groups.values(), key=lambda e: (e.workload, e.size, e.label))


# ---- figures ----------------------------------------------------------------------------------


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ReportError("the report needs matplotlib: pip install 'eqsched[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.clf()
    return path


def _by_problem(exps: list[Exploration]) -> dict[str, list[Exploration]]:
    out: dict[str, list[Exploration]] = defaultdict(list)
    for e in exps:
        out[e.key].append(e)
    return out


def _slug(key: str) -> str:
    return key.replace("/", "_")


def plot_progress(plt: Any, key: str, exps: list[Exploration], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for e in exps:
        best, xs, ys = 0.0, [], []
        for n, r in enumerate(e.records, 1):
            if r.correct and r.gflops:
                best = max(best, r.gflops)
            xs.append(n)
            ys.append(best or math.nan)
        ax.step(xs, ys, where="post", label=e.label)
    ax.set(title=f"{key}: best GFLOPS so far", xlabel="trials measured", ylabel="GFLOPS")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_predictions(plt: Any, key: str, exps: list[Exploration], path: Path) -> Path:
    from ..extract.cost import spearman

    fig, axes = plt.subplots(1, len(exps), figsize=(4.2 * len(exps), 3.8), squeeze=False)
    for ax, e in zip(axes[0], exps):
        points = [r for r in e.records if r.correct and r.median_s and r.predicted_s]
        rounds = sorted({r.round for r in points if r.round is not None})
        for rnd in rounds:
            mine = [r for r in points if r.round == rnd]
            rho = spearman([r.predicted_s for r in mine], [r.median_s for r in mine])
            ax.scatter([r.predicted_s * 1e3 for r in mine], [r.median_s * 1e3 for r in mine],
                       s=14, label=f"round {rnd}" + (f" ρ={rho:+.2f}" if rho is not None else ""))
        if points:
            lo = min(min(r.predicted_s, r.median_s) for r in points) * 1e3
            hi = max(max(r.predicted_s, r.median_s) for r in points) * 1e3
            ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
            ax.set(xscale="log", yscale="log")
            for axis in (ax.xaxis, ax.yaxis):  # minor labels of a narrow log range overlap
                axis.set_minor_formatter(plt.NullFormatter())
        ax.set(title=e.label, xlabel="predicted ms", ylabel="measured ms")
        ax.title.set_fontsize(7)
        ax.legend(fontsize=6)
    fig.suptitle(f"{key}: predicted vs measured time per round", fontsize=9)
    return _save(fig, path)


def space_counts(exps: list[Exploration], cache: Path) -> dict[str, dict[str, int]]:
    """For each problem: its default space's program count and the count without each rule
    (cached in `cache`: one saturation per rule)."""
    from ..egraph.space import build_space, rule_contributions
    from ..ir import naive_program
    from ..rules import RULES, default_rules
    from ..workloads import get_workload

    known = json.loads(cache.read_text()) if cache.exists() else {}
    for key, group in _by_problem(exps).items():
        if key in known:
            continue
        naive = naive_program(get_workload(group[0].workload).build(*group[0].size))
        rules = default_rules()
        counts = {"all rules": build_space(naive, rules).count()}
        counts.update({f"without {name}": n for name, n in rule_contributions(naive, rules).items()
                       if RULES[name].growth})  # analysis rules only feed guards
        known[key] = counts
    cache.write_text(json.dumps(known, indent=1))
    return known


def plot_space(plt: Any, counts: dict[str, dict[str, int]], path: Path) -> Path:
    fig, axes = plt.subplots(len(counts), 1, figsize=(7, 2.6 * len(counts)), squeeze=False)
    for ax, (key, per_rule) in zip(axes[:, 0], sorted(counts.items())):
        names = list(per_rule)
        values = [float(max(per_rule[n], 1)) for n in names]  # counts pass 2**63
        ax.barh(names, values, color=["tab:blue"] + ["tab:orange"] * (len(names) - 1))
        ax.set(xscale="log", title=f"{key}: programs in the space", xlabel="programs (log)")
        ax.title.set_fontsize(9)
        ax.tick_params(labelsize=7)
        ax.invert_yaxis()
    return _save(fig, path)


def numpy_gflops(workload: str, size: list[int], repeats: int = 5) -> float | None:
    """numpy's GFLOPS for the workload, one BLAS thread when threadpoolctl can limit it."""
    import contextlib

    from ..reference import random_inputs
    from ..workloads import get_workload

    wl = get_workload(workload)
    if wl.numpy_fn is None:
        return None
    comp = wl.build(*size)
    inputs = random_inputs(comp, seed=0)
    try:
        from threadpoolctl import threadpool_limits
        limit = threadpool_limits(1)
    except ImportError:
        limit = contextlib.nullcontext()
    with limit:
        wl.numpy_fn(inputs, *size)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            wl.numpy_fn(inputs, *size)
            times.append(time.perf_counter() - start)
    return comp.flops / statistics.median(times) / 1e9


def plot_standing(plt: Any, exps: list[Exploration], numpy: dict[str, float | None],
                  path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(exps) + 1.6))
    names = [f"{e.key}\n{e.label}" for e in exps]
    best = [e.summary.get("best_gflops") or 0 for e in exps]
    peak = [e.summary.get("peak_gflops") or 0 for e in exps]
    ref = [numpy.get(e.key) or 0 for e in exps]
    y = range(len(exps))
    ax.barh([i + 0.27 for i in y], peak, height=0.25, color="lightgrey", label="peak (FMA)")
    ax.barh(list(y), best, height=0.25, color="tab:blue", label="eqsched best")
    ax.barh([i - 0.27 for i in y], ref, height=0.25, color="tab:green",
            label="numpy (1 thread)")
    ax.set_yticks(list(y), names, fontsize=6)
    ax.invert_yaxis()
    ax.set(xlabel="GFLOPS", title="best program against numpy and this machine's peak")
    ax.legend(fontsize=7)
    return _save(fig, path)


# ---- the page ---------------------------------------------------------------------------------


def write_report(db_path: str | Path, out_dir: str | Path, numpy: bool = True,
                 space: bool = True) -> Report:
    """Write `out_dir`/index.html and its PNGs from the database at `db_path`."""
    plt = _pyplot()
    from ..db import machine_fingerprint
    from ..machine import facts

    with Database(db_path, readonly=True) as db:
        exps = explorations(db)
    if not exps:
        raise ReportError(f"{db_path} holds no explorations to report")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create {out}: {e.strerror}") from None
    here = machine_fingerprint()
    problems = _by_problem(exps)
    sections: list[tuple[str, str, list[Path]]] = []
    files = [plot_progress(plt, k, g, out / f"progress_{_slug(k)}.png")
             for k, g in problems.items()]
    sections.append(("Best GFLOPS against trials", "Each line is one exploration: the fastest "
                     "correct program it had measured after n trials. A line that flattens early "
                     "has stopped finding better programs.", files))
    files = [plot_predictions(plt, k, g, out / f"predicted_{_slug(k)}.png")
             for k, g in problems.items()]
    sections.append(("Predicted against measured time", "One point per correct candidate, "
                     "coloured by round; ρ is the round's Spearman rank correlation. Points on the "
                     "dashed line were predicted exactly; only their order matters to the search.",
                     files))
    if space:
        counts = space_counts(exps, out / "space_counts.json")
        sections.append(("Space size per rule", "Programs in each problem's space with the "
                         "default rules (blue) and with one rule left out (orange): the rules "
                         "whose removal shrinks the space most contribute most.",
                         [plot_space(plt, counts, out / "space.png")]))
    numpy_at: dict[str, float | None] = {}
    if numpy:
        numpy_at = {k: numpy_gflops(g[0].workload, g[0].size) for k, g in problems.items()
                    if all(r.machine_fp == here for e in g for r in e.records)}
    sections.append(("Against numpy and peak", "Each exploration's best program (blue) beside "
                     "numpy's implementation of the same computation, timed now on one thread "
                     "(green), and the measured FMA peak of the cores the program used (grey).",
                     [plot_standing(plt, exps, numpy_at, out / "standing.png")]))
    rows = [_row(e, numpy_at.get(e.key)) for e in exps]
    page = _html(str(db_path), facts(), rows, sections)
    (out / "index.html").write_text(page)
    written = [out / "index.html"] + [f for _, _, fs in sections for f in fs]
    return Report(out, written, rows)


def _row(e: Exploration, numpy: float | None) -> dict[str, Any]:
    s = e.summary
    best = s.get("best_gflops")
    return {"problem": e.key, "configuration": e.label, "runs": len(e.runs),
            "status": e.runs[-1]["status"], "trials": s.get("trials"),
            "measured": len(e.records), "best_gflops": best,
            "percent_of_peak": s.get("percent_of_peak"),
            "x_numpy": best / numpy if best and numpy else None,
            "x_naive": s.get("speedup_over_naive"),
            "wall_s": sum(r["summary"].get("wall_s") or 0 for r in e.runs)}


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if isinstance(value, float) else html.escape(str(value))


def _html(db_path: str, machine: dict, rows: list[dict], sections: list) -> str:
    head = ("problem", "configuration", "runs", "status", "trials", "measured", "best GFLOPS",
            "% of peak", "× numpy", "× naive", "wall s")
    table = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in r.values()) + "</tr>"
                    for r in rows)
    body = "".join(
        f"<h2>{html.escape(title)}</h2><p>{html.escape(caption)}</p>"
        + "".join(f'<p><img src="{f.name}" alt="{html.escape(f.stem)}"></p>' for f in files)
        for title, caption, files in sections)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>eqsched report: {html.escape(db_path)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:auto}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px}}
img{{max-width:100%}}</style></head><body>
<h1>eqsched report</h1>
<p>Database <code>{html.escape(db_path)}</code>; this machine: {html.escape(str(
        machine.get('cpu_model')))}, {machine.get('cores')} cores, LLVM CPU
{html.escape(str(machine.get('llvm_cpu_name')))}.</p>
<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{table}</table>
{body}
</body></html>
"""


# ---- command line -----------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="an HTML page with plots of a results database")
    p.add_argument("--db", default="eqsched.db", help="results database (default eqsched.db)")
    p.add_argument("--out", default="report", help="directory to write (default report/)")
    p.add_argument("--no-numpy", action="store_true", help="do not time numpy for comparison")
    p.add_argument("--no-space", action="store_true",
                   help="do not count the spaces per rule (one saturation per rule)")
    p.add_argument("--json", action="store_true", help="print the table and files as JSON")
    p.set_defaults(run=_cmd_report)


def _cmd_report(args: Any) -> int:
    from ..args import CliError

    try:
        report = write_report(args.db, args.out, numpy=not args.no_numpy,
                              space=not args.no_space)
    except (ReportError, DatabaseError) as err:
        raise CliError(str(err)) from None
    if args.json:
        print(json.dumps({"files": [str(f) for f in report.files], "rows": report.rows}))
    else:
        print(f"wrote {report.files[0]} and {len(report.files) - 1} plots")
    return 0
