"""How well cost models rank a space: each model's predicted order of measured programs against
the measured order, by cross-validation; and learning curves of the learned model on a database.

    from eqsched.tools.distribution import measure_distribution
    from eqsched.tools.ranking import rank_quality

    dist = measure_distribution("matmul", (64, 64, 64), samples=32, db="eqsched.db")
    rank_quality(dist, models=("analytic", "random"))["analytic"]["spearman"]

    eqsched experiment ranking matmul --size 64,64,64 --db eqsched.db --models analytic,random

Learning curves (`--curves`) read the database only: a quarter of the workload's stored programs
of each size is held out; the learned model trains on n of the others (n = 16, 32, ... 1024),
alone and with every stored measurement of the other workloads (transfer), and is scored on the
held-out programs by the mean over sizes of Spearman's correlation and of the recall of the
fastest 5%, against the analytic prior's, averaged over a few random draws of the n.

    curves = learning_curves(history_rows, "matmul", sizes=(16, 64, 256))
    eqsched experiment ranking matmul --curves --db learn.db [--plot curves.png]

See docs/ARCHITECTURE.md §8 Cost models.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..args import CliError, check_writable, parse_target
from ..backend import Target
from ..extract import cost_model_for
from ..ir import Program
from .distribution import Distribution, measure_from_args, sample_arguments, summary
from .experiment import at_least_one

TOP_FRACTION = 0.1  # rank_quality's top-k: the fastest tenth
CURVE_SIZES = (16, 32, 64, 128, 256, 512, 1024)
CURVE_TOP = 0.05  # learning curves' top-k: the fastest twentieth of each size's held-out programs
CURVE_TEST_SHARE = 0.25
CURVE_MIN_GROUP = 8  # sizes with fewer stored programs are not held out from (they rank little)


def rank_quality(data: Distribution | Sequence[tuple[Program, float]],
                 models: Sequence[Any] = ("analytic", "learned", "random"), *, folds: int = 5,
                 seed: int = 0, threads: int = 1, target: Target | None = None
                 ) -> dict[str, dict[str, Any]]:
    """For each model (a registered name or a CostModel): Spearman and Kendall of predicted vs
    measured seconds, recall of the true fastest tenth in the predicted fastest tenth, and the
    speed of the model's top pick as a fraction of the best's. Every model is scored by k-fold
    cross-validation: a fresh copy learns from the other folds (`update`) and predicts the held
    out one, so a learned model never predicts a point it was fitted on (models that do not learn
    predict as they would on the whole set). `threads` and `target` (default: the host): what
    the built-in models predict for (a Distribution's own settings win)."""
    from ..extract.cost import CostModel, kendall, spearman

    if isinstance(data, Distribution):
        threads = data.settings.options().thread_count
        target = data.settings.options().target
        pairs = [(s.program, s.median_s) for s in data.samples if s.correct and s.median_s]
    else:
        pairs = [(p, float(t)) for p, t in data]
    # A program drawn twice would sit in two folds: its own measurement would train its test.
    unique = list({p.hash(): (p, t) for p, t in pairs}.values())
    if len(unique) < 3:
        raise ValueError(f"ranking needs at least 3 distinct measured programs, got {len(unique)}")
    programs = [p for p, _ in unique]
    times = np.array([t for _, t in unique])
    order = list(range(len(unique)))
    random.Random(seed).shuffle(order)
    k = max(2, min(folds, len(unique)))
    parts = [order[f::k] for f in range(k)]
    top = max(1, math.ceil(TOP_FRACTION * len(unique)))
    true_top = set(np.argsort(times, kind="stable")[:top].tolist())
    out: dict[str, dict[str, Any]] = {}
    for spec in models:
        predicted = _held_out_predictions(spec, programs, times, parts, threads, target)
        picked = np.argsort(predicted, kind="stable")
        name = spec.name if isinstance(spec, CostModel) else str(spec)
        out[name] = {
            "n": len(unique), "folds": k, "top_k": top,
            "spearman": spearman(predicted.tolist(), times.tolist()),
            "kendall": kendall(predicted.tolist(), times.tolist()),
            "top_recall": len(true_top & set(picked[:top].tolist())) / top,
            "top1_fraction": float(times.min() / times[picked[0]]),
        }
    return out


def _held_out_predictions(spec: Any, programs: list[Program], times: np.ndarray,
                          parts: list[list[int]], threads: int, target: Target | None
                          ) -> np.ndarray:
    """Predictions of every program by a model that never learned from it."""
    from ..extract.cost import CostModel

    def fresh() -> CostModel:
        return (copy.deepcopy(spec) if isinstance(spec, CostModel)
                else cost_model_for(spec, threads, target))

    model = fresh()
    if type(model).update is CostModel.update:
        # It does not learn: one model predicts all (fresh copies per fold would repeat, e.g.,
        # the random model's sequence and tie its predictions across folds).
        return np.asarray(model.predict(programs), dtype=float)
    predicted = np.empty(len(programs))
    for held in parts:
        train = sorted(set(range(len(programs))) - set(held))
        model = fresh()
        model.update([programs[i] for i in train], times[train].tolist())
        predicted[held] = model.predict([programs[i] for i in held])
    return predicted


# ---- learning curves ---------------------------------------------------------------------------


def learning_curves(rows: Sequence[tuple[str, Any]], workload: str,
                    sizes: Sequence[int] = CURVE_SIZES, *, draws: int = 3, seed: int = 0,
                    test_share: float = CURVE_TEST_SHARE) -> dict[str, Any]:
    """Learning curves of the learned model on stored measurements: `rows` are (workload name,
    `learned.Example`) pairs (`learned.history`), their inputs computed with the analytic prior.
    Per training count n: the held-out mean Spearman and top-5% recall of the prior, of the
    model trained on n programs of `workload` ("same"), of the same trees without the model's
    fallback check ("unchecked"), and of the model trained on those n plus every other
    workload's rows ("transfer"); each a mean over `draws` draws of the n, with the share of
    draws in which the model used its trees (`fitted`). A count larger than the workload's
    training pool is reported with None."""
    from ..extract.learned import LearnedModel, train_trees

    if not 0 < test_share < 1:
        raise ValueError(f"test_share must be between 0 and 1, got {test_share}")
    mine = [e for w, e in rows if w == workload]
    others = [e for w, e in rows if w != workload]
    rng = np.random.default_rng(seed)
    by_group: dict[str, list[Any]] = {}
    for e in mine:
        by_group.setdefault(e.group, []).append(e)
    test: list[Any] = []
    pool: list[Any] = []
    for group in sorted(by_group):
        members = by_group[group]
        if len(members) < CURVE_MIN_GROUP:
            pool += members
            continue
        order = rng.permutation(len(members))
        cut = max(CURVE_MIN_GROUP // 2, round(test_share * len(members)))
        test += [members[i] for i in order[:cut]]
        pool += [members[i] for i in order[cut:]]
    if not test:
        raise ValueError(f"the database has no size of {workload} with {CURVE_MIN_GROUP} or more "
                         f"correct measurements of this machine to hold out")
    x_test = np.array([e.x for e in test])
    y_test = np.array([e.log_seconds for e in test])
    g_test = np.array([e.group for e in test])
    prior = _held_out_scores(x_test[:, -1], y_test, g_test)
    points = []
    for n in sizes:
        point: dict[str, Any] = {"n": n, "prior": prior}
        if n > len(pool):
            points.append({**point, "same": None, "unchecked": None, "transfer": None})
            continue
        runs: dict[str, list[dict[str, float]]] = {"same": [], "unchecked": [], "transfer": []}
        fitted = {"same": 0, "transfer": 0}
        for draw in range(draws):
            chosen = [pool[i] for i in np.random.default_rng([seed, n, draw]).permutation(
                len(pool))[:n]]
            for kind, extra in (("same", []), ("transfer", others)):
                # As in explore: the workload's measurements are the run's, others are stored.
                model = LearnedModel(prior=None, seed=draw)
                model.add_examples(chosen, current=True)
                model.add_examples(extra)
                fitted[kind] += model.fitted
                keys = model.rank_keys(x_test, g_test)
                runs[kind].append(_held_out_scores(keys, y_test, g_test))
            trees = train_trees(np.array([e.x for e in chosen]),
                                np.array([e.log_seconds for e in chosen]),
                                np.array([e.group for e in chosen]), draw)
            keys = x_test[:, -1] if trees is None else -trees.predict(x_test)
            runs["unchecked"].append(_held_out_scores(keys, y_test, g_test))
        for kind, scores in runs.items():
            point[kind] = {m: float(np.mean([s[m] for s in scores])) for m in scores[0]}
            if kind in fitted:
                point[kind]["fitted"] = fitted[kind] / draws
        points.append(point)
    return {"workload": workload, "held_out": len(test), "pool": len(pool),
            "sizes_held_out": len(set(g_test.tolist())), "others": len(others),
            "other_workloads": sorted({w for w, _ in rows if w != workload}), "draws": draws,
            "points": points}


def _held_out_scores(keys: np.ndarray, log_seconds: np.ndarray,
                     groups: np.ndarray) -> dict[str, float]:
    """Mean over groups of Spearman (keys vs times) and of the recall of the fastest CURVE_TOP
    among the CURVE_TOP with the lowest keys."""
    from ..extract.cost import spearman

    rhos, recalls = [], []
    for g in np.unique(groups):
        at = np.flatnonzero(groups == g)
        rhos.append(spearman(keys[at], log_seconds[at]) or 0.0)
        k = max(1, math.ceil(CURVE_TOP * len(at)))
        true_top = set(at[np.argsort(log_seconds[at], kind="stable")[:k]].tolist())
        picked = set(at[np.argsort(keys[at], kind="stable")[:k]].tolist())
        recalls.append(len(true_top & picked) / k)
    return {"spearman": float(np.mean(rhos)), "top_recall": float(np.mean(recalls))}


def curves_table(curves: dict[str, Any]) -> str:
    """The learning curves as a text table."""
    def cell(point: dict[str, Any], kind: str, metric: str) -> str:
        value = point[kind]
        return "-" if value is None else f"{value[metric]:+.2f}" if metric == "spearman" else (
            f"{value[metric]:.0%}")

    head = ("n", "prior rho", "same rho", "unchecked rho", "transfer rho", "prior top5%",
            "same top5%", "transfer top5%", "fitted same/transfer")
    lines = [head]
    for p in curves["points"]:
        used = "-" if p["same"] is None else (f"{p['same']['fitted']:.0%}/"
                                              f"{p['transfer']['fitted']:.0%}")
        lines.append((str(p["n"]), cell(p, "prior", "spearman"), cell(p, "same", "spearman"),
                      cell(p, "unchecked", "spearman"), cell(p, "transfer", "spearman"),
                      cell(p, "prior", "top_recall"), cell(p, "same", "top_recall"),
                      cell(p, "transfer", "top_recall"), used))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines)
    return (f"{text}\n({curves['workload']}: {curves['held_out']} held-out programs of "
            f"{curves['sizes_held_out']} sizes, {curves['pool']} to train from; transfer adds "
            f"{curves['others']} measurements of {', '.join(curves['other_workloads']) or '-'}; "
            f"mean of {curves['draws']} draws)")


def plot_curves(curves: dict[str, Any], path: str) -> None:
    """Spearman and top-5% recall against n, one line per model, into an image file."""
    from .report import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    ns = [p["n"] for p in curves["points"]]
    for ax, metric, title in ((axes[0], "spearman", "held-out Spearman"),
                              (axes[1], "top_recall", "top-5% recall")):
        for kind, label in (("prior", "analytic prior"), ("same", "trees, same workload"),
                            ("transfer", "trees + other workloads")):
            ax.plot(ns, [None if p[kind] is None else p[kind][metric] for p in curves["points"]],
                    marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"training measurements of {curves['workload']}")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- eqsched experiment ranking ---------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = sub.add_parser("ranking", help="measure (or reuse) a uniform sample and rate cost models "
                                       "on it")
    sample_arguments(p)
    p.add_argument("--models", default="analytic,random,learned",
                   help="comma-separated cost models (default analytic,random,learned)")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds")
    p.add_argument("--curves", action="store_true",
                   help="learning curves of the learned model from the measurements in --db "
                        "(nothing is measured)")
    p.add_argument("--counts", default=",".join(map(str, CURVE_SIZES)),
                   help="training counts of the curves (default 16,32,...,1024)")
    p.add_argument("--draws", type=int, default=3, help="draws of each count (default 3)")
    p.add_argument("--test-share", type=float, default=CURVE_TEST_SHARE,
                   help=f"share of each size's programs held out (default {CURVE_TEST_SHARE})")
    p.add_argument("--plot", metavar="FILE", help="also draw the curves into an image file "
                                                  "(needs matplotlib)")
    p.set_defaults(run=_cmd_ranking)


def _cmd_ranking(args: Any) -> int:
    import json

    from ..extract.cost import CostModelError

    if args.folds < 2:  # cross-validation holds out one fold and learns from the others
        raise CliError(f"--folds must be >= 2, got {args.folds}")
    target = parse_target(args.target)  # before a model calibrates anything
    if args.curves:
        return _cmd_curves(args, target)
    if args.plot is not None:
        raise CliError("--plot draws the learning curves: it needs --curves")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        for m in models:
            cost_model_for(m, 1, target)
    except CostModelError as err:
        raise CliError(str(err)) from None
    if not models:
        raise CliError("--models names no cost model")
    dist = measure_from_args(args)
    try:
        quality = rank_quality(dist, models, folds=args.folds, seed=args.seed)
    except ValueError as err:
        raise CliError(str(err)) from None
    if args.json:
        print(json.dumps({"distribution": dist.to_json(), "ranking": quality}))
        return 0
    print(summary(dist))
    best = dist.best.gflops if dist.best else 0.0
    print(f"{'model':<10} {'spearman':>8} {'kendall':>8} {'top-10% recall':>15} "
          f"{'top-1 pick':>22}")
    for name, q in quality.items():
        rho = "n/a" if q["spearman"] is None else f"{q['spearman']:+.2f}"
        tau = "n/a" if q["kendall"] is None else f"{q['kendall']:+.2f}"
        pick = f"{q['top1_fraction']:.0%} ({q['top1_fraction'] * best:.3g} GFLOPS)"
        print(f"{name:<10} {rho:>8} {tau:>8} {q['top_recall']:>15.0%} {pick:>22}")
    first = next(iter(quality.values()))
    print(f"({first['n']} distinct programs, {first['folds']}-fold cross-validation, "
          f"top-10% = {first['top_k']})")
    return 0


def _cmd_curves(args: Any, target: Target) -> int:
    import json

    from ..db import Database, DatabaseError
    from ..extract.learned import hardware_of, history
    from .experiment import problem

    at_least_one(args, "draws", "threads")
    if not args.db:
        raise CliError("--curves reads the measurements of --db; name a database")
    try:
        counts = [int(c) for c in args.counts.split(",") if c.strip()]
    except ValueError:
        raise CliError(f"--counts must be comma-separated integers, got {args.counts!r}") from None
    if not counts or min(counts) < 1:
        raise CliError(f"--counts must name positive counts, got {args.counts!r}")
    if not 0 < args.test_share < 1:  # before the stored traces are replayed (seconds each 100)
        raise CliError(f"--test-share must be between 0 and 1, got {args.test_share}")
    workload, _, _ = problem(args)
    if args.plot is not None:  # before the curves are computed, not after
        check_writable(args.plot, "the plot")
    prior = cost_model_for("analytic", args.threads, target)
    try:
        # Read, not created: a mistyped name is refused (writable when it exists, to cache the
        # replayed traces' inputs).
        with Database(args.db, readonly=not Path(args.db).exists()) as db:
            rows, skipped = history(db, prior, hardware_of(prior), threads=args.threads,
                                    target=target.spec)
    except DatabaseError as err:
        raise CliError(str(err)) from None
    try:
        curves = learning_curves(rows, workload, counts, draws=args.draws, seed=args.seed,
                                 test_share=args.test_share)
    except ValueError as err:
        raise CliError(str(err)) from None
    curves["unreplayable"] = skipped
    if args.plot:
        from .report import ReportError

        try:
            plot_curves(curves, args.plot)
        except ReportError as err:
            raise CliError(str(err)) from None
        except OSError as e:
            raise CliError(f"cannot write the plot to {args.plot} ({e.strerror})") from None
    print(json.dumps(curves) if args.json else curves_table(curves))
    return 0
