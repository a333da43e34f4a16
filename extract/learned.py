"""A cost model learned from measurements: ridge regression of log time on program features,
anchored at a prior model and used only where it ranks better than the prior.

Until `min_samples` programs are measured it predicts exactly what its prior (the analytic model
by default) predicts. From then on it fits

    log(seconds) = log(prior) + b + w . z

where z are `features(prog)` and log(prior) itself, standardized over the measured programs. The
ridge penalty pulls w towards zero, that is towards the prior: a few measurements correct the
prior rather than replace it (ridge towards the mean time ranked held-out programs worse).
New programs' features are clipped to the range seen in training, because a feature that barely
varied in 8 samples has a tiny standard deviation and would swing predictions far outside it.
The fit is kept only if its leave-one-out ranking (closed form) of the faster half of the
measured programs beats the prior's ranking of them, and its ranking of all of them is at most
GLOBAL_SLACK below the prior's; otherwise the model goes on predicting the prior. The faster half
is what the search chooses from: a prior can rank a whole run well because it tells the first
round's slow programs from the rest, and still tie or misorder the best family
(docs/ARCHITECTURE.md §17.4).

Why a check at all: on random programs of several workloads an unchecked fit ranked held-out
programs worse than the analytic prior, while the checked model stays at the prior's level;
against a weak prior the fit ranks much better (docs/ARCHITECTURE.md §17.4).

    model = LearnedModel(prior=MyPrior())         # or prior="analytic", a registered name
    model.predict(programs)                       # seconds; the prior's while data is scarce
    model.update(measured, seconds)               # stores everything and refits
    model.validation                              # Spearman: {"learned": 0.81, "prior": 0.74,
                                                  #  "learned_top": 0.5, "prior_top": 0.4}
    restored = LearnedModel.from_state(model.state(), prior=MyPrior())

See docs/ARCHITECTURE.md §8 Cost models.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from eqsched.ir import Program

from .cost import CostModel, CostModelError, get_cost_model, register, spearman
from .features import FEATURE_NAMES, features

_TINY = 1e-12
GLOBAL_SLACK = 0.1  # how much worse than the prior the fit may rank all measured programs


def _as_prior(prior: CostModel | str | None) -> CostModel | None:
    if prior is None or isinstance(prior, CostModel):
        return prior
    if isinstance(prior, str):
        if prior == LearnedModel.name:
            raise CostModelError("a learned model cannot be its own prior")
        return get_cost_model(prior)
    raise CostModelError(f"prior must be a cost model, a registered name or None, not {prior!r}")


class _Ridge:
    """Closed-form ridge on standardized inputs, fitted to the residual y - offset."""

    def __init__(self, x: np.ndarray, y: np.ndarray, offset: np.ndarray, l2: float):
        self.low, self.high = x.min(axis=0), x.max(axis=0)
        self.mean = x.mean(axis=0)
        scale = x.std(axis=0)
        self.scale = np.where(scale > _TINY, scale, 1.0)  # constant columns carry no weight
        z = (x - self.mean) / self.scale
        target = y - offset
        self.bias = float(target.mean())
        inverse = np.linalg.inv(z.T @ z + l2 * np.eye(z.shape[1]))
        self.weights = inverse @ (z.T @ (target - self.bias))
        # Leave-one-out predictions from the hat matrix (centering counts as one more parameter).
        leverage = np.einsum("ij,jk,ik->i", z, inverse, z) + 1.0 / len(y)
        fitted = offset + self.bias + z @ self.weights
        self.left_out = y - (y - fitted) / np.clip(1.0 - leverage, _TINY, None)

    def __call__(self, x: np.ndarray, offset: np.ndarray) -> np.ndarray:
        # No extrapolation: a feature counts only as far as the training data varied it.
        x = np.clip(x, self.low, self.high)
        return offset + self.bias + ((x - self.mean) / self.scale) @ self.weights


@register
class LearnedModel(CostModel):
    """Features of the program (plus the prior's log prediction) -> log seconds, by ridge
    regression anchored at the prior; the prior alone while it ranks the measurements better.
    `l2` is the penalty on standardized weights: a small one made the unchecked fit rank
    held-out programs worse, larger values only approach the prior (docs/ARCHITECTURE.md §17.4).
    `validation` holds the last refit's leave-one-out Spearman of the fit and the prior's
    Spearman on the measured programs, all of them and the faster half (`_top`)."""

    name = "learned"

    def __init__(self, prior: CostModel | str | None = "analytic", min_samples: int = 8,
                 l2: float = 100.0, seed: int = 0):
        if min_samples < 3:
            raise CostModelError(f"min_samples must be at least 3, got {min_samples}")
        if not l2 > 0:
            raise CostModelError(f"l2 must be positive, got {l2}")
        self.prior = _as_prior(prior)
        self.min_samples = min_samples
        self.l2 = float(l2)
        self.seed = seed  # the fit is deterministic; kept for the common model signature
        self._x = np.empty((0, len(FEATURE_NAMES) + 1))
        self._y = np.empty(0)
        self._fit: _Ridge | None = None
        self.validation: dict[str, float] = {}

    @property
    def samples(self) -> int:
        """How many measurements the model has seen."""
        return len(self._y)

    @property
    def fitted(self) -> bool:
        """Whether predictions come from the fit (else from the prior)."""
        return self._fit is not None

    def predict(self, programs: Sequence[Program]) -> np.ndarray:
        if self._fit is None:
            return self._prior_seconds(programs)
        log_prior = self._log_prior(programs)
        return np.exp(self._fit(self._inputs(programs, log_prior), log_prior))

    def update(self, programs: Sequence[Program], seconds: Sequence[float]) -> None:
        seconds = np.asarray(seconds, dtype=float)
        if len(programs) != len(seconds):
            raise CostModelError(f"{len(programs)} programs but {len(seconds)} times")
        if not np.all(np.isfinite(seconds) & (seconds > 0)):
            raise CostModelError("measured times must be finite and positive (filter errors out)")
        if not len(programs):
            return
        x = self._inputs(programs, self._log_prior(programs))
        self._x = np.vstack([self._x, x])
        self._y = np.concatenate([self._y, np.log(seconds)])
        self._refit()

    def _prior_seconds(self, programs: Sequence[Program]) -> np.ndarray:
        if self.prior is None:
            return np.ones(len(programs))
        return np.asarray(self.prior.predict(programs), dtype=float)

    def _log_prior(self, programs: Sequence[Program]) -> np.ndarray:
        return np.log(np.clip(self._prior_seconds(programs), _TINY, None))

    @staticmethod
    def _inputs(programs: Sequence[Program], log_prior: np.ndarray) -> np.ndarray:
        rows = [features(p) for p in programs]
        return np.column_stack([np.array(rows).reshape(len(rows), len(FEATURE_NAMES)), log_prior])

    def _refit(self) -> None:
        self._fit, self.validation = None, {}
        if self.samples < self.min_samples:
            return
        log_prior = self._x[:, -1]
        fit = _Ridge(self._x, self._y, log_prior, self.l2)
        top = np.argsort(self._y, kind="stable")[:max(self.min_samples, self.samples // 2)]
        # Spearman is undefined (None) for tied predictions: a prior that ties everything
        # ranks nothing.
        v = self.validation = {
            "learned": spearman(fit.left_out, self._y) or 0.0,
            "prior": spearman(log_prior, self._y) or 0.0,
            "learned_top": spearman(fit.left_out[top], self._y[top]) or 0.0,
            "prior_top": spearman(log_prior[top], self._y[top]) or 0.0}
        if v["learned_top"] > v["prior_top"] and v["learned"] >= v["prior"] - GLOBAL_SLACK:
            self._fit = fit

    # ---- persistence ----------------------------------------------------------------------

    def state(self) -> dict:
        """JSON-able: the settings and the training data (the fit is recomputed on load)."""
        return {"min_samples": self.min_samples, "l2": self.l2, "seed": self.seed,
                "features": list(FEATURE_NAMES),
                "x": self._x.tolist(), "log_seconds": self._y.tolist()}

    @classmethod
    def from_state(cls, state: dict, prior: CostModel | str | None = "analytic") -> LearnedModel:
        """A model trained on the data in `state`; its prior is not stored and is given again
        (it must be the same prior: the stored inputs include its log predictions)."""
        if state.get("features") != list(FEATURE_NAMES):
            raise CostModelError("the saved learned model was trained on other features")
        model = cls(prior, state["min_samples"], state["l2"], state["seed"])
        x = np.asarray(state["x"], dtype=float).reshape(-1, len(FEATURE_NAMES) + 1)
        y = np.asarray(state["log_seconds"], dtype=float)
        if len(x) != len(y) or not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            raise CostModelError("the saved learned model's data is malformed")
        model._x, model._y = x, y
        model._refit()
        return model
