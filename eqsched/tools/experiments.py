"""Space experiments: compare two rule sets' spaces, measure a uniform sample of one, and rate how
well cost models rank it.

    from eqsched.tools.experiments import compare_spaces, measure_distribution, rank_quality

    cmp = compare_spaces("matmul", (256, 256, 256), None, "-pack", samples=200)
    print(cmp.text())                  # sizes of both spaces, overlap both ways with 95% intervals
    dist = measure_distribution("matmul", (64, 64, 64), samples=32, db="eqsched.db")
    print(dist.histogram())            # GFLOPS of uniformly drawn programs, log-spaced bins
    rank_quality(dist, models=("analytic", "random"))["analytic"]["spearman"]

    eqsched experiment compare matmul --rules-a default --rules-b=-pack --samples 200
    eqsched experiment distribution matmul --size 64,64,64 --samples 32 --db eqsched.db
    eqsched experiment ranking matmul --size 64,64,64 --db eqsched.db --models analytic,random

Membership of a uniform sample of A in B estimates |A∩B| / |A|, not |A∩B| / |A∪B|: the
comparison reports it both ways, with Wilson intervals and the implied |A∩B|. Both spaces are
built from the same naive program, so they share its analysis facts (dimension groups) and a term
of one is tested in the other directly.

A distribution draws programs uniformly from the space but keeps only those the search would
measure (at most MAX_UNROLLED unrolled copies; more take LLVM minutes to compile): it is uniform
over that part of the space, and says how many draws it skipped. Measurements go to the results
database like explore's, keyed the same way, so a rerun measures nothing new.
"""

from __future__ import annotations

import copy
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..db import Database, Record
from ..egraph.derive import DeriveError, derive, realize
from ..egraph.saturate import Limits, saturate
from ..egraph.space import Space
from ..egraph.term import show
from ..extract import cost_model_for
from ..ir import Program, naive_program
from ..runner import Measurement, measure
from ..schedule import ScheduleError
from ..trials import Settings, measurement_key
from ..workloads import get_workload

Z95 = 1.959964  # two-sided 95% normal quantile
TOP_FRACTION = 0.1  # rank_quality's top-k: the fastest tenth


# ---- comparing two spaces --------------------------------------------------------------------


def wilson(found: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion found/n (sound near 0 and 1, unlike p ± z·se)."""
    if n == 0:
        return 0.0, 1.0
    p = found / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At 0 and n the bound is exactly 0 or 1; the formula lands a rounding error away.
    return (0.0 if found == 0 else centre - half), (1.0 if found == n else centre + half)


@dataclass
class SpaceStats:
    label: str  # the rule spec as given ("default" for the default set)
    rules: list[str]
    stop_reason: str
    enodes: int
    eclasses: int
    programs: int
    saturation_s: float


@dataclass
class Membership:
    """Programs of one space tested in the other: estimates |mine ∩ other| / |mine|."""

    tested: int
    found: int
    exact: bool  # every program was tested (the space is no larger than the sample)
    fraction: float | None
    low: float | None  # 95% Wilson interval (equal to fraction when exact)
    high: float | None
    intersection: float | None  # the implied |A∩B|: fraction x |mine|, at most min(|A|, |B|)
    intersection_low: float | None
    intersection_high: float | None


@dataclass
class SpaceComparison:
    workload: str
    size: list[int]
    a: SpaceStats
    b: SpaceStats
    a_in_b: Membership
    b_in_a: Membership
    statements: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        rows = [("", f"A: {self.a.label}", f"B: {self.b.label}")]
        for name in ("stop_reason", "enodes", "eclasses", "programs", "saturation_s"):
            va, vb = getattr(self.a, name), getattr(self.b, name)
            rows.append((name.replace("_", " "), _cell(va), _cell(vb)))
        width = [max(len(r[c]) for r in rows) for c in range(3)]
        lines = [f"{self.workload} {','.join(map(str, self.size))}: space A vs space B"]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, width)).rstrip()
                  for r in rows]
        only_a = [r for r in self.a.rules if r not in self.b.rules]
        only_b = [r for r in self.b.rules if r not in self.a.rules]
        lines.append(f"rules only in A: {', '.join(only_a) or 'none'}; only in B: "
                     f"{', '.join(only_b) or 'none'}")
        for name, m in (("A in B", self.a_in_b), ("B in A", self.b_in_a)):
            if m.fraction is None:
                lines.append(f"{name}: nothing to test (empty space)")
                continue
            how = "all programs" if m.exact else "uniform sample"
            lines.append(f"{name}: {m.found}/{m.tested} ({how}) = {m.fraction:.1%}, 95% "
                         f"[{m.low:.1%}, {m.high:.1%}] -> |A∩B| ~ {m.intersection:.3g} "
                         f"[{m.intersection_low:.3g}, {m.intersection_high:.3g}]")
        lines += [f"- {s}" for s in self.statements]
        return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, int) and value >= 10**6:
        return f"{value} ({value:.3g})"
    return str(value)


def compare_spaces(workload: str, size: Sequence[int] | None, rules_a: Any, rules_b: Any,
                   samples: int = 200, seed: int = 0, limits: Limits | None = None
                   ) -> SpaceComparison:
    """Saturate `workload` at `size` (default: its default) with two rule specs (None: the
    default set) and compare the spaces: sizes, and membership of uniform samples both ways."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    wl = get_workload(workload)
    size = wl.check_size(tuple(size)) if size is not None else wl.default_size
    naive = naive_program(wl.build(*size))
    space_a, stats_a = _space(naive, rules_a, limits)
    space_b, stats_b = _space(naive, rules_b, limits)
    a_in_b = _membership(space_a, space_b, samples, seed)
    b_in_a = _membership(space_b, space_a, samples, seed)
    return SpaceComparison(wl.name, list(size), stats_a, stats_b, a_in_b, b_in_a,
                           _statements(stats_a, stats_b, a_in_b, b_in_a))


def _space(naive: Program, rules: Any, limits: Limits | None) -> tuple[Space, SpaceStats]:
    from ..rules import resolve

    sat = saturate(naive, resolve(rules), limits)
    space = Space(sat)
    rep = sat.report
    label = "default" if rules is None else rules if isinstance(rules, str) else ",".join(
        getattr(r, "name", str(r)) for r in rules)
    return space, SpaceStats(label, rep.rules, rep.stop_reason, rep.enodes, rep.eclasses,
                             space.count(), rep.seconds)


def _membership(mine: Space, other: Space, samples: int, seed: int) -> Membership:
    total = mine.count()
    # |A∩B| <= min(|A|, |B|) exactly; a sampled fraction times |A| can overshoot |B|.
    cap = min(total, other.count())
    if total == 0:
        return Membership(0, 0, True, None, None, None, 0, 0, 0)
    # A space no larger than the sample is tested whole: an exact answer, not an estimate.
    exact = total <= samples
    programs = mine.enumerate(total) if exact else mine.sample(samples, seed)
    found = sum(other.contains(term, sizes) for term, sizes in programs)
    fraction = found / len(programs)
    low, high = (fraction, fraction) if exact else wilson(found, len(programs))
    return Membership(len(programs), found, exact, fraction, low, high,
                      min(fraction * total, cap), min(low * total, cap), min(high * total, cap))


def _statements(a: SpaceStats, b: SpaceStats, a_in_b: Membership, b_in_a: Membership
                ) -> list[str]:
    out = []
    for me, other, m, name, other_name in ((a, b, a_in_b, "A", "B"), (b, a, b_in_a, "B", "A")):
        if me.programs == 0:
            out.append(f"{name} is empty (0 programs): {name} ⊆ {other_name} holds exactly")
        elif m.exact:
            verdict = "⊆" if m.found == m.tested else "⊄"
            out.append(f"{name} {verdict} {other_name} exactly: {m.found} of {name}'s "
                       f"{me.programs} programs are in {other_name}")
        elif me.programs > other.programs:
            out.append(f"{name} ⊄ {other_name} exactly: {name} has more programs "
                       f"({me.programs:.3g} > {other.programs:.3g})")
        elif m.found == m.tested:
            out.append(f"every sampled program of {name} is in {other_name}: consistent with "
                       f"{name} ⊆ {other_name} (at 95%, at least {m.low:.1%} of {name} is in "
                       f"{other_name}; sampling cannot prove inclusion)")
        elif m.found == 0:
            out.append(f"no sampled program of {name} is in {other_name}: at 95%, under "
                       f"{m.high:.1%} of {name} is in {other_name}")
    return out


# ---- the measured distribution of a space ----------------------------------------------------


@dataclass
class Sample:
    """One drawn program and its measurement (stored or made now)."""

    program_hash: str  # the measurement key (hash, plus threads for parallel programs)
    structure: str
    median_s: float | None
    gflops: float | None
    correct: bool | None
    error: str | None
    cached: bool  # found in the database (or drawn twice): not measured again
    program: Program = field(repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "program"}


Progress = Callable[[int, int, Sample], None]


@dataclass
class Distribution:
    workload: str
    size: list[int]
    rules: list[str]
    seed: int
    settings: Settings
    space_programs: int
    samples: list[Sample]
    drawn: int  # uniform draws, kept or skipped
    skipped_unrolled: int  # over MAX_UNROLLED unrolled copies, as the search skips them
    unbuildable: int  # terms the schedule primitives cannot build

    @property
    def gflops(self) -> list[float]:
        """GFLOPS of the correct samples, in draw order."""
        return [s.gflops for s in self.samples if s.correct and s.gflops]

    @property
    def errors(self) -> list[tuple[str, str]]:
        """(key, error) of the samples that failed or computed a wrong result."""
        return [(s.program_hash, s.error or "wrong result") for s in self.samples
                if not s.correct]

    @property
    def correct_fraction(self) -> float:
        return sum(bool(s.correct) for s in self.samples) / len(self.samples) \
            if self.samples else 0.0

    @property
    def measured(self) -> int:
        """Samples measured by this call (not found in the database)."""
        return sum(not s.cached for s in self.samples)

    @property
    def best(self) -> Sample | None:
        good = [s for s in self.samples if s.correct and s.gflops]
        return max(good, key=lambda s: s.gflops) if good else None

    def percentiles(self) -> dict[str, float]:
        values = self.gflops
        if not values:
            return {}
        points = (0, 10, 25, 50, 75, 90, 100)
        return {f"p{q}": float(v) for q, v in zip(points, np.percentile(values, points))}

    def _bins(self, bins: int) -> tuple[np.ndarray, np.ndarray]:
        values = np.asarray(self.gflops)
        low, high = values.min(), values.max()
        # Speeds span decades: equal ratios per bin, one bin when every value is the same.
        edges = np.geomspace(low, high, bins + 1) if high > low else np.array([low, high])
        counts, _ = np.histogram(values, edges)
        return edges, counts

    def histogram(self, bins: int = 12) -> str:
        """One line per log-spaced GFLOPS bin: range, count and a bar (counts sum to the number
        of correct samples); "" when none is correct."""
        if not self.gflops:
            return ""
        edges, counts = self._bins(bins)
        scale = 40 / max(counts.max(), 1)
        return "\n".join(f"{lo:9.3g} - {hi:<9.3g} GFLOPS {n:5d} {'#' * round(n * scale)}".rstrip()
                         for lo, hi, n in zip(edges, edges[1:], counts))

    def plot(self, path: str | Path, bins: int = 12) -> Path:
        """A PNG histogram (needs matplotlib: pip install 'eqsched[report]')."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        if not self.gflops:
            raise ValueError("no correct sample to plot")
        edges, _ = self._bins(bins)
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.hist(self.gflops, bins=edges, color="tab:blue", edgecolor="white")
        ax.set_xscale("log")
        ax.set_xlabel("GFLOPS (log scale)")
        ax.set_ylabel("programs")
        ax.set_title(f"{self.workload} {'x'.join(map(str, self.size))}: {len(self.gflops)} "
                     f"uniformly drawn programs")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return Path(path)

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {
            "workload": self.workload, "size": self.size, "rules": self.rules, "seed": self.seed,
            "settings": asdict(self.settings), "space_programs": self.space_programs,
            "drawn": self.drawn, "skipped_unrolled": self.skipped_unrolled,
            "unbuildable": self.unbuildable, "count": len(self.samples),
            "measured": self.measured, "correct_fraction": self.correct_fraction,
            "gflops": self.gflops, "percentiles": self.percentiles(),
            "best": best.to_json() if best else None,
            "errors": [{"key": k, "error": e} for k, e in self.errors],
            "samples": [s.to_json() for s in self.samples],
        }


def measure_distribution(workload: str, size: Sequence[int] | None = None, rules: Any = None,
                         samples: int = 64, seed: int = 0, db: str | Path | Database | None = None,
                         settings: Settings | None = None, limits: Limits | None = None,
                         max_draws: int | None = None, progress: Progress | None = None
                         ) -> Distribution:
    """Draw `samples` programs uniformly from the space (skipping over-unrolled ones, at most
    `max_draws` draws, default 50 per sample), measure each against numpy and return the GFLOPS
    distribution. With `db`, stored measurements are used and new ones stored at once (so an
    interrupted call keeps them). `settings` default to Settings(threads=1): one-core numbers."""
    from ..extract.search import MAX_UNROLLED, unrolled_copies
    from ..rules import resolve

    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    wl = get_workload(workload)
    size = wl.check_size(tuple(size)) if size is not None else wl.default_size
    settings = settings or Settings(threads=1)
    naive = naive_program(wl.build(*size))
    sat = saturate(naive, resolve(rules), limits)
    space = Space(sat)
    total = space.count()
    dist = Distribution(wl.name, list(size), sat.report.rules, seed, settings, total, [], 0, 0, 0)
    chosen = []
    rng = random.Random(seed)
    max_draws = max_draws if max_draws is not None else 50 * samples
    while total and len(chosen) < samples and dist.drawn < max_draws:
        term, sizes = space.program(rng.randrange(total))
        dist.drawn += 1
        try:
            prog = realize(term, sizes, naive)
        except (DeriveError, ScheduleError):
            dist.unbuildable += 1
            continue
        if unrolled_copies(prog) > MAX_UNROLLED:
            dist.skipped_unrolled += 1
            continue
        chosen.append((term, sizes, prog))
    database = Database(db) if isinstance(db, (str, Path)) else db
    seen: dict[str, Sample] = {}
    try:
        for i, (term, sizes, prog) in enumerate(chosen):
            key = measurement_key(prog, settings)
            if key in seen:
                sample = replace(seen[key], cached=True)
            else:
                sample = _sample(wl.name, list(size), term, sizes, prog, naive, key, settings,
                                 database)
                seen[key] = sample
            dist.samples.append(sample)
            if progress:
                progress(i + 1, len(chosen), sample)
    finally:
        if database is not None and database is not db:
            database.close()
    return dist


def _sample(workload: str, size: list[int], term: Any, sizes: Any, prog: Program, naive: Program,
            key: str, settings: Settings, database: Database | None) -> Sample:
    stored = database.lookup(workload, size, key) if database is not None else None
    if stored is not None:
        return Sample(key, stored.structure, stored.median_s, stored.gflops, stored.correct,
                      stored.error, True, prog)
    try:
        trace = derive(term, sizes, naive)
    except DeriveError as err:
        # Only replayable programs are reported, as in explore; this one is an error.
        trace, m = [], Measurement(correct=None, error=f"no replayable trace: {err}")
    else:
        m = measure(prog, repeats=settings.repeats, warmup=settings.warmup,
                    timeout_s=settings.timeout_s, seed=settings.input_seed,
                    time_budget_s=settings.time_budget_s, min_repeats=settings.min_repeats,
                    options=settings.options())
    record = Record(
        workload=workload, size=size, program_hash=key, structure=show(term),
        sizes={f"{g}|{p}": e for (g, p), e in sizes.items()}, trace=trace, times=m.times,
        median_s=m.median_s, gflops=m.gflops, correct=m.correct,
        error=m.error or (None if m.correct is not False else f"wrong result: {m.check_message}"))
    if database is not None:
        database.add(record)
    return Sample(key, record.structure, m.median_s, m.gflops, m.correct, record.error, False,
                  prog)


# ---- how well cost models rank a space -------------------------------------------------------


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


# ---- eqsched experiment ----------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    exp = sub.add_parser("experiment", help="space experiments: compare rule sets' spaces, "
                                            "measure a uniform sample, rate cost models")
    inner = exp.add_subparsers(dest="experiment", required=True)

    def common(p: Any) -> None:
        p.add_argument("workload", help="a name from `eqsched workloads`")
        p.add_argument("--size", help="comma-separated sizes (default: the workload's default)")
        p.add_argument("--seed", type=int, default=0, help="seed of the uniform draws")
        p.add_argument("--limits", help="saturation limits, like iterations=20,seconds=10")
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    cmp = inner.add_parser("compare", help="two rule sets' spaces: sizes and overlap")
    common(cmp)
    cmp.add_argument("--rules-a", default="default",
                     help="rule names or +name/-name edits of the default set; write edits as "
                          "--rules-a=-pack (default: the default set)")
    cmp.add_argument("--rules-b", default="default", help="as --rules-a")
    cmp.add_argument("--samples", type=int, default=200, help="draws per side (default 200)")
    cmp.set_defaults(run=_cmd_compare)

    for name, helptext, run in (
            ("distribution", "measure uniformly drawn programs: GFLOPS histogram", _cmd_dist),
            ("ranking", "measure (or reuse) a uniform sample and rate cost models on it",
             _cmd_ranking)):
        p = inner.add_parser(name, help=helptext)
        common(p)
        p.add_argument("--rules", default="default",
                       help="rule names or +name/-name edits (write --rules=-pack)")
        p.add_argument("--samples", type=int, default=64, help="programs to measure (default 64)")
        p.add_argument("--db", help="results database: stored measurements are reused and new "
                                    "ones kept (default: none)")
        p.add_argument("--threads", type=int, default=1, help="threads for parallel loops "
                                                               "(default 1)")
        p.add_argument("--repeats", type=int, default=10, help="timed runs each (default 10)")
        if name == "distribution":
            p.add_argument("--bins", type=int, default=12, help="histogram bins (default 12)")
            p.add_argument("--plot", metavar="HIST.png", help="also write a PNG histogram "
                                                              "(needs matplotlib)")
        else:
            p.add_argument("--models", default="analytic,random,learned",
                           help="comma-separated cost models (default analytic,random,learned)")
            p.add_argument("--folds", type=int, default=5, help="cross-validation folds")
        p.set_defaults(run=run)


def _problem(args: Any) -> tuple[str, tuple[int, ...], Limits]:
    from ..args import parse_limits, parse_size

    wl = get_workload(args.workload)
    size = parse_size(args.size, wl) if args.size is not None else wl.default_size
    return wl.name, size, parse_limits(args.limits)


def _rules(spec: str) -> Any:
    """A CLI rule spec, checked now so a typo fails before any saturation."""
    from ..args import CliError
    from ..rules import RuleError, resolve

    if spec == "default":
        return None
    try:
        resolve(spec)
    except RuleError as err:
        raise CliError(str(err)) from None
    return spec


def _at_least_one(args: Any, *names: str) -> None:
    from ..args import CliError

    for name in names:
        if getattr(args, name) < 1:
            raise CliError(f"--{name} must be >= 1, got {getattr(args, name)}")


def _cmd_compare(args: Any) -> int:
    import json

    _at_least_one(args, "samples")
    workload, size, limits = _problem(args)
    result = compare_spaces(workload, size, _rules(args.rules_a), _rules(args.rules_b),
                            samples=args.samples, seed=args.seed, limits=limits)
    print(json.dumps(result.to_json()) if args.json else result.text())
    return 0


def _stderr_progress(i: int, n: int, s: Sample) -> None:
    what = f"{s.gflops:.3g} GFLOPS" if s.correct and s.gflops else (s.error or "wrong result")
    print(f"eqsched: [{i}/{n}] {what}{' (stored)' if s.cached else ''}", file=sys.stderr,
          flush=True)


def _distribution(args: Any) -> Distribution:
    from ..args import CliError
    from ..db import DatabaseError

    _at_least_one(args, "samples", "threads", "repeats")
    workload, size, limits = _problem(args)
    rules = _rules(args.rules)
    print(f"eqsched: drawing {args.samples} programs of {workload} "
          f"{','.join(map(str, size))} ...", file=sys.stderr)
    try:
        return measure_distribution(workload, size, rules, samples=args.samples, seed=args.seed,
                                    db=args.db, limits=limits, progress=_stderr_progress,
                                    settings=Settings(repeats=args.repeats, threads=args.threads))
    except DatabaseError as err:
        raise CliError(str(err)) from None
    except KeyboardInterrupt:
        if args.db:
            print(f"\neqsched: what was measured is in {args.db}; the same command resumes",
                  file=sys.stderr)
        raise


def _cmd_dist(args: Any) -> int:
    import json

    from ..args import CliError

    _at_least_one(args, "bins")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError("--plot needs matplotlib: pip install 'eqsched[report]'") from None
    dist = _distribution(args)
    if args.plot and dist.gflops:
        dist.plot(args.plot, bins=args.bins)
    out = dist.to_json()
    if args.json:
        out["histogram"] = dist.histogram(args.bins).splitlines()
        print(json.dumps(out))
        return 0
    print(_dist_summary(dist))
    print(dist.histogram(args.bins))
    if args.plot:
        print(f"wrote {args.plot}" if dist.gflops else "no correct sample: no plot written")
    return 0


def _dist_summary(dist: Distribution) -> str:
    lines = [f"{dist.workload} {','.join(map(str, dist.size))}: {len(dist.samples)} programs "
             f"drawn uniformly from {dist.space_programs:.3g} ({dist.drawn} draws: "
             f"{dist.skipped_unrolled} over-unrolled and {dist.unbuildable} unbuildable skipped)"
             f", {dist.measured} measured now, {dist.correct_fraction:.0%} correct"]
    if dist.best:
        pct = dist.percentiles()
        lines.append("GFLOPS: " + "  ".join(f"{k} {v:.3g}" for k, v in pct.items()))
        lines.append(f"best: {dist.best.gflops:.4g} GFLOPS  {dist.best.structure}")
    for key, err in dist.errors[:5]:
        lines.append(f"error: {key}: {err.splitlines()[0] if err else ''}")
    return "\n".join(lines)


def _cmd_ranking(args: Any) -> int:
    import json

    from ..args import CliError
    from ..extract.cost import CostModelError

    _at_least_one(args, "folds")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        for m in models:
            cost_model_for(m, 1)
    except CostModelError as err:
        raise CliError(str(err)) from None
    if not models:
        raise CliError("--models names no cost model")
    dist = _distribution(args)
    try:
        quality = rank_quality(dist, models, folds=args.folds, seed=args.seed)
    except ValueError as err:
        raise CliError(str(err)) from None
    if args.json:
        print(json.dumps({"distribution": dist.to_json(), "ranking": quality}))
        return 0
    print(_dist_summary(dist))
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
