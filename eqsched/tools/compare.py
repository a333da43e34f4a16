"""Compare two rule sets' spaces of one problem: their sizes, and how much of each lies in the
other.

    from eqsched.tools.compare import compare_spaces

    cmp = compare_spaces("matmul", (256, 256, 256), None, "-pack", samples=200)
    print(cmp.text())                  # sizes of both spaces, overlap both ways with 95% intervals

    eqsched experiment compare matmul --rules-a default --rules-b=-pack --samples 200

Membership of a uniform sample of A in B estimates |A∩B| / |A|, not |A∩B| / |A∪B|: the
comparison reports it both ways, with Wilson intervals and the implied |A∩B|. Both spaces are
built from the same naive program, so they share its analysis facts (dimension groups) and a term
of one is tested in the other directly.

See docs/ARCHITECTURE.md §4 The e-graph.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..args import parse_target
from ..egraph.saturate import Limits, saturate
from ..egraph.space import Space
from ..egraph.term import VECTOR_LANES, vector_lanes
from ..ir import Program, naive_program
from ..workloads import get_workload
from .experiment import at_least_one, common_arguments, problem, rule_spec

Z95 = 1.959964  # two-sided 95% normal quantile


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
    vector_lanes: list[int]  # the extents a vector piece may have in both spaces (the target's)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        rows = [("", f"A: {self.a.label}", f"B: {self.b.label}")]
        for name in ("stop_reason", "enodes", "eclasses", "programs", "saturation_s"):
            va, vb = getattr(self.a, name), getattr(self.b, name)
            rows.append((name.replace("_", " "), _cell(va), _cell(vb)))
        width = [max(len(r[c]) for r in rows) for c in range(3)]
        lines = [f"{self.workload} {','.join(map(str, self.size))}: space A vs space B (vector "
                 f"loops of {', '.join(map(str, self.vector_lanes))} lanes)"]
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
                   samples: int = 200, seed: int = 0, limits: Limits | None = None,
                   vector_lanes: Sequence[int] = VECTOR_LANES) -> SpaceComparison:
    """Saturate `workload` at `size` (default: its default) with two rule specs (None: the
    default set) and compare the spaces (vector pieces of `vector_lanes`, as
    `term.vector_lanes` gives for a target): sizes, and membership of uniform samples both
    ways."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    wl = get_workload(workload)
    size = wl.check_size(tuple(size)) if size is not None else wl.default_size
    naive = naive_program(wl.build(*size))
    space_a, stats_a = _space(naive, rules_a, limits, vector_lanes)
    space_b, stats_b = _space(naive, rules_b, limits, vector_lanes)
    a_in_b = _membership(space_a, space_b, samples, seed)
    b_in_a = _membership(space_b, space_a, samples, seed)
    return SpaceComparison(wl.name, list(size), stats_a, stats_b, a_in_b, b_in_a,
                           _statements(stats_a, stats_b, a_in_b, b_in_a), list(vector_lanes))


def _space(naive: Program, rules: Any, limits: Limits | None, lanes: Sequence[int]
           ) -> tuple[Space, SpaceStats]:
    from ..rules import resolve

    sat = saturate(naive, resolve(rules), limits)
    space = Space(sat, lanes)
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


# ---- eqsched experiment compare ---------------------------------------------------------------


def add_parser(sub: Any) -> None:
    cmp = sub.add_parser("compare", help="two rule sets' spaces: sizes and overlap")
    common_arguments(cmp)
    cmp.add_argument("--rules-a", default="default",
                     help="rule names or +name/-name edits of the default set; write edits as "
                          "--rules-a=-pack (default: the default set)")
    cmp.add_argument("--rules-b", default="default", help="as --rules-a")
    cmp.add_argument("--samples", type=int, default=200, help="draws per side (default 200)")
    cmp.set_defaults(run=_cmd_compare)


def _cmd_compare(args: Any) -> int:
    import json

    at_least_one(args, "samples")
    lanes = vector_lanes(parse_target(args.target, runs_here=False).vector_lanes)
    workload, size, limits = problem(args)
    result = compare_spaces(workload, size, rule_spec(args.rules_a), rule_spec(args.rules_b),
                            samples=args.samples, seed=args.seed, limits=limits,
                            vector_lanes=lanes)
    print(json.dumps(result.to_json()) if args.json else result.text())
    return 0
