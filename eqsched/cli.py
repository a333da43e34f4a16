"""The `eqsched` command: a thin shell over workloads, schedules and the runner.

    eqsched workloads [--json]
    eqsched run matmul --size 512,512,512 --schedule examples/schedules/matmul-512.json
    eqsched machine [--calibrate] [--target host,-avx512f] [--json]
    eqsched space matmul --size 64,64,64 --sample 3 [--rules a,-b] [--limits seconds=10] [--json]
    eqsched explore matmul --size 512,512,512 --trials 64 [--db eqsched.db] [--seed 0] [--json]
    eqsched explore matmul --target host,-avx512f      # compile for AVX2 (also run, space, batch)
    eqsched batch suite.toml [--jobs 2] [--db eqsched.db] [--executor ray]
    eqsched runs [--db eqsched.db] [--json]            # every run and its status
    eqsched report --db eqsched.db --out report/
    eqsched rules list | eqsched rules check RULE
    eqsched experiment compare|distribution|ranking WORKLOAD ...

Every failure prints one line, `eqsched: error: ...`, on stderr and exits with status 2; a program
that runs but computes a wrong result exits with status 1. SIGTERM is handled like Ctrl-C: an
exploration, a model's tuning or a batch stops after the measurement in progress, keeps what it
measured, marks its run interrupted and exits with status 130 (a model's tuning first runs the
model with what it has).

See docs/ARCHITECTURE.md §14 Layering.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, NoReturn

from . import machine
from .args import (
    MEMORY_HELP,
    TARGET_HELP,
    CliError,
    check_writable,
    max_memory_arg,
    parse_limits,
    parse_rules,
    parse_size,
    parse_target,
    resumable_interrupt,
    seconds_arg,
    seed_arg,
    timeout_arg,
)
from .backend import BackendError, CompileOptions, Target
from .egraph.dot import write_dot
from .egraph.saturate import SaturationError
from .egraph.space import Space, SpaceError, rule_contributions
from .ir import LoopKind, Program, naive_program
from .machine_model import CalibrationError, cache_path, describe, machine_model, recalibrate
from .runner import DEFAULT_TIMEOUT_S, Measurement, TooLargeError, check_fits_in_memory, measure
from .schedule import Schedule, ScheduleError, load_trace
from .te import WorkloadError
from .tools import batch, compare, distribution, experiment, ranking, report, rulekit, tune_model
from .workloads import Workload, get_workload, list_workloads

EXIT_WRONG_RESULT = 1
EXIT_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage mistakes in the same one-line form as every other error."""

    def error(self, message: str) -> NoReturn:
        print(f"eqsched: error: {message} (see `eqsched {self._sub_name()}--help`)",
              file=sys.stderr)
        sys.exit(EXIT_ERROR)

    def _sub_name(self) -> str:
        words = self.prog.split()[1:]
        return " ".join(words) + " " if words else ""


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="eqsched", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    wl = sub.add_parser("workloads", help="list the registered workloads")
    wl.add_argument("--json", action="store_true", help="print a JSON list")

    run = sub.add_parser("run", help="build a workload, apply a schedule, check and time it")
    run.add_argument("workload", help="a name from `eqsched workloads`")
    run.add_argument("--size", help="comma-separated sizes, one per parameter (default: the "
                                    "trace's size, else the workload's default)")
    run.add_argument("--schedule", metavar="TRACE", help="a schedule trace (JSON) to replay")
    run.add_argument("--repeats", type=int, default=10, help="timed runs (default 10)")
    run.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    run.add_argument("--seed", type=seed_arg, default=0, help="seed of the random inputs")
    run.add_argument("--timeout", type=timeout_arg, default=DEFAULT_TIMEOUT_S,
                     help=f"seconds for compile, check and timing (default {DEFAULT_TIMEOUT_S:g})")
    run.add_argument("--max-memory", type=max_memory_arg, help=MEMORY_HELP)
    run.add_argument("--target", default="host", help=TARGET_HELP)
    run.add_argument("--threads", type=int,
                     help="threads for parallel loops (default: every core; 1 for a one-core "
                          "result)")
    run.add_argument("--json", action="store_true",
                     help="print one JSON object on stdout (progress goes to stderr)")
    run.add_argument("--no-print", action="store_true", help="do not print the program")

    mach = sub.add_parser("machine", help="this machine's facts, measured FMA peak and the "
                                          "cost model's machine model of a target")
    mach.add_argument("--calibrate", action="store_true",
                      help="measure the machine model again (a few seconds) and cache it")
    mach.add_argument("--target", default="host",
                      help="the target whose machine model to show: 'host' (default), "
                           "'host,-avx512f', an LLVM CPU such as 'haswell'")
    mach.add_argument("--json", action="store_true", help="print a JSON object")

    space = sub.add_parser("space", help="saturate a workload's schedule e-graph; count, sample")
    space.add_argument("workload", help="a name from `eqsched workloads`")
    space.add_argument("--size", help="comma-separated sizes (default: the workload's default)")
    space.add_argument("--rules", help="comma-separated rule names, or +name/-name edits of the "
                                       "default set (default: the default set)")
    space.add_argument("--limits", help="saturation limits, like iterations=20,enodes=200000,"
                                        "seconds=10")
    space.add_argument("--sample", type=int, default=0, metavar="N",
                       help="draw N programs uniformly and print them with their traces")
    space.add_argument("--seed", type=seed_arg, default=0,
                       help="seed of --sample (default 0)")
    space.add_argument("--target", default="host",
                       help=TARGET_HELP + "; its vector width sets the vector lanes of the space "
                                          "(any target LLVM knows, runnable here or not)")
    space.add_argument("--dot", metavar="OUT.svg",
                       help="write the space's DAG for graphviz (.dot, and .svg if `dot` exists)")
    space.add_argument("--contributions", action="store_true",
                       help="also count the space without each rule in turn (one saturation "
                            "per rule)")
    space.add_argument("--json", action="store_true", help="print one JSON object")

    exp = sub.add_parser("explore", help="search the space: extract, measure, learn, repeat")
    exp.add_argument("workload", help="a name from `eqsched workloads`")
    exp.add_argument("--size", help="comma-separated sizes (default: the workload's default)")
    exp.add_argument("--trials", type=int, default=64, help="candidates to try (default 64)")
    exp.add_argument("--seconds", type=seconds_arg, help="stop after this much wall time")
    exp.add_argument("--db", default="eqsched.db",
                     help="SQLite results database; re-runs resume from it (default eqsched.db)")
    exp.add_argument("--seed", type=seed_arg, default=0,
                     help="seed of the search (default 0)")
    exp.add_argument("--cost-model", default="learned",
                     help="a registered cost model: learned (default), analytic, random")
    exp.add_argument("--rules", help="rule names or +name/-name edits of the default set")
    exp.add_argument("--limits", help="saturation limits, like iterations=20,seconds=10")
    exp.add_argument("--batch", type=int, default=16, help="candidates per round (default 16)")
    exp.add_argument("--population", type=int,
                     help="candidates the search evolves each round (default: the search's own; "
                          "a chain's first round evolves twice as many)")
    exp.add_argument("--jobs", type=int, default=1,
                     help="measure this many candidates at once (default 1: timings are "
                          "cleanest one at a time)")
    exp.add_argument("--threads", type=int,
                     help="threads for parallel loops (default: every core; 1 for a one-core "
                          "result)")
    exp.add_argument("--repeats", type=int, default=10, help="timed runs per candidate")
    exp.add_argument("--target", default="host", help=TARGET_HELP)
    exp.add_argument("--timeout", type=timeout_arg, default=DEFAULT_TIMEOUT_S,
                     help="seconds per candidate for compile, check and timing")
    exp.add_argument("--max-memory", type=max_memory_arg, help=MEMORY_HELP)
    exp.add_argument("--save-trace", metavar="FILE",
                     help="write the best program's trace (replay with `eqsched run --schedule`)")
    exp.add_argument("--json", action="store_true",
                     help="print one JSON object on stdout (progress goes to stderr)")
    runs = sub.add_parser("runs", help="list a database's runs and their status (an exploration "
                                       "whose process is gone shows as abandoned)")
    runs.add_argument("--db", default="eqsched.db", help="SQLite results database (default "
                                                         "eqsched.db)")
    runs.add_argument("--json", action="store_true", help="print a JSON list")
    for tool in TOOLS:
        tool.add_parser(sub)
    experiment.add_parser(sub, EXPERIMENTS)
    return parser


# ---- eqsched workloads ----------------------------------------------------------------------


def _cmd_workloads(args: argparse.Namespace) -> int:
    rows = [{"name": w.name, "params": list(w.params), "default_size": list(w.default_size),
             "small_size": list(w.small_size), "description": w.description}
            for w in list_workloads()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    table = [("workload", "params", "default size", "")]
    table += [(r["name"], ",".join(r["params"]), ",".join(map(str, r["default_size"])),
               r["description"]) for r in rows]
    widths = [max(len(row[c]) for row in table) for c in range(3)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
    return 0


# ---- eqsched run ----------------------------------------------------------------------------


def _build(args: argparse.Namespace) -> tuple[Workload, tuple[int, ...], Program, list[dict]]:
    wl = get_workload(args.workload)
    steps: list[dict] = []
    meta: dict[str, Any] = {}
    if args.schedule:
        steps, meta = load_trace(args.schedule)
        if meta.get("workload") not in (None, wl.name):
            raise CliError(f"trace {args.schedule} is for workload {meta['workload']!r}, "
                           f"not {wl.name!r}")
    if args.size is not None:
        size = parse_size(args.size, wl)
    elif meta.get("size") is not None:
        size = wl.check_size(meta["size"])
    else:
        size = wl.default_size
    program = naive_program(wl.build(*size))
    if steps:
        program = Schedule.replay(program, steps).program
    return wl, size, program, steps


def _cores_used(program: Program) -> int:
    parallel = any(lp.kind == LoopKind.PARALLEL for lp in program.loops())
    return machine.facts()["usable_cores"] if parallel else 1


def _report(wl: Workload, size: tuple[int, ...], program: Program, steps: list[dict],
            m: Measurement, target: Target) -> dict[str, Any]:
    peak_core = machine_model(target).peak_gflops
    cores = _cores_used(program)
    peak = peak_core * cores if peak_core else None
    return {
        "workload": wl.name,
        "params": list(wl.params),
        "size": list(size),
        "target": m.info.get("backend", {}).get("target"),
        "correct": m.correct,
        "max_err": m.max_err,
        "check_message": m.check_message,
        "median_s": m.median_s,
        "min_s": m.min_s,
        "times": m.times,
        "flops": program.computation.flops,
        "gflops": m.gflops,
        "peak_gflops": peak,
        "cores_used": cores,
        "percent_of_peak": 100 * m.gflops / peak if m.gflops and peak else None,
        "program_hash": program.hash(),
        "program": program.text(),
        "trace": steps,
        "error": m.error,
        "backend": m.info.get("backend"),
        "machine": m.info.get("machine"),
        "settings": m.info.get("settings"),
    }


def _print_report(r: dict[str, Any]) -> None:
    print(f"{r['workload']} {','.join(map(str, r['size']))}  program {r['program_hash']}  "
          f"{len(r['trace'])} schedule steps  target {r['target']}")
    print(f"correct: {r['correct']}  ({r['check_message']})")
    if r["median_s"] is None:
        return
    print(f"time: median {r['median_s'] * 1e3:.4g} ms, min {r['min_s'] * 1e3:.4g} ms "
          f"over {len(r['times'])} runs")
    line = f"{r['gflops']:.4g} GFLOPS"
    if r["percent_of_peak"] is not None:
        line += (f", {r['percent_of_peak']:.1f}% of the target's calibrated peak "
                 f"({r['peak_gflops']:.4g} GFLOPS on {r['cores_used']} core"
                 f"{'s' if r['cores_used'] > 1 else ''})")
    print(line)


def _cmd_run(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.warmup < 0:
        raise CliError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and "
                       f"{args.warmup}")
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads must be >= 1, got {args.threads}")
    target = parse_target(args.target)
    wl, size, program, steps = _build(args)
    try:
        check_fits_in_memory(program.computation, args.max_memory)
    except TooLargeError as err:
        raise CliError(str(err)) from None
    if not args.no_print:
        print(program.text(), file=sys.stderr if args.json else sys.stdout)
    print(f"eqsched: measuring {wl.name} {','.join(map(str, size))} for target {target} ...",
          file=sys.stderr)
    m = measure(program, repeats=args.repeats, warmup=args.warmup, timeout_s=args.timeout,
                seed=args.seed, options=CompileOptions(threads=args.threads, target=target),
                max_memory=args.max_memory)
    if m.error is not None:
        hint = (" (raise --timeout or lower --repeats)" if m.error.startswith("timed out") else
                " (raise --max-memory or lower --size)" if m.error.startswith("out of memory")
                else "")
        raise CliError(f"measuring {wl.name} failed: {m.error}{hint}")
    report = _report(wl, size, program, steps, m, target)
    if args.json:
        print(json.dumps(report))
    else:
        _print_report(report)
    return 0 if m.correct else EXIT_WRONG_RESULT


# ---- eqsched machine ------------------------------------------------------------------------


def _cmd_machine(args: argparse.Namespace) -> int:
    target = parse_target(args.target)
    if args.calibrate:
        print(f"eqsched: calibrating {target} ...", file=sys.stderr)
        model = recalibrate(target)
    else:
        model = machine_model(target)
    if args.json:
        print(json.dumps({**describe(target), "machine_model": model.to_json(),
                          "machine_model_file": str(cache_path(target))}))
        return 0
    if not args.calibrate:
        for key, value in describe(target).items():
            if key == "llvm_cpu_features":
                value = " ".join(f for f in str(value).split(",") if f.startswith("+"))
            print(f"{key}: {value}")
        print()
    print(f"machine model ({cache_path(target)}):")
    for line in model.describe():
        print(f"  {line}")
    return 0


# ---- eqsched space --------------------------------------------------------------------------


def _sample_rows(space: Any, n: int, seed: int) -> list[dict[str, Any]]:
    from .egraph.derive import derive
    from .egraph.term import show

    rows = []
    for term, sizes in space.sample(n, seed):
        rows.append({"term": show(term),
                     "sizes": {f"{g}[{p}]": e for (g, p), e in sizes.items()},
                     "trace": derive(term, sizes, space.naive)})
    return rows


def _cmd_space(args: argparse.Namespace) -> int:
    # The rule modules load only for this command.
    from .egraph.saturate import saturate
    from .egraph.term import vector_lanes
    from .rules import RuleError, resolve

    if args.sample < 0:
        raise CliError(f"--sample must be >= 0, got {args.sample}")
    target = parse_target(args.target, runs_here=False)
    lanes = vector_lanes(target.vector_lanes)
    wl = get_workload(args.workload)
    size = parse_size(args.size, wl) if args.size is not None else wl.default_size
    naive = naive_program(wl.build(*size))
    limits = parse_limits(args.limits)
    try:
        rules = resolve(parse_rules(args.rules))
    except RuleError as err:
        raise CliError(str(err)) from None
    if args.dot is not None:  # before the saturation, not after it
        try:
            check_writable(Path(args.dot).with_suffix(".dot"), "the graph")
        except ValueError:  # "" and "." have no name to put .dot on
            raise CliError(f"bad --dot {args.dot!r}: not a file name") from None
    sat = saturate(naive, rules, limits)
    started = time.perf_counter()
    space = Space(sat, lanes)
    programs, structures = space.count(), space.count_structures()
    rep = sat.report
    out: dict[str, Any] = {
        "workload": wl.name, "size": list(size), "target": target.spec,
        "vector_lanes": list(lanes),
        "stop_reason": rep.stop_reason, "iterations": rep.iterations, "seconds": rep.seconds,
        "enodes": rep.enodes, "eclasses": rep.eclasses, "programs": programs,
        "structures": structures, "count_seconds": time.perf_counter() - started,
        "rolled_back": rep.rolled_back, "matches_per_rule": rep.matches_per_rule,
        "sizes_per_sort": rep.sizes_per_sort,
    }
    if args.sample:
        out["samples"] = _sample_rows(space, args.sample, args.seed)
    if args.contributions:
        out["contributions"] = rule_contributions(naive, rules, limits, lanes)
    if args.dot:
        try:
            dot_file, svg_file = write_dot(space.to_dot(), args.dot)
        except OSError as e:
            raise CliError(f"cannot write the graph to {args.dot} ({e.strerror})") from None
        out["dot"], out["svg"] = str(dot_file), svg_file and str(svg_file)
    # The process peak: saturation, counting and sampling together.
    out["peak_rss_mb"] = max(rep.peak_rss_mb,
                             resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{wl.name} {','.join(map(str, size))}: {out['stop_reason']} after "
          f"{out['iterations']} iterations, {out['seconds']:.3g} s, {out['enodes']} e-nodes, "
          f"{out['eclasses']} e-classes, peak RSS {out['peak_rss_mb']:.0f} MB")
    print(f"programs: {programs} ({float(programs):.3g}) in {structures} structures "
          f"(target {out['target']}: vector loops of {', '.join(map(str, lanes))} lanes)")
    for name, count in sorted(out["matches_per_rule"].items()):
        print(f"  rule {name}: {count} matches")
    for name, count in out.get("contributions", {}).items():
        print(f"  without {name}: {count} programs")
    for row in out.get("samples", []):
        print(f"sample: {row['term']}  sizes {row['sizes']}")
        print(f"  trace: {json.dumps(row['trace'])}")
    if args.dot:
        print(f"wrote {out['dot']}" + (f" and {out['svg']}" if out["svg"] else
                                        " (graphviz `dot` not found: no .svg)"))
    return 0


# ---- eqsched explore ------------------------------------------------------------------------


def _progress_printer(stream: Any) -> Any:
    live = stream.isatty()

    def show(event: str, data: dict[str, Any]) -> None:
        if event == "saturating":
            print(f"eqsched: saturating the space of {data['workload']} "
                  f"{','.join(map(str, data['size']))} ...", file=stream)
        elif event == "saturated" and data["stop_reason"] == "time_limit":
            from .explore import time_limited

            print(f"eqsched: warning: {time_limited(data)}. To build this space again "
                  f"anywhere: --limits iterations={data['iterations']},seconds=3600",
                  file=stream)
        elif event == "learning" and data["as_run"]:
            print(f"eqsched: the learned model starts from what run {data['as_run']} of these "
                  f"settings started from ({data['stored']} stored measurements)", file=stream)
        elif event == "learning" and data["stored"]:
            print(f"eqsched: the learned model starts from {data['stored']} stored measurements "
                  f"of this machine", file=stream)
        elif event == "round":
            best = data["best_gflops"]
            rho = data["spearman"]
            width = 24
            filled = width * data["trials"] // data["of"]
            line = (f"[{'#' * filled}{'.' * (width - filled)}] {data['trials']}/{data['of']} "
                    f"round {data['round']}: ")
            line += f"best {best:.4g} GFLOPS" if best else "no correct program yet"
            line += f", rank corr {rho:+.2f}" if rho is not None else ""
            line += f", {data['measured']} measured"
            if data.get("contended"):
                line += (f", {data['contended']} timings taken again: other processes "
                         f"competed for the cores")
            print(("\r" + line) if live else line, end="" if live else "\n", file=stream,
                  flush=True)
        elif event == "finalists":
            print(f"{chr(10) if live else ''}eqsched: timing the best {data['finalists']} again "
                  f"side by side ({data['rounds']} rounds)", file=stream)
        elif event == "exhausted":
            print(f"\neqsched: {data['reason']}; stopped after {data['trials']} trials",
                  file=stream)

    return show


def _cmd_explore(args: argparse.Namespace) -> int:
    from .db import DatabaseError
    from .explore import ExploreError, Settings, explore
    from .extract.cost import CostModelError
    from .rules import RuleError

    for name in ("trials", "batch", "jobs", "repeats"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.threads is not None and args.threads < 1:
        raise CliError(f"--threads must be >= 1, got {args.threads}")
    if args.population is not None and args.population < 2:
        raise CliError(f"--population must be >= 2, got {args.population}")
    wl = get_workload(args.workload)
    size = parse_size(args.size, wl) if args.size is not None else wl.default_size
    rules = parse_rules(args.rules)
    limits = parse_limits(args.limits)
    settings = Settings(repeats=args.repeats, timeout_s=args.timeout, threads=args.threads,
                        max_memory=args.max_memory,
                        target=parse_target(args.target))
    if args.save_trace is not None:
        check_writable(args.save_trace, "the trace")
    try:
        result = explore(wl.name, size, trials=args.trials, seconds=args.seconds, db=args.db,
                         seed=args.seed, cost_model=args.cost_model, rules=rules,
                         limits=limits, batch=args.batch, jobs=args.jobs,
                         **({} if args.population is None else {"population": args.population}),
                         settings=settings, progress=_progress_printer(sys.stderr))
    except (DatabaseError, CostModelError, RuleError, ExploreError, TooLargeError) as err:
        raise CliError(str(err)) from None
    if sys.stderr.isatty():
        print(file=sys.stderr)
    out = result.to_json()
    if args.save_trace and result.best is not None:  # the naive program's trace is []
        _save_checked_trace(Path(args.save_trace), result.best_trace, wl, size,
                            result.best.program_hash)
        out["trace_file"] = args.save_trace
    if args.json:
        print(json.dumps(out))
    else:
        _print_exploration(out)
    if result.interrupted:
        return resumable_interrupt()
    if result.best is None:
        raise CliError(f"no correct program found in {out['trials']} trials (errors are in "
                       f"{args.db})")
    return 0


def _save_checked_trace(path: Path, trace: list[dict], wl: Workload, size: tuple[int, ...],
                        measured_hash: str) -> None:
    """Save the best program's trace at `path` only once the saved file, read back and replayed
    on the naive program, gives the measured program (`measured_hash`)."""
    from .schedule import save_trace

    written = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_trace(written, trace, workload=wl.name, size=list(size))
        steps, _ = load_trace(written)
        rebuilt = Schedule.replay(naive_program(wl.build(*size)), steps).program.hash()
        if rebuilt != measured_hash:
            raise CliError(f"the saved trace rebuilds program {rebuilt}, not the measured "
                           f"{measured_hash}; {path} not written")
        os.replace(written, path)
    except OSError as e:
        raise CliError(f"cannot write the trace to {path} ({e.strerror})") from None
    finally:
        written.unlink(missing_ok=True)


def _print_exploration(r: dict[str, Any]) -> None:
    if r["program"]:
        print(r["program"])
    print(f"{r['workload']} {','.join(map(str, r['size']))}: {r['trials']} trials "
          f"({r['measured']} measured now, {r['trials'] - r['measured']} from the database) in "
          f"{r['wall_s']:.1f} s, seed {r['seed']}, cost model {r['cost_model']}, target "
          f"{r['target']}")
    if r["best_gflops"] is None:
        return
    line = (f"best: {r['best_gflops']:.4g} GFLOPS, median {r['best_median_s'] * 1e3:.4g} ms, "
            f"checked against numpy")
    if r.get("in_run_best_gflops") is not None:
        line += (f" (the best {len(r['finalists'])} timed again side by side; the rounds' best "
                 f"single measurement read {r['in_run_best_gflops']:.4g})")
    if r["percent_of_peak"] is not None:
        line += f", {r['percent_of_peak']:.1f}% of peak ({r['peak_gflops']:.4g} GFLOPS)"
    if r["speedup_over_naive"] is not None:
        line += f", {r['speedup_over_naive']:.1f}x the naive program"
    print(line)
    rhos = [f"{x['spearman']:+.2f}" if x["spearman"] is not None else "n/a" for x in r["rounds"]]
    print(f"rank correlation (Spearman, predicted vs measured) per round: {' '.join(rhos)}")
    if r.get("trace_file"):
        print(f"trace: {r['trace_file']} (replay: eqsched run {r['workload']} --schedule "
              f"{r['trace_file']})")
    else:
        print(f"trace: {json.dumps(r['trace'])}")


# ---- eqsched runs ---------------------------------------------------------------------------


def _cmd_runs(args: argparse.Namespace) -> int:
    from .db import Database, DatabaseError

    try:
        with Database(args.db, readonly=True) as db:
            runs = db.runs()
    except DatabaseError as err:
        raise CliError(str(err)) from None
    if args.json:
        print(json.dumps(runs))
        return 0
    table = [("run", "problem", "status", "trials", "measured", "best GFLOPS", "started",
              "process")]
    for run in runs:
        summary = run["summary"]
        best = summary.get("best_gflops")
        table.append((
            str(run["id"]), f"{run['workload']} {','.join(map(str, run['size']))}",
            run["status"], str(summary.get("trials", "-")), str(summary.get("measured", "-")),
            f"{best:.4g}" if best else "-",
            time.strftime("%Y-%m-%d %H:%M", time.localtime(run["started_at"])),
            f"{run['pid']}@{run['host']}" if run["pid"] is not None else "-"))
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


COMMANDS = {"workloads": _cmd_workloads, "run": _cmd_run, "machine": _cmd_machine,
            "space": _cmd_space, "explore": _cmd_explore, "runs": _cmd_runs}
# Research tools keep their subcommand beside their code: each module's `add_parser(sub)` adds
# one subparser whose `run` default takes the parsed arguments and returns the exit status.
TOOLS = (batch, report, rulekit, tune_model)
EXPERIMENTS = (compare, distribution, ranking)  # under `eqsched experiment`


def _terminate_like_ctrl_c(signum: int, frame: Any) -> None:
    """SIGTERM handler: what Ctrl-C does. The terminal sends SIGINT to the whole process group,
    so batch's pool processes get it too (each stops its exploration); SIGTERM reaches only this
    process, which passes SIGINT on to them. Measuring workers ignore SIGINT either way."""
    for child in multiprocessing.active_children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGINT)
    raise KeyboardInterrupt


def _one_line_warning(message: Warning | str, category: type[Warning], *args: Any,
                      **kwargs: Any) -> str:
    return f"eqsched: warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    warnings.formatwarning = _one_line_warning  # a warning is a line, like an error
    # Signal handlers can only be set from the main thread (main() called from another thread
    # keeps the default).
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate_like_ctrl_c) if in_main_thread else None
    try:
        return COMMANDS[args.command](args) if args.command in COMMANDS else args.run(args)
    except (CliError, WorkloadError, ScheduleError, BackendError, SpaceError,
            CalibrationError, SaturationError) as err:
        message = str(err).strip().splitlines()
        print(f"eqsched: error: {message[0] if message else type(err).__name__}", file=sys.stderr)
    except KeyboardInterrupt:
        print("\neqsched: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug, still reported in one line rather than a traceback
        print(f"eqsched: error: internal error: {type(err).__name__}: {err}", file=sys.stderr)
    except BaseException as err:
        # A Rust panic (pyo3's PanicException) is a BaseException that no `except Exception`
        # stops; anything else (SystemExit) goes on.
        if type(err).__name__ != "PanicException":
            raise
        message = str(err).strip().splitlines()
        print(f"eqsched: error: internal error: a library panicked: "
              f"{message[0] if message else 'no message'}", file=sys.stderr)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    return EXIT_ERROR
