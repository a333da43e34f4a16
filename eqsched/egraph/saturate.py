"""Bounded equality saturation of a naive program's e-graph with a rule set.

    sat = saturate(naive_program(comp), resolve("-pack"), limits=Limits(seconds=5))
    sat.report.stop_reason      # "saturated" | "iteration_limit" | "node_limit" | "time_limit"
    Space(sat)                  # reads sat.serialized() from sat.root_class

One iteration runs the analysis rules to their fixpoint (they only derive guard facts), then every
growth rule once. egglog's Python API has no node or time limit, so the loop checks the e-graph's
size and the clock after each iteration; an iteration that takes the e-graph past the node limit
is rolled back (`push` before it, `pop` after). A push copies the e-graph, so it is made only when
the iteration could reach the limit at the largest growth seen so far (twice over); an iteration
that outgrows that guess stops the run over the limit, with `rolled_back` False. Phases run
rule sets one after another, each to its own fixpoint, under one budget.

The rules are objects the caller chose (`eqsched.rules.resolve` makes them from names): this
module knows only the `RewriteRule` protocol, never the rule plug-ins themselves.

An e-graph is tied to the thread that built it (egglog 13 panics otherwise): use a Saturation in
the thread that called `saturate`. A panic inside egglog reaches Python as pyo3's
`PanicException`, a BaseException that `except Exception` lets through; `saturate` and
`Saturation.serialized` turn it into a `SaturationError` naming what egglog was doing.

See docs/ARCHITECTURE.md §4 The e-graph.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import resource
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from egglog import EGraph, Ruleset, RunReport, Schedule, ruleset, unstable_combine_rulesets

from ..ir import Program
from .encode import encode
from .facts import Facts, facts_of
from .lang import Root, program_root, root_expr
from .term import Term

STOP_REASONS = ("saturated", "iteration_limit", "node_limit", "time_limit")


class SaturationError(RuntimeError):
    """egglog failed inside (a Rust panic); the message is one line saying while doing what."""


@contextlib.contextmanager
def egglog_panics(doing: str) -> Iterator[None]:
    """Raise a SaturationError for a panic of egglog in the block (`doing`: what it did)."""
    try:
        yield
    except BaseException as err:
        if type(err).__name__ != "PanicException":
            raise
        first = str(err).strip().splitlines()
        raise SaturationError(f"egglog panicked while {doing}: "
                              f"{first[0] if first else 'no message'}") from None


class RewriteRule(Protocol):
    """What saturation needs of a rule (`eqsched.rules.Rule` is the implementation): a name, whether
    it grows the space or only derives guard facts, and its egglog commands for a program."""

    @property
    def name(self) -> str: ...

    @property
    def growth(self) -> bool: ...

    def rewrites(self, facts: Facts) -> list: ...


Phase = tuple[str, Sequence[RewriteRule]]  # a name and the rules run to their fixpoint together


@dataclass(frozen=True)
class Limits:
    """When saturation stops: after `iterations`, past `enodes` or after `seconds` (checked
    after each iteration, so 0 runs one). A ValueError names a limit that cannot be one."""

    iterations: int = 100
    enodes: int = 1_000_000  # rows of all egglog tables: program nodes and analysis facts
    # A net for a runaway rule set, not the expected stop: where the clock stops a saturation,
    # the space depends on the machine's speed and load (docs/ARCHITECTURE.md §4).
    seconds: float = 300.0

    def __post_init__(self) -> None:
        for name in ("iterations", "enodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        seconds = self.seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not 0 <= seconds < math.inf:  # also refuses nan
            raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")


@dataclass
class SaturationReport:
    stop_reason: str
    iterations: int
    seconds: float
    enodes: int
    eclasses: int
    # sort (or relation name, for analysis facts) -> {"enodes": .., "eclasses": ..}
    sizes_per_sort: dict[str, dict[str, int]]
    matches_per_rule: dict[str, int]  # rule name -> matches over all iterations
    peak_rss_mb: float  # of the whole process (ru_maxrss), not of this e-graph alone
    rolled_back: bool  # the last iteration overshot the node limit and was undone
    rules: list[str] = field(default_factory=list)
    phases: list[dict[str, Any]] = field(default_factory=list)  # name, stop_reason, iterations

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Saturation:
    egraph: EGraph
    root: Root
    naive: Program
    facts: Facts
    report: SaturationReport
    _serialized: dict | None = None

    def serialized(self) -> dict:
        """egglog's serialized e-graph as JSON (every function, no truncation)."""
        if self._serialized is None:
            with egglog_panics("reading the saturated e-graph"):
                data = self.egraph._serialize(max_functions=None, max_calls_per_function=None)
                self._serialized = json.loads(data.to_json())
        return self._serialized

    @property
    def root_class(self) -> str:
        """The e-class of the program in `serialized()`: the child of the program_root fact."""
        nodes = self.serialized()["nodes"]
        marks = [n for n in nodes.values() if n["op"] == "program_root"]
        if len(marks) != 1:
            raise RuntimeError(f"expected one program_root fact, found {len(marks)}")
        return nodes[marks[0]["children"][0]]["eclass"]


class Runner:
    """The e-graph, the budget, and what has been spent of it: `phase(rules)` runs one rule set
    to its fixpoint or the first limit; `saturate` runs one phase per rule set, in order."""

    def __init__(self, egraph: EGraph, facts: Facts, limits: Limits):
        self.egraph, self.facts, self.limits = egraph, facts, limits
        self.start = time.perf_counter()
        self.iterations = 0
        self.matches: Counter[str] = Counter()
        self.rolled_back = False
        self.growth = 2.0  # the largest e-node growth of one iteration so far (guess before any)

    def phase(self, rules: Sequence[RewriteRule]) -> str:
        """Run `rules` to their fixpoint or the first limit; the stop reason."""
        analysis, growth, names = self._rulesets(rules)
        while True:
            if self.iterations >= self.limits.iterations:
                return "iteration_limit"
            before = enodes(self.egraph)
            # egglog's push copies the whole e-graph and a copy can only be dropped by restoring
            # it, so push only when this iteration might reach the node limit.
            saved = before * self.growth * 2 > self.limits.enodes
            if saved:
                self.egraph.push()
            changed = self._count(self.egraph.run(analysis.saturate()), names)
            changed |= self._count(self.egraph.run(growth), names)
            self.iterations += 1
            after = enodes(self.egraph)
            self.growth = max(self.growth, after / max(before, 1))
            if after > self.limits.enodes:
                if saved:
                    self.egraph.pop()
                    self.rolled_back = True
                return "node_limit"
            if not changed:
                return "saturated"
            if time.perf_counter() - self.start > self.limits.seconds:
                return "time_limit"

    def _rulesets(self, rules: Sequence[RewriteRule]
                  ) -> tuple[Schedule, Schedule, dict[object, str]]:
        """Per-rule egglog rulesets, combined into one analysis and one growth ruleset, and the
        rule name of every egglog rule (to attribute matches)."""
        analysis, growth, names = [], [], {}
        for rule in rules:
            commands = rule.rewrites(self.facts)
            if not commands:
                continue
            rs = ruleset(*commands, name=f"{rule.name}_{id(self)}")
            names.update({decl: rule.name for decl in _decls(rs)})
            (growth if rule.growth else analysis).append(rs)
        return _combine(analysis), _combine(growth), names

    def _count(self, report: RunReport, names: dict[object, str]) -> bool:
        for decl, n in report.num_matches_per_rule.items():
            self.matches[names.get(decl, str(decl))] += n
        return bool(report.updated)


def _decls(rs: Ruleset) -> list:
    """The egglog declarations of a ruleset's rules (the keys of RunReport's match counts)."""
    return list(rs._current_egg_decls._rulesets[rs.ident].rules)


def _combine(rulesets: list[Ruleset]) -> Schedule:
    if not rulesets:
        return ruleset(name=f"empty_{len(rulesets)}_{time.perf_counter_ns()}")
    return rulesets[0] if len(rulesets) == 1 else unstable_combine_rulesets(*rulesets)


def enodes(egraph: EGraph) -> int:
    return sum(n for _, n in egraph.all_function_sizes())


# egglog-python binds each subterm with several parents to a global `$__expr_<n>`, n counting from
# 0. With egglog 13 the serialized e-graph then showed wrong literals for some programs (a loop
# over "C.j" whose piece read "C.i") when two names differed only by trailing digits ($__expr_1,
# $__expr_11); renaming either one cured it. Counting from 10**9 gives every name the same width.
_LET_NUMBERS_FROM = 10**9


def _add_program(egraph: EGraph, root: Root) -> None:
    state = egraph._state  # egglog-python's lowering state: where the let counter lives
    state.expr_to_let_counter = max(state.expr_to_let_counter, _LET_NUMBERS_FROM)
    egraph.register(program_root(root))


def saturate(naive: Program, rules: Sequence[RewriteRule] = (), limits: Limits | None = None,
             phases: Sequence[Phase] | None = None, *, start: Term | None = None) -> Saturation:
    """Build the e-graph of `start` (default: `naive` itself, encoded) and grow it with `rules`,
    or with `phases` [(name, rules), ...] one after another. Facts (the guards' inputs) are always
    those of `naive`, the program every term of the space computes. A panic of egglog is a
    SaturationError."""
    with egglog_panics(f"saturating {naive.computation.name}"):
        return _saturate(naive, rules, limits, phases, start)


def _saturate(naive: Program, rules: Sequence[RewriteRule], limits: Limits | None,
              phases: Sequence[Phase] | None, start: Term | None) -> Saturation:
    limits = limits or Limits()
    facts = facts_of(naive)
    term = start if start is not None else encode(naive, facts)[0]
    root = root_expr(term)
    egraph = EGraph()
    _add_program(egraph, root)
    runner = Runner(egraph, facts, limits)
    plan = phases if phases is not None else [("all", rules)]
    done: list[dict[str, Any]] = []
    chosen: list[str] = []
    stop = "saturated"
    for name, picked in plan:
        chosen += [r.name for r in picked if r.name not in chosen]
        before = runner.iterations
        stop = runner.phase(picked)
        done.append({"name": name, "stop_reason": stop, "iterations": runner.iterations - before})
        if stop != "saturated":
            break
    seconds = time.perf_counter() - runner.start
    sat = Saturation(egraph, root, naive, facts, None)  # type: ignore[arg-type]
    sat.report = _report(sat, runner, stop, seconds, chosen, done)
    return sat


def _report(sat: Saturation, runner: Runner, stop: str, seconds: float, rules: list[str],
            phases: list[dict]) -> SaturationReport:
    sizes: dict[str, dict[str, int]] = {}
    classes: dict[str, set[str]] = {}
    for node in sat.serialized()["nodes"].values():
        sort = node["op"] if node["eclass"].startswith("@") else _sort_of(node["eclass"])
        sizes.setdefault(sort, {"enodes": 0, "eclasses": 0})["enodes"] += 1
        classes.setdefault(sort, set()).add(node["eclass"])
    for sort, members in classes.items():
        sizes[sort]["eclasses"] = len(members)
    return SaturationReport(
        stop_reason=stop,
        iterations=runner.iterations,
        seconds=seconds,
        enodes=enodes(sat.egraph),
        eclasses=sum(len(c) for c in classes.values()),
        sizes_per_sort=dict(sorted(sizes.items())),
        matches_per_rule=dict(sorted(runner.matches.items())),
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        rolled_back=runner.rolled_back,
        rules=rules,
        phases=phases,
    )


def _sort_of(eclass: str) -> str:
    """"eqsched.egraph.lang.Root-8" -> "Root"; "primitive-String-1" -> "String"."""
    return re.split(r"[.\-]", eclass.rsplit("-", 1)[0])[-1]
