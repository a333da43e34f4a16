"""The learned cost model: the prior's predictions until enough measurements, then a fit of log
time on program features that ranks unseen programs; reproducible and restorable."""

import json
import math

import numpy as np
import pytest

from eqsched.egraph.derive import realize
from eqsched.egraph.space import build_space
from eqsched.extract.cost import CostModel, CostModelError, get_cost_model, spearman
from eqsched.extract.features import features
from eqsched.extract.learned import GLOBAL_SLACK, LearnedModel
from eqsched.ir import Program, naive_program
from eqsched.legality import sites
from eqsched.rules import default_rules
from eqsched.workloads import get_workload


class Iterations(CostModel):
    """A tiny prior: a nanosecond per iteration of every block."""

    def predict(self, programs):
        return np.array([1e-9 * sum(math.prod(lp.extent for lp in site.loops)
                                    for site in sites(p).values()) for p in programs])


@pytest.fixture(scope="module")
def programs() -> list[Program]:
    naive = naive_program(get_workload("matmul").build(64, 64, 64))
    space = build_space(naive, default_rules())
    return [realize(term, sizes, naive) for term, sizes in space.sample(60, seed=3)]


@pytest.fixture(scope="module")
def synthetic_seconds(programs) -> np.ndarray:
    """Times that are a known log-linear function of the features and of the prior."""
    x = np.array([features(p) for p in programs])
    spread = x.std(axis=0)
    z = (x - x.mean(axis=0)) / np.where(spread > 0, spread, 1)
    w = np.random.default_rng(7).normal(size=x.shape[1])
    return Iterations().predict(programs) * np.exp(0.5 * z @ w / np.sqrt(len(w)))


def test_predicts_the_prior_until_min_samples(programs, synthetic_seconds):
    prior = Iterations()
    model = LearnedModel(prior, min_samples=8)
    want = prior.predict(programs)
    assert np.array_equal(model.predict(programs), want)
    model.update(programs[:7], synthetic_seconds[:7])
    assert not model.fitted and np.array_equal(model.predict(programs), want)
    model.update(programs[7:8], synthetic_seconds[7:8])
    assert model.samples == 8
    assert set(model.validation) == {"learned", "prior", "learned_top", "prior_top"}
    # From min_samples on, the fit is used exactly when it ranks the faster half of the measured
    # programs better (left out one at a time) than the prior does, and all of them not much
    # worse.
    v = model.validation
    assert model.fitted == (v["learned_top"] > v["prior_top"]
                            and v["learned"] >= v["prior"] - GLOBAL_SLACK)
    assert np.array_equal(model.predict(programs), want) != model.fitted


def test_learns_a_log_linear_function_of_the_features(programs, synthetic_seconds):
    # Noise-free data needs little shrinkage; the default l2 is tuned for measured times.
    model = LearnedModel(Iterations(), l2=1.0)
    model.update(programs[:40], synthetic_seconds[:40])
    predicted = model.predict(programs[40:])
    assert spearman(predicted, synthetic_seconds[40:]) > 0.9
    assert np.all(np.isfinite(predicted)) and np.all(predicted > 0)


def test_predictions_keep_the_scale_of_seconds(programs, synthetic_seconds):
    model = LearnedModel(Iterations())
    model.update(programs[:40], synthetic_seconds[:40])
    ratio = model.predict(programs[40:]) / synthetic_seconds[40:]
    assert np.all((ratio > 0.5) & (ratio < 2))


def test_deterministic(programs, synthetic_seconds):
    def trained() -> np.ndarray:
        model = LearnedModel(Iterations(), seed=1)
        model.update(programs[:20], synthetic_seconds[:20])
        return model.predict(programs[20:])

    assert np.array_equal(trained(), trained())


def test_keeps_a_prior_that_already_ranks_perfectly(programs):
    prior = Iterations()
    model = LearnedModel(prior)
    model.update(programs[:30], prior.predict(programs[:30]))
    assert not model.fitted and model.validation["prior"] == pytest.approx(1.0)
    assert np.array_equal(model.predict(programs[30:]), prior.predict(programs[30:]))


def test_uses_the_fit_where_it_ranks_better_than_the_prior(programs, synthetic_seconds):
    model = LearnedModel(Iterations())
    model.update(programs[:30], synthetic_seconds[:30])
    assert model.fitted
    assert model.validation["learned_top"] > model.validation["prior_top"]


class TiesTheFast(CostModel):
    """A prior that knows the slow programs' times and ties all the fast ones."""

    def __init__(self, programs, seconds, cut):
        self.known = {p.hash(): max(s, cut) for p, s in zip(programs, seconds)}

    def predict(self, programs):
        return np.array([self.known[p.hash()] for p in programs])


def test_uses_the_fit_where_the_prior_ties_the_fast_programs(programs, synthetic_seconds):
    # Overall the prior ranks well (it sorts the slow half); among the fast half it ranks
    # nothing, and the search picks from there.
    prior = TiesTheFast(programs, synthetic_seconds, cut=np.median(synthetic_seconds[:40]))
    model = LearnedModel(prior, l2=1.0)
    model.update(programs[:40], synthetic_seconds[:40])
    v = model.validation
    assert v["prior"] > 0.5 and v["prior_top"] < 0.2
    assert model.fitted
    fast = np.argsort(synthetic_seconds[40:])[:10]
    assert spearman(model.predict(programs[40:])[fast], synthetic_seconds[40:][fast]) > 0.3


def test_without_a_prior_it_learns_from_the_features_alone(programs, synthetic_seconds):
    model = LearnedModel(prior=None, l2=1.0)
    assert np.all(model.predict(programs[:3]) == 1.0)  # no information: all tied
    model.update(programs[:40], synthetic_seconds[:40])
    assert spearman(model.predict(programs[40:]), synthetic_seconds[40:]) > 0.8


def test_state_round_trips_through_json(programs, synthetic_seconds):
    model = LearnedModel(Iterations(), min_samples=4, l2=10, seed=3)
    model.update(programs[:12], synthetic_seconds[:12])
    restored = LearnedModel.from_state(json.loads(json.dumps(model.state())), prior=Iterations())
    assert restored.samples == 12
    assert np.array_equal(restored.predict(programs[12:]), model.predict(programs[12:]))


def test_registered_under_its_name_with_options():
    model = get_cost_model("learned", prior=Iterations(), min_samples=3)
    assert isinstance(model, LearnedModel) and model.min_samples == 3


def test_user_errors_are_one_line_cost_model_errors(programs):
    with pytest.raises(CostModelError, match="unknown cost model 'nonesuch'"):
        LearnedModel(prior="nonesuch")
    with pytest.raises(CostModelError, match="its own prior"):
        LearnedModel(prior="learned")
    with pytest.raises(CostModelError, match="min_samples"):
        LearnedModel(Iterations(), min_samples=1)
    with pytest.raises(CostModelError, match="l2 must be positive"):
        LearnedModel(Iterations(), l2=0)
    model = LearnedModel(Iterations())
    with pytest.raises(CostModelError, match="2 programs but 1 times"):
        model.update(programs[:2], [1e-3])
    with pytest.raises(CostModelError, match="finite and positive"):
        model.update(programs[:1], [0.0])
    with pytest.raises(CostModelError, match="other features"):
        LearnedModel.from_state({"features": ["old"]}, prior=Iterations())
