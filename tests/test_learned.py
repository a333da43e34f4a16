"""The learned cost model: the prior's predictions until enough measurements, then ranking trees
over program features that order unseen programs; trained on stored measurements of other runs
too, reproducible and restorable."""

import json
import math

import numpy as np
import pytest
from conftest import synthetic_machine_model

from eqsched.db import Database, Record
from eqsched.egraph.derive import derive, realize
from eqsched.egraph.space import build_space
from eqsched.extract.cost import CostModel, CostModelError, get_cost_model, spearman
from eqsched.extract.features import FEATURE_NAMES, Hardware, features
from eqsched.extract.learned import (
    MIN_PROBLEM_ROWS,
    VALIDATION_FOLDS,
    Example,
    LearnedModel,
    group_of,
    hardware_of,
    history,
    inputs,
    inputs_key,
    relevance,
)
from eqsched.ir import Program, naive_program
from eqsched.legality import sites
from eqsched.rules import default_rules
from eqsched.workloads import get_workload

SIZE = (64, 64, 64)
AVX512 = synthetic_machine_model()
HARDWARE = Hardware.of(AVX512)


class Iterations(CostModel):
    """A weak prior: a nanosecond per iteration of every block (blind to vectors and caches).
    Like the analytic model, it names the machine model and threads its programs run on."""

    machine = AVX512
    threads = 1

    def predict(self, programs):
        return np.array([1e-9 * sum(math.prod(lp.extent for lp in site.loops)
                                    for site in sites(p).values()) for p in programs])


@pytest.fixture(scope="module")
def drawn():
    """80 distinct programs of matmul 64^3 with their terms (for traces)."""
    naive = naive_program(get_workload("matmul").build(*SIZE))
    space = build_space(naive, default_rules())
    out = {}
    for term, sizes in space.sample(160, seed=3):
        prog = realize(term, sizes, naive)
        out.setdefault(prog.hash(), (prog, term, sizes))
    assert len(out) >= 80
    return naive, list(out.values())[:80]


@pytest.fixture(scope="module")
def programs(drawn) -> list[Program]:
    return [p for p, _, _ in drawn[1]]


@pytest.fixture(scope="module")
def synthetic_seconds(programs) -> np.ndarray:
    """Times that follow a known order: a fixed nonlinear function of the features that the
    Iterations prior does not see."""
    x = np.array([features(p, HARDWARE) for p in programs])
    spread = x.std(axis=0)
    z = (x - x.mean(axis=0)) / np.where(spread > 0, spread, 1)
    w = np.random.default_rng(7).normal(size=x.shape[1])
    return 1e-3 * np.exp(0.5 * np.tanh(z @ w / np.sqrt(len(w))) + 0.3 * z[:, 0] ** 2)


def test_predicts_exactly_the_prior_below_min_samples(programs, synthetic_seconds):
    prior = Iterations()
    model = LearnedModel(prior, min_samples=20)
    want = prior.predict(programs)
    assert np.array_equal(model.predict(programs), want)
    model.update(programs[:19], synthetic_seconds[:19])
    assert model.samples == 19 and not model.fitted and model.validation == {}
    assert np.array_equal(model.predict(programs), want)
    model.update(programs[19:20], synthetic_seconds[19:20])
    # From min_samples on, the check runs: every program is held out once, by one of the folds.
    assert model.validation["held_out"] == 20 and model.validation["folds"] == VALIDATION_FOLDS


def test_ranks_held_out_programs_better_than_a_constant_and_the_prior(programs,
                                                                       synthetic_seconds):
    model = LearnedModel(Iterations(), min_samples=20)
    model.update(programs[:60], synthetic_seconds[:60])
    assert model.fitted
    v = model.validation
    assert v["learned"] > v["prior"] and v["learned_current"] == v["learned"]
    predicted = model.predict(programs[60:])
    # A constant ties every program: Spearman is undefined, it ranks nothing.
    assert spearman(np.ones(20), synthetic_seconds[60:]) is None
    assert spearman(predicted, synthetic_seconds[60:]) > 0.5
    assert spearman(predicted, synthetic_seconds[60:]) > spearman(
        Iterations().predict(programs[60:]), synthetic_seconds[60:])
    assert np.all(np.isfinite(predicted)) and np.all(predicted > 0)


def test_keeps_a_prior_that_already_ranks_perfectly(programs):
    prior = Iterations()
    model = LearnedModel(prior, min_samples=20)
    model.update(programs[:60], prior.predict(programs[:60]))
    assert not model.fitted and model.validation["prior"] == pytest.approx(1.0)
    assert np.array_equal(model.predict(programs[60:]), prior.predict(programs[60:]))


def test_the_naive_program_keeps_the_priors_seconds(drawn, programs, synthetic_seconds):
    naive, _ = drawn
    prior = Iterations()
    model = LearnedModel(prior, min_samples=20)
    model.update(programs[:60], synthetic_seconds[:60])
    assert model.fitted
    assert model.predict([naive])[0] == pytest.approx(prior.predict([naive])[0])


def test_deterministic_given_the_seed(programs, synthetic_seconds):
    def trained(seed: int) -> np.ndarray:
        model = LearnedModel(Iterations(), min_samples=20, seed=seed)
        model.update(programs[:60], synthetic_seconds[:60])
        return model.predict(programs[60:])

    assert np.array_equal(trained(1), trained(1))


def test_state_round_trips_through_json(programs, synthetic_seconds):
    model = LearnedModel(Iterations(), min_samples=20, seed=3)
    model.update(programs[:60], synthetic_seconds[:60])
    restored = LearnedModel.from_state(json.loads(json.dumps(model.state())), prior=Iterations())
    assert restored.samples == 60 and restored.fitted == model.fitted
    assert restored.validation == model.validation
    assert np.array_equal(restored.predict(programs[60:]), model.predict(programs[60:]))


def test_relevance_is_the_speed_rank_within_each_group():
    log_seconds = np.array([3.0, 1.0, 2.0, 5.0, 4.0])
    groups = np.array(["a", "a", "a", "b", "b"])
    # Within a: 1.0 fastest, 3.0 slowest; within b: 4.0 fastest (other groups' times do not
    # count). Level: (1 - rank / group size) * 16, at most 15.
    assert relevance(log_seconds, groups).tolist() == [5, 15, 10, 8, 15]


def test_a_problem_the_trees_were_not_trained_on_is_ranked_by_the_prior(programs,
                                                                        synthetic_seconds):
    # Examples of other runs count like the run's own (the database's history), but the check
    # never holds a problem out whole: the trees rank one only once trained on enough of it.
    x = inputs(programs, Iterations(), HARDWARE)
    other = [Example("another-problem", p.hash(), row, float(np.log(s)))
             for p, row, s in zip(programs[:60], x[:60], synthetic_seconds[:60])]
    model = LearnedModel(Iterations(), min_samples=20)
    assert model.add_examples(other) == 60 and model.add_examples(other) == 0
    assert model.fitted and model.validation["learned_current"] is None
    held_out = programs[60:]
    assert np.array_equal(model.predict(held_out), Iterations().predict(held_out))
    own = [Example(group_of(p), p.hash(), row, float(np.log(s)))
           for p, row, s in zip(programs[45:60], x[45:60], synthetic_seconds[45:60])]
    assert len(own) == MIN_PROBLEM_ROWS and model.add_examples(own) == MIN_PROBLEM_ROWS
    predicted = model.predict(held_out)
    assert model.fitted and not np.array_equal(predicted, Iterations().predict(held_out))
    assert spearman(predicted, synthetic_seconds[60:]) > 0.5


def test_history_replays_stored_traces_and_caches_their_inputs(tmp_path, drawn,
                                                               synthetic_seconds):
    naive, items = drawn
    prior = Iterations()
    path = tmp_path / "h.db"
    with Database(path, machine_fp="machine-a") as db:
        run = db.start_run(workload="matmul", size=SIZE, seed=0, budget={}, rules=[],
                           cost_model="random", machine={}, versions={})
        for (prog, term, sizes), s in list(zip(items, synthetic_seconds))[:5]:
            db.add(Record("matmul", list(SIZE), prog.hash(), "", {}, derive(term, sizes, naive),
                          [s], s, 1.0, True, None, run_id=run))
        db.add(Record("matmul", list(SIZE), "wrong", "", {}, [], [1.0], 1.0, 1.0, False, None,
                      run_id=run))
        db.add(Record("matmul", list(SIZE), items[6][0].hash(), "", {}, [], [1.0], 1.0, 1.0,
                      True, None, run_id=run, machine_fp="machine-b"))
        found, skipped = history(db, prior, HARDWARE)
        assert skipped == 0 and [w for w, _ in found] == ["matmul"] * 5  # this machine, correct
        for (_, example), (prog, _, _), s in zip(found, items, synthetic_seconds):
            assert example.group == group_of(prog) and example.key == prog.hash()
            assert np.array_equal(example.x, inputs([prog], prior, HARDWARE)[0])
            assert example.log_seconds == pytest.approx(np.log(s))
        ids = [r[0] for r in db._conn.execute("SELECT id FROM measurements ORDER BY id")][:5]
        assert len(db.derived(inputs_key(prior, HARDWARE), ids)) == 5
    with Database(path, readonly=True, machine_fp="machine-a") as db:
        again, _ = history(db, prior, HARDWARE)  # from the cache: same inputs
        assert all(np.array_equal(a.x, b.x) for (_, a), (_, b) in zip(found, again))
        model = LearnedModel(prior, min_samples=10)
        assert model.add_history(db) == 5 and not model.fitted


def test_history_skips_a_computation_no_registry_knows(tmp_path, drawn, synthetic_seconds):
    # A model's task is stored under its name and naive hash (explore.computation_key), made at
    # run time by the process that tuned it: no later process can rebuild its naive program.
    naive, items = drawn
    (prog, term, sizes), s = items[0], synthetic_seconds[0]
    with Database(tmp_path / "h.db", machine_fp="machine-a") as db:
        db.add(Record("dense@0123456789abcdef", [], prog.hash(), "", {},
                      derive(term, sizes, naive), [s], s, 1.0, True, None))
        db.add(Record("matmul", list(SIZE), prog.hash(), "", {}, derive(term, sizes, naive),
                      [s], s, 1.0, True, None))
        found, skipped = history(db, Iterations(), HARDWARE)
    assert skipped == 1 and [w for w, _ in found] == ["matmul"]


def test_the_inputs_key_names_the_prior_its_settings_and_the_hardware():
    class Scaled(Iterations):
        def __init__(self, scale):
            self.scale = scale

    key = inputs_key(Scaled(1), HARDWARE)
    assert key == inputs_key(Scaled(1), HARDWARE) != inputs_key(Scaled(2), HARDWARE)
    assert inputs_key(None, HARDWARE) != key
    assert inputs_key(Scaled(1), Hardware.of(AVX512, threads=2)) != key
    assert len(inputs([], None, HARDWARE)[0:0].T) == len(FEATURE_NAMES) + 1


def test_the_features_describe_the_priors_hardware_and_are_saved_with_the_examples(programs):
    model = LearnedModel(Iterations(), min_samples=20)
    assert model.hardware == hardware_of(Iterations()) == HARDWARE
    model.update(programs[:3], [1e-3, 2e-3, 3e-3])
    restored = LearnedModel.from_state(json.loads(json.dumps(model.state())), prior=None)
    assert restored.hardware == HARDWARE


def test_registered_under_its_name_with_options():
    model = get_cost_model("learned", prior=Iterations(), min_samples=30)
    assert isinstance(model, LearnedModel) and model.min_samples == 30


def test_user_errors_are_one_line_cost_model_errors(programs):
    with pytest.raises(CostModelError, match="unknown cost model 'nonesuch'"):
        LearnedModel(prior="nonesuch")
    with pytest.raises(CostModelError, match="its own prior"):
        LearnedModel(prior="learned")
    with pytest.raises(CostModelError, match="min_samples"):
        LearnedModel(Iterations(), min_samples=3)
    model = LearnedModel(Iterations())
    with pytest.raises(CostModelError, match="2 programs but 1 times"):
        model.update(programs[:2], [1e-3])
    with pytest.raises(CostModelError, match="finite and positive"):
        model.update(programs[:1], [0.0])
    with pytest.raises(CostModelError, match="other features"):
        LearnedModel.from_state({"features": ["old"]}, prior=Iterations())
    state = {"features": list(FEATURE_NAMES), "min_samples": 20, "seed": 0,
             "examples": [["g", "k", [1.0], 0.0]]}
    with pytest.raises(CostModelError, match="names no hardware"):
        LearnedModel.from_state(state, prior=Iterations())
    with pytest.raises(CostModelError, match="malformed"):
        LearnedModel.from_state({**state, "hardware": model.state()["hardware"]},
                                prior=Iterations())
