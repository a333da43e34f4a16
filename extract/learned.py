"""A cost model learned from measurements: gradient-boosted trees (LightGBM) that rank programs,
trained on every measurement of this machine (all runs and workloads in the database) plus the
current run's, and used only where a held-out check says they rank better than the prior.

Inputs are `features(prog, hardware)` (on the prior's machine model and threads) and the log
of the prior's prediction (the analytic model by default). The trees are trained with
LightGBM's lambdarank objective, one query group per problem (a workload at one size): only
the order of programs within a problem is learned, since
that is all the search asks and times of different problems differ mostly by their work. The
relevance of a program is its rank within its group, in RELEVANCE_LEVELS quantiles (fastest
highest); every pair of a group counts (no NDCG truncation), so the whole order is learned, with
the fast end weighted most.

Until `min_samples` measurements (MIN_SAMPLES = 64 by default: below it a held-out fifth has
too few programs per problem to tell a fit from noise; in the learning curves of
`eqsched experiment ranking --curves` trees on fewer measurements of a workload ranked its
held-out programs worse than the prior, docs/ARCHITECTURE.md §17.4) the model predicts exactly
the prior. From then on, each refit cross-validates: the rows fall into five folds (by a hash of
each program and the seed), and in turn trees trained on four score the fifth: the mean over
problems of the Spearman correlation of the trees' order with the measured order, against the
prior's on the same programs, averaged over the folds (one held-out fifth of a few dozen
programs let trees that ranked worse through). The trees are used only if they rank better than
the prior by CHECK_MARGIN, and, where the current run's problem has held-out programs, not more
than GLOBAL_SLACK worse on it; they are then refitted on all rows. Otherwise the prior's
predictions stand. Even then the trees rank only problems they were trained on
MIN_PROBLEM_ROWS programs of (enough that every held-out fifth can hold some): the check
never holds out a problem whole, so it says nothing of how the trees rank one they have not
seen, and the prior ranks those (a model's later tasks start so, before their first batch).

Scores become seconds for plots and the search's settle test: within a problem,
log(seconds) = a + b * score, with b fitted over all groups and a anchored so that the problem's
naive program gets the prior's prediction. The order within a problem is the trees' order.

    model = LearnedModel(prior=MyPrior())         # or prior="analytic", a registered name
    model.add_history(database, threads=1)        # this machine's stored measurements
    model.predict(programs)                       # seconds; the prior's while data is scarce
    model.update(measured, seconds)               # the current run's; refits
    model.validation                              # held-out Spearman: {"learned": 0.61,
                                                  #  "prior": 0.48, "groups": 7, ...}
    restored = LearnedModel.from_state(model.state(), prior=MyPrior())

See docs/ARCHITECTURE.md §8 Cost models.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from eqsched.ir import Program, naive_program
from eqsched.machine_model import MachineModel, machine_model
from eqsched.schedule import Schedule, ScheduleError

from . import features as features_module
from .cost import CostModel, CostModelError, get_cost_model, register, spearman
from .features import FEATURE_NAMES, Hardware, features

if TYPE_CHECKING:
    import lightgbm

    from eqsched.db import Database, TrainingRow
    from eqsched.te import Computation

_TINY = 1e-12
MIN_SAMPLES = 64
GLOBAL_SLACK = 0.05  # how much worse than the prior the trees may rank the current problem
RELEVANCE_LEVELS = 16
VALIDATION_FOLDS = 5  # the check's cross-validation: each fifth held out in turn
CHECK_MARGIN = 0.02  # how much better than the prior the trees must rank held-out programs
MIN_GROUP_ROWS = 3  # fewer held-out programs of a problem than this do not rank anything
# The trees rank a problem only once trained on this many of its programs: the check holds out
# programs of problems the trees were trained on, so it says nothing of one they have not seen.
MIN_PROBLEM_ROWS = VALIDATION_FOLDS * MIN_GROUP_ROWS
TREE_PARAMS = {
    "objective": "lambdarank", "label_gain": list(range(RELEVANCE_LEVELS)),
    "num_leaves": 15, "min_data_in_leaf": 5, "learning_rate": 0.1, "lambda_l2": 1.0,
    "feature_fraction": 0.8, "feature_fraction_seed": 1,
    "deterministic": True, "force_row_wise": True, "num_threads": 1, "verbosity": -1,
}
TREE_ROUNDS = 100
_SLOPE_CAP = -1e-3  # scores map to seconds through a strictly decreasing map: order is kept


def _as_prior(prior: CostModel | str | None) -> CostModel | None:
    if prior is None or isinstance(prior, CostModel):
        return prior
    if isinstance(prior, str):
        if prior == LearnedModel.name:
            raise CostModelError("a learned model cannot be its own prior")
        return get_cost_model(prior)
    raise CostModelError(f"prior must be a cost model, a registered name or None, not {prior!r}")


@dataclass(frozen=True)
class Example:
    """One measured program as the model sees it: its problem (`group`, the naive program's
    hash), its stored hash, the model's inputs and log seconds."""

    group: str
    key: str
    x: np.ndarray
    log_seconds: float


# ---- inputs ------------------------------------------------------------------------------------

_naive_of: dict[int, tuple[object, Program, str]] = {}


def group_of(prog: Program) -> str:
    """The problem a program solves: its naive program's hash (one per workload and size)."""
    return _naive_entry(prog)[2]


def _naive(prog: Program) -> Program:
    return _naive_entry(prog)[1]


def _naive_entry(prog: Program) -> tuple[object, Program, str]:
    # The computations of one explore are few and shared by all its programs: keyed by identity
    # (the entry keeps the computation alive, so its id is not reused). The hash is kept too:
    # `predict` asks every ranked program's problem, and printing the naive program to hash it
    # each time was most of that.
    comp = prog.computation
    found = _naive_of.get(id(comp))
    if found is None or found[0] is not comp:
        naive = naive_program(comp)
        found = _naive_of[id(comp)] = (comp, naive, naive.hash())
    return found


def _log_prior(prior: CostModel | None, programs: Sequence[Program]) -> np.ndarray:
    if prior is None:
        return np.zeros(len(programs))
    return np.log(np.clip(np.asarray(prior.predict(programs), dtype=float), _TINY, None))


def hardware_of(prior: CostModel | None) -> Hardware:
    """The hardware a model's programs run on: its prior's machine model and threads (the
    analytic model has them), else the host's, one thread."""
    machine = getattr(prior, "machine", None)
    if isinstance(machine, MachineModel):
        return Hardware.of(machine, getattr(prior, "threads", 1))
    return Hardware.of(machine_model(), 1)


def inputs(programs: Sequence[Program], prior: CostModel | None,
           hardware: Hardware) -> np.ndarray:
    """The model's input rows: features on `hardware`, then the prior's log prediction."""
    rows = np.array([features(p, hardware) for p in programs]).reshape(len(programs),
                                                                       len(FEATURE_NAMES))
    return np.column_stack([rows, _log_prior(prior, programs)])


def inputs_key(prior: CostModel | None, hardware: Hardware) -> str:
    """Names how `inputs` are computed, for the database's cache of them: the feature names, the
    source of the features module, the hardware, the source of the prior's module and the
    prior's settings. Any change to them computes the inputs afresh."""
    parts = [list(FEATURE_NAMES), inspect.getsource(features_module), repr(hardware)]
    if prior is not None:
        settings = {k: repr(v) for k, v in sorted(vars(prior).items()) if not k.startswith("_")}
        parts += [type(prior).__qualname__, inspect.getsource(sys.modules[type(prior).__module__]),
                  settings]
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]
    return f"learned-inputs/{digest}"


def history(db: Database, prior: CostModel | None, hardware: Hardware, *,
            threads: int | None = None,
            machine_key: str | None = None, workloads: Sequence[str] | None = None,
            target: str = "host", rows: Sequence[TrainingRow] | None = None,
            computations: Mapping[str, Computation] | None = None
            ) -> tuple[list[tuple[str, Example]], int]:
    """Examples of every stored measurement `training_rows` selects (or of `rows`, read from
    `db` already), each with its workload
    name, and how many could not be replayed (traces of an older schedule format, or of a
    computation that is neither a registered workload nor in `computations`, by the workload
    name it is stored under: a model's tasks are made at run time, and only their tuner knows
    them, `explore.computation_key`). Inputs are
    cached in the database (when it is writable): replaying a trace and computing features and
    the prior costs about 25 ms a measurement."""
    from eqsched.db import training_rows
    from eqsched.te import WorkloadError
    from eqsched.workloads import get_workload

    if rows is None:
        rows = training_rows(db, machine_key, threads=threads, workloads=workloads,
                             target=target)
    key = inputs_key(prior, hardware)
    cached = db.derived(key, [r.id for r in rows])
    naive: dict[str, Program] = {}
    known = computations or {}
    fresh: dict[int, list[float]] = {}
    out: list[tuple[str, Example]] = []
    skipped = 0
    for row in rows:
        if row.key not in naive:
            if row.workload in known and not row.size:
                naive[row.key] = naive_program(known[row.workload])
            else:
                try:
                    workload = get_workload(row.workload)
                except WorkloadError:  # a task's computation that no caller named
                    skipped += 1
                    continue
                naive[row.key] = naive_program(workload.build(*row.size))
        x = cached.get(row.id)
        if x is None or len(x) != len(FEATURE_NAMES) + 1:
            try:
                prog = Schedule.replay(naive[row.key], row.trace, checked=False).program
            except (ScheduleError, KeyError, TypeError, ValueError):
                skipped += 1
                continue
            x = fresh[row.id] = inputs([prog], prior, hardware)[0].tolist()
        out.append((row.workload, Example(naive[row.key].hash(), row.program_hash,
                                          np.asarray(x, dtype=float), float(np.log(row.median_s)))))
    if fresh and not db.readonly:
        db.store_derived(key, fresh)
    return out, skipped


# ---- the trees ---------------------------------------------------------------------------------


def relevance(log_seconds: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per row, its speed rank within its group in RELEVANCE_LEVELS quantiles: the fastest
    programs of a group get RELEVANCE_LEVELS - 1, the slowest 0."""
    out = np.zeros(len(log_seconds), dtype=int)
    for g in np.unique(groups):
        at = np.flatnonzero(groups == g)
        order = np.argsort(log_seconds[at], kind="stable")
        rank = np.empty(len(at))
        rank[order] = np.arange(len(at)) / len(at)  # 0: fastest
        out[at] = np.minimum(((1.0 - rank) * RELEVANCE_LEVELS).astype(int), RELEVANCE_LEVELS - 1)
    return out


def train_trees(x: np.ndarray, log_seconds: np.ndarray, groups: np.ndarray,
                seed: int) -> lightgbm.Booster | None:
    """A lambdarank booster (higher score: faster), None when no group has two programs."""
    # Imported here, not with the package: with scipy behind it, it is a large share of the
    # CLI's start-up, which every command paid though only training needs it.
    import lightgbm
    order = np.argsort(groups, kind="stable")  # LightGBM wants each group's rows together
    x, log_seconds, groups = x[order], log_seconds[order], groups[order]
    _, sizes = np.unique(groups, return_counts=True)
    if not np.any(sizes > 1):
        return None
    params = {**TREE_PARAMS, "seed": seed, "lambdarank_truncation_level": int(sizes.max())}
    data = lightgbm.Dataset(x, relevance(log_seconds, groups), group=_runs(groups),
                            feature_name=[*FEATURE_NAMES, "log_prior"],
                            params={"verbosity": -1, "min_data_in_bin": 1})
    return lightgbm.train(params, data, num_boost_round=TREE_ROUNDS)


def _runs(sorted_groups: np.ndarray) -> list[int]:
    """Lengths of the runs of equal values, in order."""
    change = np.flatnonzero(sorted_groups[1:] != sorted_groups[:-1]) + 1
    return np.diff(np.concatenate([[0], change, [len(sorted_groups)]])).tolist()


def mean_group_spearman(predicted: np.ndarray, measured: np.ndarray,
                        groups: np.ndarray) -> tuple[float | None, int]:
    """The mean over groups (with at least MIN_GROUP_ROWS rows) of Spearman's correlation of
    predicted with measured values, and how many groups it averages (ties rank nothing: 0)."""
    values = []
    for g in np.unique(groups):
        at = groups == g
        if at.sum() >= MIN_GROUP_ROWS:
            values.append(spearman(predicted[at], measured[at]) or 0.0)
    return (float(np.mean(values)) if values else None), len(values)


def _fold(key: str, group: str, seed: int) -> int:
    digest = hashlib.sha256(f"{seed}/{group}/{key}".encode()).digest()
    return digest[0] % VALIDATION_FOLDS


def _mean_of_known(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


@register
class LearnedModel(CostModel):
    """Ranking trees over program features and the prior's log prediction, trained on stored
    and current measurements; the prior wherever they do not rank held-out programs better
    (the module docstring has the check). `validation` holds the last refit's held-out mean
    Spearman of the trees and of the prior, over all problems and over the current run's."""

    name = "learned"

    def __init__(self, prior: CostModel | str | None = "analytic",
                 min_samples: int = MIN_SAMPLES, seed: int = 0,
                 hardware: Hardware | None = None):
        if min_samples < 2 * VALIDATION_FOLDS:
            raise CostModelError(f"min_samples must be at least {2 * VALIDATION_FOLDS}, "
                                 f"got {min_samples}")
        self.prior = _as_prior(prior)
        self._hardware = hardware
        self.min_samples = min_samples
        self.seed = seed
        self._examples: dict[tuple[str, str], Example] = {}  # (group, key) -> the latest
        self._current: set[str] = set()  # groups of the programs given to `update`
        self._trees: lightgbm.Booster | None = None
        self._trained: Counter[str] = Counter()  # problem -> programs the trees learned from
        self._slope = _SLOPE_CAP
        self._anchors: dict[str, float] = {}
        self._validation: dict[str, float | int | None] = {}
        self._stale = False  # examples changed since the last fit: refit before the next use

    @property
    def hardware(self) -> Hardware:
        """What the features describe: given, else the prior's (found when first needed: a
        model given only computed inputs never calibrates a machine)."""
        if self._hardware is None:
            self._hardware = hardware_of(self.prior)
        return self._hardware

    @property
    def samples(self) -> int:
        """How many distinct measured programs the model has (stored and current)."""
        return len(self._examples)

    @property
    def fitted(self) -> bool:
        """Whether the trees are used: for the problems they were trained on MIN_PROBLEM_ROWS
        programs of (the prior predicts the others, and every problem when this is False)."""
        self._refresh()
        return self._trees is not None

    @property
    def validation(self) -> dict[str, float | int | None]:
        """The last fit's check: held-out mean Spearman of the trees ("learned") and of the prior
        ("prior") over all problems ("groups" of them, "held_out" programs) and over the
        current run's ("learned_current", "prior_current": None without held-out programs);
        empty below min_samples."""
        self._refresh()
        return dict(self._validation)

    def predict(self, programs: Sequence[Program]) -> np.ndarray:
        self._refresh()
        if self._trees is None:
            if self.prior is None:
                return np.ones(len(programs))
            return np.asarray(self.prior.predict(programs), dtype=float)
        learned = (np.ones(len(programs), dtype=bool) if self.prior is None
                   else self._learned([group_of(p) for p in programs]))
        out = np.empty(len(programs))
        if not learned.all():
            out[~learned] = self.prior.predict([p for p, t in zip(programs, learned) if not t])
        if learned.any():
            chosen = [p for p, t in zip(programs, learned) if t]
            scores = self._trees.predict(inputs(chosen, self.prior, self.hardware))
            anchors = np.array([self._anchor(p) for p in chosen])
            out[learned] = np.exp(anchors + self._slope * scores)
        return out

    def rank_keys(self, x: np.ndarray, groups: Sequence[str] | None = None) -> np.ndarray:
        """A ranking key of `inputs` rows, lower is faster, comparable within one problem: the
        trees' negated score, or the prior's log prediction where the trees are not used (and,
        given each row's problem in `groups`, for problems the trees saw too few of)."""
        x = np.asarray(x, dtype=float).reshape(-1, len(FEATURE_NAMES) + 1)
        self._refresh()
        if self._trees is None:
            return x[:, -1].copy()
        keys = -self._trees.predict(x)
        if groups is not None:
            learned = self._learned(list(groups))
            keys[~learned] = x[~learned, -1]
        return keys

    def _learned(self, groups: list[str]) -> np.ndarray:
        """Per problem, whether the trees (in use) rank it: they were trained on
        MIN_PROBLEM_ROWS of its programs (`predict` without a prior uses them for all)."""
        return np.array([self._trained[g] >= MIN_PROBLEM_ROWS for g in groups], dtype=bool)

    def _anchor(self, prog: Program) -> float:
        # a in log(seconds) = a + b * score: the naive program gets the prior's prediction.
        group = group_of(prog)
        if group not in self._anchors:
            naive = _naive(prog)
            score = self._trees.predict(inputs([naive], self.prior, self.hardware))[0]
            self._anchors[group] = float(_log_prior(self.prior, [naive])[0]
                                         - self._slope * score)
        return self._anchors[group]

    def update(self, programs: Sequence[Program], seconds: Sequence[float]) -> None:
        seconds = np.asarray(seconds, dtype=float)
        if len(programs) != len(seconds):
            raise CostModelError(f"{len(programs)} programs but {len(seconds)} times")
        if not np.all(np.isfinite(seconds) & (seconds > 0)):
            raise CostModelError("measured times must be finite and positive (filter errors out)")
        if not len(programs):
            return
        x = inputs(programs, self.prior, self.hardware)
        for prog, row, s in zip(programs, x, seconds):
            group = group_of(prog)
            self._current.add(group)
            self._examples[(group, prog.hash())] = Example(group, prog.hash(), row,
                                                           float(np.log(s)))
        self._stale = True

    def add_history(self, db: Database, threads: int | None = None, target: str = "host",
                    rows: Sequence[TrainingRow] | None = None,
                    computations: Mapping[str, Computation] | None = None) -> int:
        """Learn from this machine's stored measurements in `db` for `target` (a `Target.spec`;
        those of parallel programs timed with `threads` threads, if given), or from `rows` of
        them already read (`db.training_rows`); returns how many it added. Measurements of a
        computation that is no registered workload (a model's task) count when `computations`
        has it under the workload name it is stored under."""
        found, _ = history(db, self.prior, self.hardware, threads=threads, target=target,
                           rows=rows, computations=computations)
        return self.add_examples([example for _, example in found])

    def add_examples(self, examples: Sequence[Example], *, current: bool = False) -> int:
        """Learn from measured programs given as inputs (computed with this model's prior): other
        runs' by default, where a program the model already has keeps its time; `current`: the
        run's own (their problems are the ones the check guards, as for `update`). Returns how
        many programs are new."""
        before = self.samples
        for e in examples:
            if len(e.x) != len(FEATURE_NAMES) + 1:
                raise CostModelError(f"example {e.key} has {len(e.x)} inputs, expected "
                                     f"{len(FEATURE_NAMES) + 1}")
            if current:
                self._current.add(e.group)
                self._examples[(e.group, e.key)] = e
            else:
                self._examples.setdefault((e.group, e.key), e)
        self._stale = True
        return self.samples - before

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        examples = list(self._examples.values())
        x = np.array([e.x for e in examples]).reshape(len(examples), len(FEATURE_NAMES) + 1)
        return (x, np.array([e.log_seconds for e in examples]),
                np.array([e.group for e in examples]), [e.key for e in examples])

    def _refresh(self) -> None:
        if self._stale:
            self._stale = False
            self._refit()

    def _refit(self) -> None:
        self._trees, self._anchors, self._validation = None, {}, {}
        self._trained = Counter()
        if self.samples < self.min_samples:
            return
        x, y, groups, keys = self._arrays()
        folds = np.array([_fold(k, g, self.seed) for k, g in zip(keys, groups)])
        mine = np.isin(groups, sorted(self._current))
        checks = []  # per fold: (learned, prior) over all problems, then over the current run's
        for fold in range(VALIDATION_FOLDS):
            held = folds == fold
            trial = train_trees(x[~held], y[~held], groups[~held], self.seed) \
                if held.any() else None
            if trial is None:
                continue
            score, prior = -trial.predict(x[held]), x[held, -1]  # lower is faster
            now = mine[held]
            checks.append([mean_group_spearman(score, y[held], groups[held])[0],
                           mean_group_spearman(prior, y[held], groups[held])[0],
                           mean_group_spearman(score[now], y[held][now], groups[held][now])[0],
                           mean_group_spearman(prior[now], y[held][now], groups[held][now])[0]])
        learned, prior_rho, learned_now, prior_now = (_mean_of_known(c) for c in zip(*checks)) \
            if checks else (None, None, None, None)
        self._validation = {"learned": learned, "prior": prior_rho, "folds": len(checks),
                            "groups": len(set(groups.tolist())), "held_out": len(keys),
                            "learned_current": learned_now, "prior_current": prior_now}
        if learned is None or prior_rho is None or learned <= prior_rho + CHECK_MARGIN:
            return
        if learned_now is not None and learned_now < prior_now - GLOBAL_SLACK:
            return
        self._trees = train_trees(x, y, groups, self.seed)
        self._trained = Counter(groups.tolist())
        self._slope = _within_group_slope(self._trees.predict(x), y, groups)

    # ---- persistence ----------------------------------------------------------------------

    def state(self) -> dict:
        """JSON-able: the settings and the examples (the trees are retrained on load)."""
        return {"min_samples": self.min_samples, "seed": self.seed,
                "features": list(FEATURE_NAMES), "hardware": dataclasses.asdict(self.hardware),
                "current": sorted(self._current),
                "examples": [[e.group, e.key, e.x.tolist(), e.log_seconds]
                             for e in self._examples.values()]}

    @classmethod
    def from_state(cls, state: dict, prior: CostModel | str | None = "analytic") -> LearnedModel:
        """A model trained on the examples in `state`; its prior is not stored and is given
        again (it must be the same prior: the stored inputs include its log predictions)."""
        if state.get("features") != list(FEATURE_NAMES):
            raise CostModelError("the saved learned model was trained on other features")
        try:
            hardware = Hardware(**{**state["hardware"],
                                   "caches": tuple(state["hardware"]["caches"])})
        except (KeyError, TypeError):
            raise CostModelError("the saved learned model names no hardware") from None
        model = cls(prior, state["min_samples"], state["seed"], hardware)
        try:
            for group, key, x, log_seconds in state["examples"]:
                e = Example(str(group), str(key), np.asarray(x, dtype=float), float(log_seconds))
                if len(e.x) != len(FEATURE_NAMES) + 1 or not (
                        np.all(np.isfinite(e.x)) and np.isfinite(e.log_seconds)):
                    raise ValueError
                model._examples[(e.group, e.key)] = e
        except (TypeError, ValueError):
            raise CostModelError("the saved learned model's data is malformed") from None
        model._current = set(map(str, state.get("current", [])))
        model._stale = True
        return model


def _within_group_slope(score: np.ndarray, log_seconds: np.ndarray, groups: np.ndarray) -> float:
    """b of log(seconds) = a_group + b * score by least squares, capped below zero (a higher
    score is a faster program)."""
    s, y = score.astype(float).copy(), log_seconds.astype(float).copy()
    for g in np.unique(groups):
        at = groups == g
        s[at] -= s[at].mean()
        y[at] -= y[at].mean()
    denominator = float(s @ s)
    return min(float(s @ y) / denominator, _SLOPE_CAP) if denominator > _TINY else _SLOPE_CAP
