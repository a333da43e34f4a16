"""The rule-authoring kit: list the rules, and check one for soundness and for its effect.

    eqsched rules list
    eqsched rules check vectorize
    eqsched rules check my_rule --module my_rule.py --workloads matmul,softmax
    eqsched rules check vectorize --target host,-avx512f      # AVX2 code and vector lanes

`check_rule` fuzzes a rule: from programs drawn uniformly from each workload's space without the
rule (small sizes), plus the naive program, it applies the rule wherever it matches (three
iterations of the rule alone on an e-graph holding just that program) and takes the programs that
changed. Each is built with the manual primitives *without* legality checks and executed in a
worker process against the numpy reference, so a wrong rule is caught by its wrong numbers, not
only by the legality checker (whose verdict is reported beside). The smallest failing case is
reported first. It then compares the default space with and without the rule (e-nodes, e-classes,
programs, saturation time) and the best GFLOPS a short exploration finds each way. Everything
is compiled for one target (the host by default), whose vector lanes the spaces take.

    check = check_rule(RULES["vectorize"], workloads=["matmul"], programs=4)
    check.sound, check.failures[:1], check.effect

`check_space` checks a whole space the same way, without a rule to blame: programs drawn
uniformly from a workload's default space are derived into manual traces (`realize`, legality
checked), compiled in this process and compared with numpy; a failure names the term, its sizes
and the problem. `check_spaces` prints its table for several workloads (the suite's soundness
test and bench/space_soundness.py call these two).

    check_space("matmul", (11, 13, 7), samples=20).failures

See docs/ARCHITECTURE.md §15 Extending eqsched.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..args import TARGET_HELP, CliError, parse_target, seed_arg
from ..backend import CompileOptions, Target
from ..egraph.derive import build_unchecked
from ..egraph.encode import encode
from ..egraph.saturate import Limits, Saturation, saturate
from ..egraph.space import Space
from ..egraph.term import show, vector_lanes
from ..ir import Program, naive_program
from ..workloads import get_workload, list_workloads

AFTERS_PER_PROGRAM = 4
DRAWS_PER_PROGRAM = 256  # the changed structures are a minority of the sizes drawn
# A rule's own set-up facts take iterations to hold: reorder's `movable` groups from the 2nd,
# fuse's first fusion in the 3rd.
ITERATIONS = 3
DRAWS_FOR_MATCHES = 20  # uniform draws per wanted start where the rule matches


@dataclass
class Failure:
    workload: str
    size: list[int]
    kind: str  # "wrong result", "run failed", "cannot be built"
    detail: str
    before: str  # program text
    after: str
    after_term: str
    legality: str  # the legality checker's verdict on the program after

    @property
    def weight(self) -> tuple:
        scale = 1
        for d in self.size:
            scale *= max(d, 1)
        return (scale, len(self.after.splitlines()), len(self.after))


@dataclass
class RuleCheck:
    rule: str
    programs_started: int = 0
    programs_checked: int = 0  # programs after the rule, executed
    failures: list[Failure] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # starts whose rewritten space failed
    effect: list[dict[str, Any]] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def sound(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "sound": self.sound}


def _one_step(term: Any, naive: Program, rule: Any, target: Target) -> Space:
    """The space of `term` after `rule` (and the analyses it needs) ran ITERATIONS times."""
    from ..rules import resolve

    return Space(saturate(naive, resolve([rule]), Limits(iterations=ITERATIONS), start=term),
                 vector_lanes(target.vector_lanes))


def _legality(prog: Program) -> str:
    from ..legality import check_program
    from ..schedule import ScheduleError

    try:
        check_program(prog)
    except ScheduleError as e:
        return f"illegal: {e}"
    return "legal"


@functools.lru_cache(maxsize=8)
def _saturated(workload: str, rules: tuple, lanes: int) -> tuple[Saturation, Space]:
    """`workload`'s space at its small size under `rules`, kept for the process: checking each
    default rule in turn saturates the whole default set once per workload, not once per rule,
    and the set without a rule once for its soundness and its effect."""
    from ..rules import resolve

    wl = get_workload(workload)
    sat = saturate(naive_program(wl.build(*wl.small_size)), resolve(list(rules)))
    return sat, Space(sat, vector_lanes(lanes))


def _soundness(check: RuleCheck, rule: Any, workload: str, programs: int, seed: int,
               target: Target, say: Any) -> None:
    wl = get_workload(workload)
    size = wl.small_size
    naive = naive_program(wl.build(*size))
    _, base = _saturated(workload, tuple(_rule_sets(rule)["without"]), target.vector_lanes)
    # Uniform draws often hold no match (vectorize needs a serial unit-stride innermost loop):
    # draw until `programs` starts where the rule applies, within a bounded number of draws.
    starts = [encode(naive, base.facts)] + base.sample(DRAWS_FOR_MATCHES * programs, seed)
    rng = random.Random(seed)
    matched = 0
    for term, sizes in starts:
        if matched == programs:
            break
        try:
            space = _one_step(term, naive, rule, target)
        except Exception as e:  # noqa: BLE001  (the space of an e-graph rooted at a scheduled
            # program is not always well-formed for the counter; that start is skipped, and said)
            check.skipped.append(f"{workload}: {show(term)[:80]}: {type(e).__name__}: {e}")
            continue
        if space.count_structures() <= 1:
            continue
        try:
            before = build_unchecked(term, sizes, naive)
        except Exception:  # noqa: BLE001  (a start the primitives cannot build is skipped)
            continue
        total = space.count()
        seen, afters = {show(term)}, []
        for _ in range(DRAWS_PER_PROGRAM):
            if len(afters) == AFTERS_PER_PROGRAM:
                break
            after_term, after_sizes = space.program(rng.randrange(total))
            if show(after_term) not in seen:
                seen.add(show(after_term))
                afters.append((after_term, after_sizes))
        if not afters:  # the changed structures admit no sizes here (a vector of 24 lanes)
            continue
        matched += 1
        check.programs_started += 1
        for after_term, after_sizes in afters:
            check.programs_checked += 1
            failure = _run_after(workload, list(size), naive, before, after_term, after_sizes,
                                 target)
            if failure is not None:
                check.failures.append(failure)
        say(workload, check)


def _run_after(workload: str, size: list[int], naive: Program, before: Program, term: Any,
               sizes: Any, target: Target) -> Failure | None:
    from ..runner import measure

    def failed(kind: str, detail: str, after: str = "", legality: str = "") -> Failure:
        return Failure(workload, size, kind, detail.splitlines()[0], before.text(), after,
                       show(term), legality)

    try:
        after = build_unchecked(term, sizes, naive)
    except Exception as e:  # noqa: BLE001  (the rule made a term no schedule spells)
        return failed("cannot be built", f"{type(e).__name__}: {e}")
    legality = _legality(after)
    m = measure(after, repeats=0, warmup=0, timeout_s=60, options=CompileOptions(target=target))
    if m.error:
        return failed("run failed", m.error, after.text(), legality)
    if m.correct is False:
        return failed("wrong result", m.check_message or "differs from numpy", after.text(),
                      legality)
    return None


def _rule_sets(rule: Any) -> dict[str, list]:
    """The default rule set with the rule (added if it is not a default one) and without it."""
    from ..rules import DEFAULT

    return {"with": list(DEFAULT) if rule.name in DEFAULT else [*DEFAULT, rule],
            "without": [name for name in DEFAULT if name != rule.name]}


def _effect(rule: Any, workload: str, target: Target) -> dict[str, Any]:
    wl = get_workload(workload)
    row: dict[str, Any] = {"workload": workload, "size": list(wl.small_size)}
    for side, rules in _rule_sets(rule).items():
        sat, space = _saturated(workload, tuple(rules), target.vector_lanes)
        rep = sat.report
        programs = space.count()
        row[side] = {"enodes": rep.enodes, "eclasses": rep.eclasses, "programs": programs,
                     "seconds": round(rep.seconds, 3), "stop_reason": rep.stop_reason}
    return row


def _best_gflops(rule: Any, trials: int, size: tuple[int, ...], target: Target
                 ) -> dict[str, Any]:
    from ..explore import explore
    from ..trials import Settings

    out = {"workload": "matmul", "size": list(size), "trials": trials}
    with tempfile.TemporaryDirectory() as tmp:
        for side, rules in _rule_sets(rule).items():
            result = explore("matmul", size, trials=trials, batch=min(trials, 4),
                             db=Path(tmp) / f"{side}.db", cost_model="analytic", rules=rules,
                             settings=Settings(repeats=3, threads=1, target=target),
                             measure_naive=False)
            out[side] = result.best.gflops if result.best else None
    return out


def check_rule(rule: Any, workloads: list[str] | None = None, programs: int = 6, seed: int = 0,
               measure: bool = True, trials: int = 8, measure_size: tuple[int, ...] = (64,) * 3,
               progress: Any = None, target: Target | None = None) -> RuleCheck:
    """Fuzz `rule` (a Rule or a registered name) for soundness and report its effect, compiling
    for `target` (default: the host); see the module docstring."""
    from ..rules import RULES, RuleError

    if isinstance(rule, str):
        if rule not in RULES:
            raise RuleError(f"unknown rule {rule!r}; known: {', '.join(sorted(RULES))}")
        rule = RULES[rule]
    if not rule.growth:
        raise RuleError(f"{rule.name} is an analysis rule: it adds no programs to check")
    target = target or Target.host()
    target.check_runs_here()
    names = workloads or [w.name for w in list_workloads()]
    for name in names:
        get_workload(name)
    started = time.perf_counter()
    check = RuleCheck(rule.name)
    say = progress or (lambda workload, check: None)
    for name in names:
        _soundness(check, rule, name, programs, seed, target, say)
        check.effect.append(_effect(rule, name, target))
    check.failures.sort(key=lambda f: f.weight)
    if measure:
        check.measured = _best_gflops(rule, trials, measure_size, target)
    check.seconds = time.perf_counter() - started
    return check


@dataclass
class SpaceCheck:
    workload: str
    size: tuple[int, ...]
    programs: int  # in the space
    sampled: int
    remainders: int  # sampled programs with a split that leaves a remainder
    failures: list[str]  # 'term | sizes | problem'
    seconds: float


def check_space(workload: str, size: tuple[int, ...] | None = None, samples: int = 20,
                seed: int = 0, where: Callable[[Any, Any, Program], bool] | None = None,
                draws: int | None = None, target: Target | None = None) -> SpaceCheck:
    """Execute `samples` programs drawn uniformly from `workload`'s default space at `size` (its
    small size by default) and compare each with numpy; see the module docstring. `where(term,
    sizes, naive)` keeps only the programs it accepts, the first `samples` of `draws` draws
    (`sampled` says how many were found). `target` (default the host) sets the space's vector
    lanes and the code the programs compile to."""
    from ..backend import BackendError, compile_program
    from ..egraph.derive import DeriveError, realize
    from ..egraph.encode import EncodeError
    from ..egraph.space import build_space
    from ..reference import compare, random_inputs, reference, tolerance
    from ..rules import default_rules
    from ..schedule import ScheduleError

    started = time.perf_counter()
    size = tuple(size or get_workload(workload).small_size)
    base = naive_program(get_workload(workload).build(*size))
    target = target or Target.host()
    space = build_space(base, default_rules(), None, vector_lanes(target.vector_lanes))
    options = CompileOptions(target=target)
    inputs = random_inputs(base.computation, seed=1)
    want = reference(base.computation, inputs)
    drawn = space.sample(draws or samples, seed)
    if where is not None:
        drawn = [(term, sizes) for term, sizes in drawn if where(term, sizes, base)][:samples]
    remainders, failures = 0, []
    for term, sizes in drawn:
        try:
            prog = realize(term, sizes, base)
            remainders += _has_remainder(prog)
            ok, _, message = compare(compile_program(prog, options).run(inputs), want,
                                     tolerance(base.computation))
            problem = None if ok else f"wrong result: {message}"
        except (DeriveError, EncodeError, ScheduleError, BackendError) as e:
            problem = f"{type(e).__name__}: {e}"
        if problem is not None:
            failures.append(f"{show(term)} | {sorted(sizes.items())} | {problem}")
    return SpaceCheck(workload, size, space.count(), len(drawn), remainders, failures,
                      time.perf_counter() - started)


def _has_remainder(prog: Program) -> bool:
    """Do some block's loops over one axis cover more than its extent?"""
    extents = {lp.name: lp.extent for lp in prog.loops()}
    return any(math.prod(extents[lp] for lp, _ in b.terms) > blk.axis(b.axis).extent
               for blk in prog.blocks() for b in blk.bindings)


def check_spaces(sizes: dict[str, tuple[int, ...] | None], samples: int, seed: int = 0,
                 write: Callable[[str], None] = print, target: Target | None = None) -> int:
    """`check_space` for each workload at its size (None: the small one) on `target`, a table
    row written as each finishes and a FAIL line per failure; returns the number of
    failures."""
    write(f"{'workload':<18} {'size':<24} {'programs':>10} {'sampled':>8} {'remainder':>9} "
          f"{'failed':>7} {'seconds':>8}")
    failed = 0
    for workload, size in sizes.items():
        check = check_space(workload, size, samples, seed, target=target)
        write(f"{workload:<18} {','.join(map(str, check.size)):<24} {check.programs:>10.3g} "
              f"{samples:>8} {check.remainders:>9} {len(check.failures):>7} "
              f"{check.seconds:>8.1f}")
        for line in check.failures:
            write(f"  FAIL {line}")
        failed += len(check.failures)
    return failed


# ---- command line -----------------------------------------------------------------------------


def load_module(path: str) -> None:
    """Import a Python file by path; its `@register` rules join the registry."""
    from ..rules import RuleError

    file = Path(path)
    if not file.is_file():
        raise RuleError(f"no rule module {path}")
    spec = importlib.util.spec_from_file_location(f"eqsched_user_rules_{file.stem}", file)
    if spec is None or spec.loader is None:  # not named .py: no loader knows it
        raise RuleError(f"rule module {path} is not a Python file (.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise RuleError(f"{path} failed to import: {type(e).__name__}: {e}") from None


def rule_rows() -> list[dict[str, Any]]:
    from ..rules import DEFAULT, RULES

    rows = []
    for name, rule in sorted(RULES.items()):
        doc = [line.strip() for line in (type(rule).__doc__ or "").strip().splitlines()]
        rows.append({"name": name, "kind": "growth" if rule.growth else "analysis",
                     "default": name in DEFAULT, "requires": list(rule.requires),
                     "summary": doc[0] if doc else "",
                     "pattern": next((line for line in doc if "->" in line), "")})
    return rows


def add_parser(sub: Any) -> None:
    p = sub.add_parser("rules", help="list the rewrite rules, or check one for soundness")
    cmds = p.add_subparsers(dest="rules_command", required=True)
    ls = cmds.add_parser("list", help="every registered rule")
    ls.add_argument("--module", action="append", default=[], help="also load rules from FILE")
    ls.add_argument("--json", action="store_true")
    ck = cmds.add_parser("check", help="fuzz a rule for soundness; its effect on the space")
    ck.add_argument("rule", help="a rule name (see `eqsched rules list`)")
    ck.add_argument("--module", action="append", default=[],
                    help="a Python file defining the rule with @register")
    ck.add_argument("--workloads", help="comma-separated (default: every built-in workload)")
    ck.add_argument("--programs", type=int, default=6, help="programs drawn per workload")
    ck.add_argument("--seed", type=seed_arg, default=0)
    ck.add_argument("--trials", type=int, default=8, help="exploration trials each way")
    ck.add_argument("--no-measure", action="store_true", help="skip the exploration")
    ck.add_argument("--target", default="host", help=TARGET_HELP)
    ck.add_argument("--json", action="store_true")
    p.set_defaults(run=_cmd_rules)


def _cmd_rules(args: Any) -> int:
    from ..rules import RuleError

    try:
        for path in args.module:
            load_module(path)
        if args.rules_command == "list":
            return _print_list(args.json)
        if args.programs < 1 or args.trials < 1:
            raise CliError("--programs and --trials must be >= 1")
        target = parse_target(args.target)
        workloads = [w.strip() for w in args.workloads.split(",")] if args.workloads else None

        def show_progress(workload: str, check: RuleCheck) -> None:
            print(f"  {workload}: {check.programs_checked} programs checked, "
                  f"{len(check.failures)} failing so far", file=sys.stderr)

        check = check_rule(args.rule, workloads, args.programs, args.seed,
                           not args.no_measure, args.trials, progress=show_progress,
                           target=target)
    except RuleError as err:
        raise CliError(str(err)) from None
    if args.json:
        print(json.dumps(check.to_json()))
    else:
        _print_check(check)
    return 0 if check.sound else 1


def _print_list(as_json: bool) -> int:
    rows = rule_rows()
    if as_json:
        print(json.dumps(rows))
        return 0
    for r in rows:
        flags = r["kind"] + (", default" if r["default"] else "")
        needs = f"; requires {', '.join(r['requires'])}" if r["requires"] else ""
        print(f"{r['name']:<14} ({flags}{needs}) {r['summary']}")
        if r["pattern"]:
            print(f"{'':<16}{r['pattern']}")
    return 0


def _print_check(check: RuleCheck) -> None:
    verdict = "SOUND" if check.sound else f"UNSOUND ({len(check.failures)} failing programs)"
    print(f"rule {check.rule}: {verdict}: {check.programs_checked} programs after the rule "
          f"executed, from {check.programs_started} starting programs, {check.seconds:.0f} s")
    if check.skipped:
        print(f"skipped {len(check.skipped)} starts whose rewritten e-graph could not be counted "
              f"(first: {check.skipped[0]})")
    if check.failures:
        f = check.failures[0]
        print(f"smallest failing case: {f.workload} {','.join(map(str, f.size))}: {f.kind}: "
              f"{f.detail} (legality checker: {f.legality or 'n/a'})")
        print("before:\n" + f.before)
        print("after:\n" + (f.after or f"(term) {f.after_term}"))
    print("effect on the space (small sizes), with / without the rule:")
    for row in check.effect:
        w, wo = row["with"], row["without"]
        print(f"  {row['workload']}: programs {float(w['programs']):.3g} / "
              f"{float(wo['programs']):.3g}, e-nodes {w['enodes']} / {wo['enodes']}, "
              f"e-classes {w['eclasses']} / {wo['eclasses']}, saturation {w['seconds']} / "
              f"{wo['seconds']} s")
    if check.measured:
        m = check.measured
        print(f"best GFLOPS on matmul {','.join(map(str, m['size']))} in {m['trials']} trials: "
              f"{m['with']} with, {m['without']} without")
