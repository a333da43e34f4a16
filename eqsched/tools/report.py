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

Each model tuned by `eqsched tune-model` (a name and graph fingerprint in the database's
`model_runs`) gets a page of its own, linked from the index: every run's latency against trials
on one plot (the scheduler's objective, with the model measured end to end before and after
tuning), and per run a table and a bar plot of time per task before and after.

See docs/ARCHITECTURE.md §12 The database.
"""

from __future__ import annotations

import html
import json
import math
import re
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backend.target import HOST
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
    rows: list[dict[str, Any]]  # one per exploration
    models: list[dict[str, Any]] = field(default_factory=list)  # one per model, its page's row


def _configuration(run: dict) -> tuple:
    return (run["workload"], tuple(run["size"]), run["seed"], tuple(run["rules"]),
            run["cost_model"], json.dumps(run["budget"], sort_keys=True),
            json.dumps({**(run["config"] or {}), "target": target_of(run)}, sort_keys=True))


def _label(run: dict, default_rules: list[str]) -> str:
    rules = "default rules" if sorted(run["rules"]) == sorted(default_rules) else \
        "rules " + ",".join(run["rules"])
    threads = run["config"].get("threads")
    return (f"{run['cost_model']}, seed {run['seed']}, {run['budget'].get('trials')} trials, "
            f"{rules}" + (f", {threads} thread{'s' * (threads != 1)}" if threads else "")
            + f", target {target_of(run)}")


def target_of(run: dict) -> str:
    """The target a run compiled for (runs stored before targets compiled for the host)."""
    return (run["config"] or {}).get("target", HOST)


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
        exp.records = [r for r in db.records(exp.workload, exp.size, target=None,
                                             all_machines=True)
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
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    # Closed, not only cleared: pyplot keeps every open figure, and warns on stderr past 20
    # (a model page adds a figure per run).
    plt.close(fig)
    return path


# Every figure is laid out by matplotlib's constrained layout, so nothing is clipped at its edges.
# What a layout engine cannot do, leave room for long labels without squeezing the plot, is done
# by sizing each figure from its labels' measured widths and wrapping labels after commas.
LABEL_PT = 8  # tick labels, legends, panel titles
TITLE_PT = 10
LINE_IN = 1.4 / 72  # height of a line of text, in inches per point of font size


def _figure(plt: Any, width: float, height: float, rows: int = 1, cols: int = 1,
            **kw: Any) -> tuple:
    return plt.subplots(rows, cols, figsize=(width, height), squeeze=False, layout="constrained",
                        **kw)


def _text_width(texts: list[str], points: float) -> float:
    """Inches taken by the widest line of `texts` set at `points` in matplotlib's font."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    prop, measure = FontProperties(size=points), TextToPath()
    return max((measure.get_text_width_height_descent(line, prop, ismath=False)[0]
                for text in texts for line in text.splitlines()), default=0.0) / 72


def _wrap(text: str, inches: float, points: float) -> str:
    """`text` broken after commas into lines at most `inches` wide, where a comma allows."""
    lines: list[str] = []
    for piece in re.split(r"(?<=,)", text):
        if lines and _text_width([lines[-1] + piece], points) <= inches:
            lines[-1] += piece
        else:
            lines.append(piece.lstrip())
    return "\n".join(lines)


def _lines(texts: list[str]) -> int:
    return sum(t.count("\n") + 1 for t in texts)


def _legend(ax: Any, owner: Any, **kw: Any) -> None:
    """`ax`'s legend, drawn by `owner` (the axes or the figure), only when something is labelled:
    an empty legend draws an empty box and warns on stderr."""
    handles, labels = ax.get_legend_handles_labels()
    if labels:
        owner.legend(handles, labels, fontsize=LABEL_PT, **kw)


def _room_for_labels(lo: float, top: float, label_in: float, axes_in: float, log: bool) -> float:
    """The axis limit beyond `top` that leaves `label_in` inches after a bar ending at `top` on an
    axis of `axes_in` inches starting at `lo`, for the value written after the bar."""
    share = min(0.5, (label_in + 0.1) / max(axes_in, 1.0))
    if log:
        lo_, top_ = math.log10(lo), math.log10(top)
        return 10 ** (top_ + (top_ - lo_) * share / (1 - share))
    return top + (top - lo) * share / (1 - share)


def _time_unit(seconds: list[float]) -> tuple[float, str]:
    """(factor, unit) that shows these times with a few digits before the point."""
    top = max(seconds)
    return (1.0, "s") if top >= 1 else (1e3, "ms") if top >= 1e-3 else (1e6, "µs")


def _log_ticks(axis: Any, lo: float, hi: float) -> None:
    """Plain-number labels on a log axis from `lo` to `hi`, enough of them to read a value off
    a narrow range (1, 2, 5 per decade, or every digit) without crowding a wide one."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    decades = math.log10(hi / lo)
    subs = tuple(range(1, 10)) if decades < 0.6 else (1, 2, 5) if decades < 2.5 else (1,)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _by_problem(exps: list[Exploration]) -> dict[str, list[Exploration]]:
    out: dict[str, list[Exploration]] = defaultdict(list)
    for e in exps:
        out[e.key].append(e)
    return out


def _slug(key: str) -> str:
    return key.replace("/", "_")


def plot_progress(plt: Any, key: str, exps: list[Exploration], path: Path) -> Path:
    from matplotlib.ticker import MaxNLocator

    width, styles = 7.0, ("-", "--", ":", "-.")  # lines that coincide stay visible
    labels = [_wrap(e.label if e.records else f"{e.label} (nothing measured by this exploration)",
                    width - 0.8, LABEL_PT) for e in exps]
    fig, axes = _figure(plt, width, 3.8 + _lines(labels) * LABEL_PT * LINE_IN)
    ax = axes[0, 0]
    for n, (e, label) in enumerate(zip(exps, labels)):
        best, xs, ys = 0.0, [], []
        for trial, r in enumerate(e.records, 1):
            if r.correct and r.gflops:
                best = max(best, r.gflops)
            xs.append(trial)
            ys.append(best or math.nan)
        ax.step(xs, ys, where="post", ls=styles[n % len(styles)], lw=1.6, label=label)
    ax.set_title(f"{key}: best GFLOPS so far", fontsize=TITLE_PT)
    ax.set(xlabel="trials measured", ylabel="GFLOPS")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not any(e.records for e in exps):
        ax.set(xlim=(0, 1), ylim=(0, 1), xticks=[], yticks=[])
    ax.tick_params(labelsize=LABEL_PT)
    ax.grid(alpha=0.3)
    _legend(ax, fig, loc="outside lower center")
    return _save(fig, path)


def plot_predictions(plt: Any, key: str, exps: list[Exploration], path: Path) -> Path:
    from ..extract.cost import spearman

    panels = []  # per exploration: its points and legend labels, by round
    for e in exps:
        points = [r for r in e.records if r.correct and r.median_s and r.predicted_s]
        by_round = []
        for rnd in sorted({r.round for r in points if r.round is not None}):
            mine = [r for r in points if r.round == rnd]
            rho = spearman([r.predicted_s for r in mine], [r.median_s for r in mine])
            by_round.append((mine, f"round {rnd}" + (f" ρ={rho:+.2f}" if rho is not None else "")))
        panels.append((e, points, by_round))
    # Each panel: a near-square plot, its tick labels and axis label, and its legend to the right
    # (off the points); at most three panels a row, the figure at least as wide as its title.
    side, cols = 3.2, min(len(exps), 3)
    rows = -(-len(exps) // cols)
    widths = [side + 0.9 + (_text_width([lb for _, lb in rounds], LABEL_PT) + 0.6 if rounds
                            else 0.0) for _, _, rounds in panels]
    col_widths = [max(widths[c::cols]) for c in range(cols)]
    title = f"{key}: predicted vs measured time per round"
    width = max(sum(col_widths), _text_width([title], TITLE_PT) + 0.4)
    titles = [_wrap(e.label, side, LABEL_PT) for e in exps]
    row_height = side + 1.0 + max(t.count("\n") + 1 for t in titles) * LABEL_PT * LINE_IN
    fig, axes = _figure(plt, width, rows * row_height + 0.3, rows, cols, width_ratios=col_widths)
    for ax in axes.flat[len(exps):]:
        ax.set_axis_off()
    for ax, (e, points, by_round), panel_title in zip(axes.flat, panels, titles):
        ax.set_title(panel_title, fontsize=LABEL_PT)
        if not points:
            ax.text(0.5, 0.5, "no predicted times stored" if e.records else
                    "nothing measured\nby this exploration", ha="center", va="center",
                    transform=ax.transAxes, fontsize=LABEL_PT, color="grey")
            ax.set(xticks=[], yticks=[])
            continue
        times = [t for r in points for t in (r.predicted_s, r.median_s)]
        scale, unit = _time_unit(times)
        for mine, label in by_round:
            ax.scatter([r.predicted_s * scale for r in mine], [r.median_s * scale for r in mine],
                       s=14, label=label)
        # The same limits on both axes of a near-square plot: the diagonal is exact prediction.
        lo, hi = min(times) * scale / 1.25, max(times) * scale * 1.25
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
               xlabel=f"predicted {unit}", ylabel=f"measured {unit}")
        for axis in (ax.xaxis, ax.yaxis):
            _log_ticks(axis, lo, hi)
        ax.tick_params(labelsize=LABEL_PT)
        _legend(ax, ax, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle(title, fontsize=TITLE_PT)
    return _save(fig, path)


def space_counts(exps: list[Exploration], cache: Path) -> dict[str, dict[str, int]]:
    """For each problem of a registered workload: its default space's program count and the
    count without each rule (cached in `cache`: one saturation per rule). A model's task (a
    computation made at run time, explore.computation_key) cannot be rebuilt here."""
    from ..egraph.space import build_space, rule_contributions
    from ..ir import naive_program
    from ..rules import RULES, default_rules
    from ..te import WorkloadError
    from ..workloads import get_workload

    known = json.loads(cache.read_text()) if cache.exists() else {}
    for key, group in _by_problem(exps).items():
        if key in known:
            continue
        try:
            workload = get_workload(group[0].workload)
        except WorkloadError:
            continue
        naive = naive_program(workload.build(*group[0].size))
        rules = default_rules()
        counts = {"all rules": build_space(naive, rules).count()}
        counts.update({f"without {name}": n for name, n in rule_contributions(naive, rules).items()
                       if RULES[name].growth})  # analysis rules only feed guards
        known[key] = counts
    cache.write_text(json.dumps(known, indent=1))
    return known


def plot_space(plt: Any, counts: dict[str, dict[str, int]], path: Path) -> Path:
    problems = sorted(counts.items())
    names = [n for _, per_rule in problems for n in per_rule]
    label_in = _text_width(names, LABEL_PT)
    width = max(7.0, label_in + 5.5)
    value_in = _text_width(["8.8e+88"], LABEL_PT)
    fig, axes = _figure(plt, width, 0.7 * len(problems) + 0.22 * len(names), len(problems), 1)
    for ax, (key, per_rule) in zip(axes[:, 0], problems):
        rules = list(per_rule)
        values = [float(max(per_rule[n], 1)) for n in rules]  # counts pass 2**63
        # Bars start at one program: a bar's length is the count's number of digits.
        bars = ax.barh(rules, [v - 1 for v in values], left=1.0,
                       color=["tab:blue"] + ["tab:orange"] * (len(rules) - 1))
        ax.bar_label(bars, [f"{v:,.0f}" if v < 1e6 else f"{v:.2g}" for v in values], padding=3,
                     fontsize=LABEL_PT - 1)
        ax.set_xscale("log")
        ax.set_xlim(1, _room_for_labels(1, max(values), value_in,
                                        width - label_in - 0.6, log=True))
        ax.set_title(f"{key}: programs in the space", fontsize=TITLE_PT - 1)
        ax.set_xlabel("programs (log scale)", fontsize=LABEL_PT)
        ax.tick_params(labelsize=LABEL_PT)
        ax.invert_yaxis()
    return _save(fig, path)


def numpy_gflops(workload: str, size: list[int], repeats: int = 5) -> float | None:
    """GFLOPS of the workload's numpy baseline (`Workload.numpy_baseline`: buffers allocated
    once, outside the timing), one BLAS thread when threadpoolctl can limit it; None without
    one (a model's task is no registered workload)."""
    import contextlib

    from ..reference import random_inputs
    from ..te import WorkloadError
    from ..workloads import get_workload

    try:
        wl = get_workload(workload)
    except WorkloadError:
        return None
    if wl.numpy_fn is None:
        return None
    comp = wl.build(*size)
    run = wl.numpy_baseline(random_inputs(comp, seed=0), *size)
    try:
        from threadpoolctl import threadpool_limits
        limit = threadpool_limits(1)
    except ImportError:
        limit = contextlib.nullcontext()
    with limit:
        run()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
    return comp.flops / statistics.median(times) / 1e9


def plot_standing(plt: Any, exps: list[Exploration], numpy: dict[str, float | None],
                  path: Path) -> Path:
    labels = [f"{e.key}\n{_wrap(e.label, 3.2, LABEL_PT)}" for e in exps]
    series = [("eqsched best", "tab:blue", "none correct",
               [e.summary.get("best_gflops") for e in exps])]
    if any(numpy.get(e.key) for e in exps):  # else numpy was not timed at all
        series.append(("numpy (1 thread)", "tab:green", "not timed",
                       [numpy.get(e.key) for e in exps]))
    series.append(("peak (FMA)", "lightgrey", "unknown",
                   [e.summary.get("peak_gflops") for e in exps]))
    bar_in = 0.2
    row_in = max(len(series) * bar_in, max(t.count("\n") + 1 for t in labels) * LABEL_PT *
                 LINE_IN) + 0.25
    label_in = _text_width(labels, LABEL_PT)
    width = label_in + 6.0
    fig, axes = _figure(plt, width, len(exps) * row_in + 1.4)
    ax = axes[0, 0]
    values = [v for *_, vs in series for v in vs if v]
    # GFLOPS spanning orders of magnitude (a tiny workload beside the peak) on a log axis, where
    # every bar stays visible; each bar carries its value.
    log = bool(values) and max(values) > 100 * min(values)
    lo = min(values) / 2 if log else 0.0
    bar = bar_in / row_in  # in rows
    for n, (name, color, missing, vs) in enumerate(series):
        y = [i + (n - (len(series) - 1) / 2) * bar for i in range(len(exps))]
        bars = ax.barh(y, [v - lo if v else 0.0 for v in vs], height=bar * 0.9, left=lo,
                       color=color, label=name)
        ax.bar_label(bars, [f"{v:.3g}" if v else missing for v in vs], padding=3,
                     fontsize=LABEL_PT - 1)
    if log:
        ax.set_xscale("log")
    value_in = _text_width(["none correct"], LABEL_PT - 1)
    ax.set_xlim(lo, _room_for_labels(lo, max(values), value_in, width - label_in - 0.8, log)
                if values else 1.0)
    ax.set_yticks(range(len(exps)), labels, fontsize=LABEL_PT)
    ax.set_ylim(len(exps) - 0.5, -0.5)  # first exploration on top
    ax.set_xlabel("GFLOPS (log scale)" if log else "GFLOPS", fontsize=LABEL_PT)
    ax.tick_params(axis="x", labelsize=LABEL_PT)
    fig.suptitle("best program against numpy and this machine's peak", fontsize=TITLE_PT)
    _legend(ax, fig, loc="outside lower center", ncols=len(series), frameon=False)
    return _save(fig, path)


# ---- models ------------------------------------------------------------------------------------


_UNSAFE_IN_FILE_NAMES = re.compile(r"[^\w.-]")


@dataclass
class ModelRuns:
    """Every recorded run of one model (`tools.tune_model`): one name and graph fingerprint, so
    two different models of one name get two pages; oldest run first."""

    model: str
    fingerprint: str
    runs: list[dict]

    @property
    def page(self) -> str:
        """The file name of its page (a model's name may be any ONNX file's)."""
        return _UNSAFE_IN_FILE_NAMES.sub("_", f"model_{self.model}_{self.fingerprint}") + ".html"


def model_runs(db: Database) -> list[ModelRuns]:
    groups: dict[tuple[str, str], ModelRuns] = {}
    for run in db.model_runs():
        key = (run["model"], run["fingerprint"])
        groups.setdefault(key, ModelRuns(*key, [])).runs.append(run)
    return sorted(groups.values(), key=lambda g: (g.model, g.fingerprint))


def _model_run_label(run: dict) -> str:
    s = run["settings"]
    threads = s.get("threads")
    return (f"run {run['id']}: {s.get('scheduler')}, {s.get('trials')} trials, seed "
            f"{s.get('seed')}, {threads} thread{'s' * (threads != 1)}, target {s.get('target')}, "
            f"population {s.get('population')}"
            + ("" if run["status"] == "done" else f" ({run['status']})"))


def latency_curve(run: dict) -> tuple[list[int], list[float]]:
    """The run's tuning curve as (trials, seconds): at 0 trials every task's default schedule,
    then after each slice the scheduler's objective (sum of weight x best latency), a task not
    yet tuned counting at its default schedule's time so the curve is defined from the start.
    Empty when the run recorded no default times (it stopped before timing them)."""
    tasks = run["summary"].get("tasks", [])
    default = [t.get("default_kernel_s") for t in tasks]
    if not tasks or None in default:
        return [], []
    weights = [t["weight"] for t in tasks]
    xs, ys = [0], [sum(w * d for w, d in zip(weights, default))]
    for point in run["summary"].get("curve", []):
        xs.append(point["trials"])
        ys.append(sum(w * (b if b is not None else d)
                      for w, b, d in zip(weights, point["best_s"], default)))
    return xs, ys


def plot_model_latency(plt: Any, group: ModelRuns, path: Path) -> Path:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    width, styles = 7.0, ("-", "--", ":", "-.")  # lines that coincide stay visible
    curves = [latency_curve(run) for run in group.runs]
    seconds = [y for _, ys in curves for y in ys] + [
        run["summary"][k] for run in group.runs for k in ("default_latency_s", "latency_s")
        if run["summary"].get(k)]
    scale, unit = _time_unit(seconds or [1e-3])
    labels = [_wrap(_model_run_label(run) + ("" if xs else ", nothing recorded"), width - 0.8,
                    LABEL_PT) for run, (xs, _) in zip(group.runs, curves)]
    fig, axes = _figure(plt, width, 4.0 + (_lines(labels) + 1) * LABEL_PT * LINE_IN)
    ax = axes[0, 0]
    for n, (run, (xs, ys), label) in enumerate(zip(group.runs, curves, labels)):
        # A point per slice: the objective once that slice was measured.
        line, = ax.plot(xs, [y * scale for y in ys], marker=".", ls=styles[n % len(styles)],
                        lw=1.6, label=label)
        s = run["summary"]
        if s.get("default_latency_s"):
            ax.plot([0], [s["default_latency_s"] * scale], "o", mfc="none", ms=8,
                    color=line.get_color())
        if s.get("latency_s"):
            ax.plot([s.get("trials", xs[-1] if xs else 0)], [s["latency_s"] * scale], "D",
                    ms=7, color=line.get_color())
    ax.set_title(f"{group.model}: latency against trials", fontsize=TITLE_PT)
    ax.set(xlabel="trials (all tasks)", ylabel=f"latency ({unit})")
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=LABEL_PT)
    ax.grid(alpha=0.3)
    handles, texts = ax.get_legend_handles_labels()
    marks = [Line2D([], [], ls="none", marker="o", mfc="none", ms=8, color="grey"),
             Line2D([], [], ls="none", marker="D", ms=7, color="grey")]
    fig.legend(handles + marks, texts + ["end to end, default schedules",
                                         "end to end, tuned"],
               fontsize=LABEL_PT, loc="outside lower center")
    return _save(fig, path)


def task_times(run: dict) -> list[dict[str, Any]]:
    """One row per task of a run: its time alone with its default schedule and as tuned, each
    also times its weight and as a share of the weighted total (None where not timed)."""
    tasks = run["summary"].get("tasks", [])
    rows = []
    for when in ("default", "tuned"):
        times = [t.get(f"{when}_kernel_s") for t in tasks]
        total = None if None in times or not times else sum(
            t["weight"] * s for t, s in zip(tasks, times))
        for n, (task, s) in enumerate(zip(tasks, times)):
            if when == "default":
                rows.append({k: task.get(k) for k in ("name", "weight", "flops", "trials",
                                                      "kernel")})
            weighted = None if s is None else task["weight"] * s
            rows[n].update({f"{when}_s": s, f"{when}_weighted_s": weighted,
                            f"{when}_share": weighted / total if total else None})
    return rows


def plot_task_times(plt: Any, model: str, run: dict, path: Path) -> Path:
    rows = task_times(run)
    labels = [f"{r['name']} ×{r['weight']:g}" for r in rows]
    label_in = _text_width(labels, LABEL_PT)
    width = label_in + 6.0
    row_in = 0.55
    fig, axes = _figure(plt, width, len(rows) * row_in + 1.5)
    ax = axes[0, 0]
    times = [r[k] for r in rows for k in ("default_weighted_s", "tuned_weighted_s")
             if r[k] is not None]
    scale, unit = _time_unit(times or [1e-3])
    for n, (when, color) in enumerate((("default", "tab:grey"), ("tuned", "tab:blue"))):
        values = [r[f"{when}_weighted_s"] for r in rows]
        y = [i + (n - 0.5) * 0.4 for i in range(len(rows))]
        bars = ax.barh(y, [v * scale if v is not None else 0.0 for v in values], height=0.36,
                       color=color, label=f"{when} schedule" if when == "default" else when)
        ax.bar_label(bars, [f"{v * scale:.3g}" if v is not None else "not timed"
                            for v in values], padding=3, fontsize=LABEL_PT - 1)
    value_in = _text_width(["not timed"], LABEL_PT - 1)
    top = max(times) * scale if times else 1.0
    ax.set_xlim(0, _room_for_labels(0, top, value_in, width - label_in - 0.8, log=False))
    ax.set_yticks(range(len(rows)), labels, fontsize=LABEL_PT)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first task on top
    ax.set_xlabel(f"weight × kernel time alone ({unit})", fontsize=LABEL_PT)
    ax.tick_params(axis="x", labelsize=LABEL_PT)
    fig.suptitle(f"{model}, run {run['id']}: time per task before and after tuning",
                 fontsize=TITLE_PT)
    _legend(ax, fig, loc="outside lower center", ncols=2, frameon=False)
    return _save(fig, path)


def write_model_page(plt: Any, group: ModelRuns, out: Path, here: str) -> tuple[list[Path],
                                                                                  dict]:
    """`out`/<group.page> and its PNGs; returns the files and the model's row of the index."""
    stem = group.page.removesuffix(".html")
    curve = plot_model_latency(plt, group, out / f"{stem}_latency.png")
    sections = []
    files = [out / group.page, curve]
    for run in group.runs:
        bars = None
        if run["summary"].get("tasks"):  # else a run that ended before it recorded anything
            bars = plot_task_times(plt, group.model, run,
                                   out / f"{stem}_run{run['id']}_tasks.png")
            files.append(bars)
        sections.append(_run_section(run, bars, here))
    runs = "".join("<tr>" + "".join(f"<td>{v}</td>" for v in _model_run_cells(run)) + "</tr>"
                   for run in group.runs)
    head = ("run", "status", "scheduler", "trials", "seed", "threads", "target", "population",
            "started", "end to end, default", "end to end, tuned", "× faster", "check")
    body = f"""<p><a href="index.html">report index</a></p>
<h1>{html.escape(group.model)}</h1>
<p>Model graph fingerprint <code>{html.escape(group.fingerprint)}</code>: every run on this
page tuned this graph. End-to-end latencies are medians of whole-model calls, measured in the
tuning process.</p>
<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{runs}</table>
<h2>Latency against trials</h2>
<p>Each line is one run: the scheduler's objective, the sum over tasks of weight × best
latency, after each slice of trials, a task not yet tuned counting at its default schedule's
time (timed alone before tuning; the line's start). The circle is the whole model measured end
to end with every task's default schedule, the diamond after tuning: the gap between them and
the line is what the objective leaves out (the calls between kernels, and each kernel timed alone
rather than within the model).</p>
<p><img src="{curve.name}" alt="{html.escape(curve.stem)}"></p>
<h2>Time per task before and after</h2>
<p>Each task's kernel timed alone on its planned buffers (median of calls), with its default
schedule before tuning and with the kernel the model runs after (kernel: where that came from,
the database, or a default schedule when no tuned program was found); weight is how many times
the model runs it, share its part of the model's weighted kernel time. The total row sets the
weighted kernel times beside the whole model measured end to end.</p>
{''.join(sections)}"""
    (out / group.page).write_text(_page(f"eqsched report: {group.model}", body))
    last = group.runs[-1]["summary"]
    row = {"model": group.model, "fingerprint": group.fingerprint, "page": group.page,
           "runs": len(group.runs), "status": group.runs[-1]["status"],
           "tasks": len(last.get("tasks", [])), "default_latency_s": last.get("default_latency_s"),
           "latency_s": last.get("latency_s"), "correct": last.get("correct")}
    return files, row


def _model_run_cells(run: dict) -> list[str]:
    s, summary = run["settings"], run["summary"]
    before, after = summary.get("default_latency_s"), summary.get("latency_s")
    return [str(run["id"]), html.escape(run["status"])] + [
        _cell(s.get(k)) for k in ("scheduler", "trials", "seed", "threads", "target",
                                  "population")] + [
        time.strftime("%Y-%m-%d %H:%M", time.localtime(run["started_at"])),
        _seconds(before), _seconds(after), _cell(before / after if before and after else None),
        html.escape("; ".join(filter(None, (summary.get("check"), summary.get("onnxruntime"))))
                    or summary.get("error") or "–")]


def _run_section(run: dict, bars: Path | None, here: str) -> str:
    title = f"<h3>{html.escape(_model_run_label(run))}</h3>"
    if bars is None:
        return f"{title}<p>Nothing recorded: the run ended before it timed its tasks.</p>"
    rows = task_times(run)
    summary = run["summary"]
    before, after = summary.get("default_latency_s"), summary.get("latency_s")
    weighted = {when: [r[f"{when}_weighted_s"] for r in rows] for when in ("default", "tuned")}
    totals = {when: None if None in ws or not ws else sum(ws) for when, ws in weighted.items()}
    times = [r[k] for r in rows for k in ("default_s", "tuned_s") if r[k] is not None] + [
        t for t in (before, after, *totals.values()) if t is not None]
    scale, unit = _time_unit(times or [1e-3])

    def at(seconds: float | None) -> str:
        return "–" if seconds is None else f"{seconds * scale:.3g} {unit}"

    def share(part: float | None) -> str:
        return "–" if part is None else f"{part:.0%}"

    def faster(default: float | None, tuned: float | None) -> str:
        return _cell(default / tuned if default and tuned else None)

    head = ("task", "weight", "FLOPs", "trials", "kernel", "default", "tuned", "× faster",
            "weight × default", "weight × tuned", "share before", "share after")
    body = "".join(
        "<tr>" + "".join(f"<td>{v}</td>" for v in (
            html.escape(r["name"]), _cell(r["weight"]), _cell(r["flops"]), _cell(r["trials"]),
            _cell(r["kernel"]), at(r["default_s"]), at(r["tuned_s"]),
            faster(r["default_s"], r["tuned_s"]), at(r["default_weighted_s"]),
            at(r["tuned_weighted_s"]), share(r["default_share"]), share(r["tuned_share"])))
        + "</tr>" for r in rows)
    total = ("<tr><th>total</th>" + "<td></td>" * 3 + "<td>end to end:</td>"
             + "".join(f"<td>{v}</td>" for v in (
                 at(before), at(after), faster(before, after), at(totals["default"]),
                 at(totals["tuned"]))) + "<td></td>" * 2 + "</tr>")
    elsewhere = "" if run["machine_fp"] == here else (
        "<p>Measured on another machine than this one.</p>")
    return f"""{title}{elsewhere}
<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{body}{total}</table>
<p><img src="{bars.name}" alt="{html.escape(bars.stem)}"></p>
"""


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value * 1e3:.3g} ms"


# ---- the page ---------------------------------------------------------------------------------


def write_report(db_path: str | Path, out_dir: str | Path, numpy: bool = True,
                 space: bool = True) -> Report:
    """Write `out_dir`/index.html and its PNGs from the database at `db_path`, and a page per
    recorded model (`write_model_page`) linked from it."""
    plt = _pyplot()
    from ..db import machine_fingerprint
    from ..machine import facts

    with Database(db_path, readonly=True) as db:
        exps = explorations(db)
        models = model_runs(db)
    if not exps and not models:
        raise ReportError(f"{db_path} holds no explorations or model runs to report")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create {out}: {e.strerror}") from None
    here = machine_fingerprint()
    sections, numpy_at = _exploration_sections(plt, exps, out, numpy, space, here) if exps \
        else ([], {})
    model_files, model_rows = [], []
    for group in models:
        files, row = write_model_page(plt, group, out, here)
        model_files += files
        model_rows.append(row)
    rows = [_row(e, numpy_at.get(e.key)) for e in exps]
    page = _html(str(db_path), facts(), rows, sections, model_rows)
    (out / "index.html").write_text(page)
    written = [out / "index.html"] + [f for _, _, fs in sections for f in fs] + model_files
    return Report(out, written, rows, model_rows)


def _exploration_sections(plt: Any, exps: list[Exploration], out: Path, numpy: bool,
                          space: bool, here: str
                          ) -> tuple[list[tuple[str, str, list[Path]]], dict[str, float | None]]:
    """The index's figures of explorations, as (title, caption, PNGs), and numpy's GFLOPS per
    problem where it was timed."""
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
    counts = space_counts(exps, out / "space_counts.json") if space else {}
    if counts:  # none when every problem is a model's task
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
    return sections, numpy_at


def _row(e: Exploration, numpy: float | None) -> dict[str, Any]:
    s = e.summary
    best = s.get("best_gflops")
    return {"problem": e.key, "target": target_of(e.runs[-1]), "configuration": e.label,
            "runs": len(e.runs),
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


def _html(db_path: str, machine: dict, rows: list[dict], sections: list,
          models: list[dict]) -> str:
    models_part = ""
    if models:
        head = ("model", "graph fingerprint", "runs", "last run", "tasks",
                "end to end, default", "end to end, tuned", "× faster", "correct")
        table = "".join(
            f'<tr><td><a href="{html.escape(m["page"])}">{html.escape(m["model"])}</a></td>'
            + "".join(f"<td>{v}</td>" for v in (
                f"<code>{html.escape(m['fingerprint'])}</code>", m["runs"],
                html.escape(m["status"]), m["tasks"], _seconds(m["default_latency_s"]),
                _seconds(m["latency_s"]),
                _cell(m["default_latency_s"] / m["latency_s"]
                      if m["default_latency_s"] and m["latency_s"] else None),
                _cell(m["correct"]))) + "</tr>" for m in models)
        models_part = (f"<h2>Models</h2><p>Each model tuned by <code>eqsched tune-model</code> "
                       f"has a page: its latency against trials and each task's time before "
                       f"and after tuning, for every run (the figures here are its last "
                       f"run's).</p><table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>"
                       f"{table}</table>")
    explorations_part = ""
    if rows:
        head = ("problem", "target", "configuration", "runs", "status", "trials", "measured",
                "best GFLOPS", "% of peak", "× numpy", "× naive", "wall s")
        table = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in r.values()) + "</tr>"
                        for r in rows)
        explorations_part = (f"<h2>Explorations</h2><table><tr>"
                             f"{''.join(f'<th>{h}</th>' for h in head)}</tr>{table}</table>")
    body = "".join(
        f"<h2>{html.escape(title)}</h2><p>{html.escape(caption)}</p>"
        + "".join(f'<p><img src="{f.name}" alt="{html.escape(f.stem)}"></p>' for f in files)
        for title, caption, files in sections)
    return _page(f"eqsched report: {db_path}", f"""<h1>eqsched report</h1>
<p>Database <code>{html.escape(db_path)}</code>; this machine: {html.escape(str(
        machine.get('cpu_model')))}, {machine.get('cores')} cores, LLVM CPU
{html.escape(str(machine.get('llvm_cpu_name')))}; each exploration's target (what its code was
compiled for) is in the table.</p>
{models_part}
{explorations_part}
{body}""")


def _page(title: str, body: str) -> str:
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:auto}}
table{{border-collapse:collapse;font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px}}
img{{max-width:100%}}</style></head><body>
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
    from ..args import CliError, check_writable

    if Path(args.out).is_dir():  # before numpy is timed and the spaces counted, not after
        check_writable(Path(args.out) / "index.html", "the report")
    try:
        report = write_report(args.db, args.out, numpy=not args.no_numpy,
                              space=not args.no_space)
    except (ReportError, DatabaseError) as err:
        raise CliError(str(err)) from None
    except OSError as e:  # a disk that filled up on the way
        raise CliError(f"cannot write the report to {args.out} ({e.strerror})") from None
    if args.json:
        print(json.dumps({"files": [str(f) for f in report.files], "rows": report.rows,
                          "models": report.models}))
    else:
        pages = sum(f.suffix == ".html" for f in report.files) - 1
        plots = sum(f.suffix == ".png" for f in report.files)
        print(f"wrote {report.files[0]}, {plots} plots" + (
            f" and {pages} model page{'s' * (pages != 1)}" if pages else ""))
    return 0
