"""The measured distribution of a space: programs drawn uniformly from it, each checked against
numpy and timed.

    from eqsched.tools.distribution import measure_distribution

    dist = measure_distribution("matmul", (64, 64, 64), samples=32, db="eqsched.db")
    print(dist.histogram())            # GFLOPS of uniformly drawn programs, log-spaced bins

    eqsched experiment distribution matmul --size 64,64,64 --samples 32 --db eqsched.db

A distribution draws programs uniformly from the space but keeps only those the search would
measure (at most MAX_UNROLLED unrolled copies; more take LLVM minutes to compile): it is uniform
over that part of the space, and says how many draws it skipped. Measurements go to the results
database like explore's, keyed the same way, so a rerun measures nothing new.

See docs/ARCHITECTURE.md §11 Measurement.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..args import CliError, check_writable, parse_target
from ..db import Database
from ..egraph.derive import DeriveError, derive, realize
from ..egraph.saturate import Limits, saturate
from ..egraph.space import Space
from ..egraph.term import show, vector_lanes
from ..ir import Program, naive_program
from ..runner import Measurement
from ..schedule import ScheduleError
from ..trials import Settings, measurement_key, record_of
from ..workloads import get_workload
from .experiment import at_least_one, common_arguments, problem, rule_spec


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
    target = settings.options().target
    target.check_runs_here()
    naive = naive_program(wl.build(*size))
    sat = saturate(naive, resolve(rules), limits)
    space = Space(sat, vector_lanes(target.vector_lanes))
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
    stored = settings.lookup(database, workload, size, key) if database is not None else None
    if stored is not None:
        return Sample(key, stored.structure, stored.median_s, stored.gflops, stored.correct,
                      stored.error, True, prog)
    try:
        trace = derive(term, sizes, naive)
    except DeriveError as err:
        # Only replayable programs are reported, as in explore; this one is an error.
        trace, m = [], Measurement(correct=None, error=f"no replayable trace: {err}")
    else:
        m = settings.measure(prog)
    record = record_of(workload, size, key, show(term), sizes, trace, m, settings)
    if database is not None:
        database.add(record)
    return Sample(key, record.structure, m.median_s, m.gflops, m.correct, record.error, False,
                  prog)


# ---- eqsched experiment distribution ----------------------------------------------------------


def add_parser(sub: Any) -> None:
    p = sub.add_parser("distribution", help="measure uniformly drawn programs: GFLOPS histogram")
    sample_arguments(p)
    p.add_argument("--bins", type=int, default=12, help="histogram bins (default 12)")
    p.add_argument("--plot", metavar="HIST.png", help="also write a PNG histogram "
                                                      "(needs matplotlib)")
    p.set_defaults(run=_cmd_dist)


def sample_arguments(p: Any) -> None:
    """The arguments of an experiment that measures a uniform sample (read by
    `measure_from_args`)."""
    common_arguments(p)
    p.add_argument("--rules", default="default",
                   help="rule names or +name/-name edits (write --rules=-pack)")
    p.add_argument("--samples", type=int, default=64, help="programs to measure (default 64)")
    p.add_argument("--db", help="results database: stored measurements are reused and new "
                                "ones kept (default: none)")
    p.add_argument("--threads", type=int, default=1, help="threads for parallel loops "
                                                           "(default 1)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs each (default 10)")


def _stderr_progress(i: int, n: int, s: Sample) -> None:
    what = f"{s.gflops:.3g} GFLOPS" if s.correct and s.gflops else (s.error or "wrong result")
    print(f"eqsched: [{i}/{n}] {what}{' (stored)' if s.cached else ''}", file=sys.stderr,
          flush=True)


def measure_from_args(args: Any) -> Distribution:
    """The distribution `sample_arguments` describe, measured with progress on stderr."""
    from ..db import DatabaseError

    at_least_one(args, "samples", "threads", "repeats")
    target = parse_target(args.target)
    workload, size, limits = problem(args)
    rules = rule_spec(args.rules)
    print(f"eqsched: drawing {args.samples} programs of {workload} "
          f"{','.join(map(str, size))} ...", file=sys.stderr)
    try:
        return measure_distribution(workload, size, rules, samples=args.samples, seed=args.seed,
                                    db=args.db, limits=limits, progress=_stderr_progress,
                                    settings=Settings(repeats=args.repeats, threads=args.threads,
                                                      target=target))
    except DatabaseError as err:
        raise CliError(str(err)) from None
    except KeyboardInterrupt:
        if args.db:
            print(f"\neqsched: what was measured is in {args.db}; the same command resumes",
                  file=sys.stderr)
        raise


def _cmd_dist(args: Any) -> int:
    import json

    at_least_one(args, "bins")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError("--plot needs matplotlib: pip install 'eqsched[report]'") from None
    if args.plot is not None:  # before the sample is measured, not after
        check_writable(args.plot, "the plot")
    dist = measure_from_args(args)
    if args.plot and dist.gflops:
        try:
            dist.plot(args.plot, bins=args.bins)
        except OSError as e:
            raise CliError(f"cannot write the plot to {args.plot} ({e.strerror})") from None
    out = dist.to_json()
    if args.json:
        out["histogram"] = dist.histogram(args.bins).splitlines()
        print(json.dumps(out))
        return 0
    print(summary(dist))
    print(dist.histogram(args.bins))
    if args.plot:
        print(f"wrote {args.plot}" if dist.gflops else "no correct sample: no plot written")
    return 0


def summary(dist: Distribution) -> str:
    """What was drawn and measured, the GFLOPS percentiles, the best program and the
    first errors."""
    lines = [f"{dist.workload} {','.join(map(str, dist.size))}: {len(dist.samples)} programs "
             f"drawn uniformly from {dist.space_programs:.3g} ({dist.drawn} draws: "
             f"{dist.skipped_unrolled} over-unrolled and {dist.unbuildable} unbuildable skipped)"
             f", {dist.measured} measured now, {dist.correct_fraction:.0%} correct, target "
             f"{dist.settings.target}"]
    if dist.best:
        pct = dist.percentiles()
        lines.append("GFLOPS: " + "  ".join(f"{k} {v:.3g}" for k, v in pct.items()))
        lines.append(f"best: {dist.best.gflops:.4g} GFLOPS  {dist.best.structure}")
    for key, err in dist.errors[:5]:
        lines.append(f"error: {key}: {err.splitlines()[0] if err else ''}")
    return "\n".join(lines)
