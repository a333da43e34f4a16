"""The cost-model interface and registry: predict run times of concrete programs, learn from
measurements.

A cost model is one class with one method to implement (`predict`); models that learn also
implement `update`. Pick one by name or pass an object:

    model = get_cost_model("analytic")
    seconds = model.predict([prog_a, prog_b])      # lower is better; only the order matters
    model.update([prog_a], [measured_a])           # learned models fit, others ignore it

    @register
    class LoopCount(CostModel):          # a user's model: one file, one method
        name = "loops"
        def predict(self, programs):
            return np.array([len(p.loops()) for p in programs], dtype=float)

See docs/ARCHITECTURE.md §8 Cost models.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from eqsched.ir import Program


class CostModelError(ValueError):
    """An unknown cost model name or a malformed specification."""


class CostModel:
    """Predicts the run time of programs. Predictions rank candidates: only their order matters
    to the search, but keeping them in seconds makes predicted-vs-measured plots readable."""

    name: ClassVar[str] = ""

    def predict(self, programs: Sequence[Program]) -> np.ndarray:
        """Predicted seconds, one per program (finite, > 0)."""
        raise NotImplementedError

    def update(self, programs: Sequence[Program], seconds: Sequence[float]) -> None:
        """Learn from measured programs (median seconds). Models that do not learn ignore it."""

    def __repr__(self) -> str:
        return f"<cost model {self.name}>"


COST_MODELS: dict[str, Callable[[], CostModel]] = {}


def register(cls: type[CostModel]) -> type[CostModel]:
    """Class decorator: file the model under its name; `get_cost_model(name)` makes a fresh one."""
    if not cls.name:
        raise CostModelError(f"cost model {cls.__name__} has no name")
    COST_MODELS[cls.name] = cls
    return cls


def get_cost_model(spec: str | CostModel, **options) -> CostModel:
    """A fresh model from a registered name (with constructor options), or the object itself."""
    if isinstance(spec, CostModel):
        return spec
    if not isinstance(spec, str) or spec not in COST_MODELS:
        known = ", ".join(sorted(COST_MODELS))
        raise CostModelError(f"unknown cost model {spec!r}; known: {known}")
    return COST_MODELS[spec](**options)


@register
class RandomModel(CostModel):
    """A baseline that knows nothing: random predictions, reproducible by seed."""

    name = "random"

    def __init__(self, seed: int = 0):
        self._rng = random.Random(seed)

    def predict(self, programs: Sequence[Program]) -> np.ndarray:
        return np.array([self._rng.uniform(1.0, 2.0) for _ in programs])


def _ranks(values: Sequence[float]) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), 0-based."""
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    for value in np.unique(x):
        tied = x == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    """Spearman's rank correlation; None when it is undefined (fewer than 3 points, or a side
    with all values tied)."""
    if len(predicted) != len(measured):
        raise ValueError(f"{len(predicted)} predictions but {len(measured)} measurements")
    if len(predicted) < 3:
        return None
    a, b = _ranks(predicted), _ranks(measured)
    if a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def kendall(predicted: Sequence[float], measured: Sequence[float]) -> float | None:
    """Kendall's tau-b; None when undefined (as `spearman`)."""
    if len(predicted) != len(measured):
        raise ValueError(f"{len(predicted)} predictions but {len(measured)} measurements")
    if len(predicted) < 3:
        return None
    a, b = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    upper = np.triu_indices(len(a), k=1)
    da, db = da[upper], db[upper]
    concordant = float((da * db).sum())
    ties_a, ties_b = float((da == 0).sum()), float((db == 0).sum())
    pairs = float(len(da))
    denom = np.sqrt((pairs - ties_a) * (pairs - ties_b))
    return None if denom == 0 else concordant / denom
