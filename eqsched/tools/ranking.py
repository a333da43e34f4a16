"""How well cost models rank a space: each model's predicted order of measured programs against
the measured order, by cross-validation.

    from eqsched.tools.distribution import measure_distribution
    from eqsched.tools.ranking import rank_quality

    dist = measure_distribution("matmul", (64, 64, 64), samples=32, db="eqsched.db")
    rank_quality(dist, models=("analytic", "random"))["analytic"]["spearman"]

    eqsched experiment ranking matmul --size 64,64,64 --db eqsched.db --models analytic,random

See docs/ARCHITECTURE.md §8 Cost models.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..args import CliError
from ..extract import cost_model_for
from ..ir import Program
from .distribution import Distribution, measure_from_args, sample_arguments, summary
from .experiment import at_least_one

TOP_FRACTION = 0.1  # rank_quality's top-k: the fastest tenth


def rank_quality(data: Distribution | Sequence[tuple[Program, float]],
                 models: Sequence[Any] = ("analytic", "learned", "random"), *, folds: int = 5,
                 seed: int = 0, threads: int = 1) -> dict[str, dict[str, Any]]:
    """For each model (a registered name or a CostModel): Spearman and Kendall of predicted vs
    measured seconds, recall of the true fastest tenth in the predicted fastest tenth, and the
    speed of the model's top pick as a fraction of the best's. Every model is scored by k-fold
    cross-validation: a fresh copy learns from the other folds (`update`) and predicts the held
    out one, so a learned model never predicts a point it was fitted on (models that do not learn
    predict as they would on the whole set). `threads`: what the built-in models predict for
    (a Distribution's own settings win)."""
    from ..extract.cost import CostModel, kendall, spearman

    if isinstance(data, Distribution):
        threads = data.settings.options().thread_count
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
        predicted = _held_out_predictions(spec, programs, times, parts, threads)
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
                          parts: list[list[int]], threads: int) -> np.ndarray:
    """Predictions of every program by a model that never learned from it."""
    from ..extract.cost import CostModel

    def fresh() -> CostModel:
        return copy.deepcopy(spec) if isinstance(spec, CostModel) else cost_model_for(spec, threads)

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


# ---- eqsched experiment ranking ---------------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = sub.add_parser("ranking", help="measure (or reuse) a uniform sample and rate cost models "
                                       "on it")
    sample_arguments(p)
    p.add_argument("--models", default="analytic,random,learned",
                   help="comma-separated cost models (default analytic,random,learned)")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds")
    p.set_defaults(run=_cmd_ranking)


def _cmd_ranking(args: Any) -> int:
    import json

    from ..extract.cost import CostModelError

    at_least_one(args, "folds")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        for m in models:
            cost_model_for(m, 1)
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
