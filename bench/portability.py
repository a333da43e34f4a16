"""Performance that travels: eqsched (64 trials) against numpy and onnxruntime on the host, on an
AVX2 target, on awkward shapes, and on two threads against one.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/portability.py
    ... --only matmul-127 conv2d-late --targets host --trials 32

One command runs every part, each in a child process of its own, because OpenBLAS picks its
kernel when numpy is imported: the `host` part runs with OPENBLAS_CORETYPE unset (OpenBLAS's
kernel for this CPU), the `host,-avx512f` part with OPENBLAS_CORETYPE=Haswell (its AVX2 kernel),
both set for that child only. In each part every case explores with a fresh database and one
thread, then the best program, numpy's strongest formulation (`Workload.numpy_baseline`:
buffers allocated once, one BLAS thread) and onnxruntime (one intra-op thread, inputs and output
bound once) are timed alternately, so all three see the same machine noise, and each ratio is
the median of the rounds' own ratios (`paired_speedup`), which a host whose speed drifts over
seconds does not move. The `threads` part explores matmul 1024³, conv2d and mm_exp_mm with two
threads and times that winner on two threads beside the one-thread winner on one thread, and
onnxruntime on one and on two threads in the same rounds: what two threads buy on this machine.

A convolution's filter is a layer's weight: the same on every call. Both sides get it so
(`CONSTANTS`): onnxruntime as an initializer, which its Conv packs once when the session loads,
and eqsched as a constant of the computation (`Computation.with_constants`), whose packs of it
are the program's preparation, run once when the kernel is bound. Given the filter as a graph
input instead, onnxruntime packs it on every call, and the conv rows would be measured against
its weaker formulation.

Bars (issue 13): every row >= 0.9x numpy on the host and >= 0.85x on the AVX2 target; conv2d
rows >= 0.9x onnxruntime; two threads >= 1.8x one.

Each row also gives each side's share of the peak of the instructions it runs (the calibrated
`MachineModel.peak_gflops`): eqsched's of the target's, onnxruntime's of the host's, because
onnxruntime picks its kernels from the CPU and runs AVX-512 on an AVX-512 host whatever the
target (numpy's OpenBLAS kernel is chosen to match the target). The AVX2 rows stand for
AVX2 code "on this same core, where AVX2 code can reach the same peak" (the issue): true of a
core that runs AVX-512 as two 256-bit halves (Zen 4), not of one with full-width 512-bit units
(Zen 5, Intel's two-FMA-port parts), where the target's peak is half the host's. There the
conv2d rows' onnxruntime bar compares the two shares of peak, and the row says so.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# name -> (workload, size)
CASES = {
    "matmul-512": ("matmul", (512, 512, 512)),
    "matmul-1024": ("matmul", (1024, 1024, 1024)),
    "conv2d-resnet": ("conv2d_nchw", (1, 64, 56, 56, 64, 3, 3, 1, 1)),
    "mm_exp_mm": ("mm_exp_mm", (1024, 2048, 1024, 3072)),
    "matmul-127": ("matmul", (127, 127, 127)),
    "matmul-1000": ("matmul", (1000, 1000, 1000)),
    "matmul-197x3072x768": ("matmul", (197, 3072, 768)),
    "conv2d-late": ("conv2d_nchw", (1, 512, 7, 7, 512, 3, 3, 1, 1)),
}
THREAD_CASES = ("matmul-1024", "conv2d-resnet", "mm_exp_mm")
CONSTANTS = {"conv2d_nchw": ("W",)}  # workload -> its inputs that are weights
TARGETS = {"host": None, "host,-avx512f": "Haswell"}  # target -> OPENBLAS_CORETYPE
NUMPY_BAR = {"host": 0.9, "host,-avx512f": 0.85}
ORT_BAR, THREADS_BAR = 0.9, 1.8
# A target whose peak is under this share of the host's runs narrower instructions than the
# host's onnxruntime (AVX2 beside full-width AVX-512: 0.5); on a core that splits 512-bit work
# into halves the two peaks are one (calibrated within a few percent).
EQUAL_PEAKS = 0.9


def threads_for_libraries(threads: int) -> None:
    """Must run before numpy is imported: `threads` BLAS / OpenMP threads. OpenBLAS's threads
    spin after each call for about 2^28 cycles by default, on the cores the program timed next
    in a round needs; 2^20 is about as long as eqsched's own team spins
    (`backend.team.SPIN_TICKS`)."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(threads)
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = "20"


def session_options(threads: int):
    """onnxruntime session options on `threads` intra-op threads that do not spin: the pool's
    threads spin after each run by default, on the cores the program timed next in a round
    needs (beside eqsched's two-thread kernel they halved it)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def computation(workload: str, size: tuple[int, ...]):
    """The workload at `size`, its weights (`CONSTANTS`) constant."""
    from eqsched.workloads import get_workload

    comp = get_workload(workload).build(*size)
    return comp.with_constants(CONSTANTS[workload]) if workload in CONSTANTS else comp


def onnxruntime_run(workload: str, size: tuple[int, ...], inputs: dict,
                    threads: int = 1) -> Callable[[], None]:
    """An onnxruntime session of the workload on `threads` intra-op threads, with its buffers
    bound once and its weights (`CONSTANTS`) initializers."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    def tensor(name: str, shape) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))

    if workload == "matmul":
        m, n, _ = size
        nodes = [helper.make_node("MatMul", ["A", "B"], ["C"])]
        feeds, out, out_shape = ["A", "B"], "C", (m, n)
    elif workload == "mm_exp_mm":
        m, _, _, n = size
        nodes = [helper.make_node("MatMul", ["A", "B"], ["C"]),
                 helper.make_node("Exp", ["C"], ["D"]),
                 helper.make_node("MatMul", ["D", "E"], ["F"])]
        feeds, out, out_shape = ["A", "B", "E"], "F", (m, n)
    elif workload == "conv2d_nchw":
        nb, _, h, w, k, r, s, stride, pad = size
        oh, ow = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1
        nodes = [helper.make_node("Conv", ["I", "W"], ["O"], kernel_shape=[r, s],
                                  strides=[stride, stride], pads=[pad] * 4)]
        feeds, out, out_shape = ["I", "W"], "O", (nb, k, oh, ow)
    else:
        raise SystemExit(f"no onnxruntime formulation of {workload}")
    by_feed = dict(zip(feeds, {"matmul": ["A", "B"], "mm_exp_mm": ["A", "B", "E"],
                               "conv2d_nchw": ["X", "W"]}[workload]))
    weights = [f for f in feeds if by_feed[f] in CONSTANTS.get(workload, ())]
    feeds = [f for f in feeds if f not in weights]
    graph = helper.make_graph(nodes, workload, [tensor(f, inputs[by_feed[f]].shape) for f in feeds],
                              [tensor(out, out_shape)],
                              [numpy_helper.from_array(inputs[by_feed[w]], w) for w in weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = session_options(threads)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    for feed in feeds:
        binding.bind_cpu_input(feed, np.ascontiguousarray(inputs[by_feed[feed]], np.float32))
    result = np.empty(out_shape, np.float32)
    binding.bind_output(out, "cpu", 0, np.float32, out_shape, result.ctypes.data)
    run_options = ort.RunOptions()

    def run() -> None:
        session.run_with_iobinding(binding, run_options)

    run.output = result  # type: ignore[attr-defined]
    return run


def sampled(fns: list[Callable[[], None]], repeats: int,
            window: float = 0.02, seed: int = 0) -> list[list[float]]:
    """Seconds per call of each function, one sample per function in each of `repeats` rounds;
    a round times every function once, in an order shuffled each round (seeded).

    Each sample calls a function back to back for about `window` seconds, so a program of a
    tenth of a millisecond is not timed against the clock's resolution, after one untimed call.
    A call right after another function's can run slower (the caches, and whatever else that
    function left, are not its own): one conv2d program timed in two places of each round ran
    10-12% slower right after numpy's. In a fixed order each function always follows the same
    one, and that bias does not pair away; the untimed call takes part of it, and the shuffled
    order spreads the rest over every function."""
    calls = []
    for fn in fns:
        fn()  # warm
        start = time.perf_counter()
        fn()
        calls.append(max(1, round(window / max(time.perf_counter() - start, 1e-7))))
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    shuffle = random.Random(seed).shuffle
    for _ in range(repeats):
        shuffle(order)
        for index in order:
            fn, n = fns[index], calls[index]
            fn()
            start = time.perf_counter()
            for _ in range(n):
                fn()
            times[index].append((time.perf_counter() - start) / n)
    return times


def summary(samples: list[float]) -> tuple[float, float]:
    """(median, spread): the spread is (upper - lower quartile) / median, printed so a row
    measured in a noise burst shows itself."""
    quartiles = statistics.quantiles(samples, n=4)
    median = statistics.median(samples)
    return median, (quartiles[2] - quartiles[0]) / median


def timed(fns: list[Callable[[], None]], repeats: int,
          window: float = 0.02) -> list[tuple[float, float]]:
    """(median, spread) seconds per call of each function, sampled alternately."""
    return [summary(samples) for samples in sampled(fns, repeats, window)]


def paired_speedup(ours: list[float], theirs: list[float]) -> float:
    """How many times faster `ours` ran than `theirs`: the median over rounds of each round's
    ratio. A shared host's speed drifts over seconds (both functions of a round see the same
    speed; rounds apart do not), so the ratio of two medians taken over the whole run moves
    with the drift and the median of the rounds' ratios does not."""
    return statistics.median(t / o for o, t in zip(ours, theirs, strict=True))


@dataclass
class Winner:
    """A case's program, and what its exploration said of it (None when it was replayed)."""

    program: Any
    trace: list[dict]
    explore_s: float | None = None
    in_run: float | None = None  # the rounds' best single timing (the winner's curse)
    remeasured: float | None = None  # the finalists' best, re-measured side by side


def winner(workload: str, size: tuple[int, ...], trials: int, seed: int, threads: int,
           target: str, label: str, saved: Path | None) -> Winner | None:
    """The exploration's best program, or the one in the trace file `saved` (an earlier run's
    `--traces`: re-timing winners costs seconds, exploring them minutes)."""
    comp = computation(workload, size)
    if saved is not None:
        from eqsched.ir import naive_program
        from eqsched.schedule import Schedule, load_trace

        steps, _ = load_trace(saved)
        return Winner(Schedule.replay(naive_program(comp), steps).program, steps)
    from eqsched.explore import Settings, TaskTuner

    with tempfile.TemporaryDirectory() as tmp:
        # `explore` of the workload, with its weights constant.
        tuner = TaskTuner(comp, key=(workload, list(size)), trials=trials, seed=seed,
                          db=str(Path(tmp) / "b.db"),
                          settings=Settings(threads=threads, target=target),
                          progress=lambda event, data: print(f"  {label}: {event} {data}",
                                                             file=sys.stderr, flush=True))
        try:
            tuner.tune(trials)
        finally:
            result = tuner.close()
    if result.best_program is None:
        return None
    return Winner(result.best_program, result.best_trace, result.wall_s,
                  result.in_run_best_gflops or result.best.gflops,
                  result.best.gflops if result.finalists else None)


def aligned_inputs(comp) -> dict:
    """`random_inputs(comp, 0)` on 64-byte boundaries, as the explore's worker hands them to a
    kernel (`runner.kernel_inputs`): a winner timed here on rows the allocator put 16 bytes past
    a cache line ran 2x slower on AVX2 than it had in the exploration (docs/ARCHITECTURE.md §11).
    numpy and onnxruntime get the same arrays."""
    from eqsched.backend import aligned_copy
    from eqsched.reference import random_inputs

    return {name: aligned_copy(array) for name, array in random_inputs(comp, 0).items()}


def kernel_run(program, inputs: dict, threads: int, target: str,
               **settings: Any) -> Callable[[], None]:
    """`program` compiled (with these further `CompileOptions` settings) and bound to `inputs`
    and outputs of its own, its preparation (packs of its constants) run once, as the
    explore's runner times it."""
    from eqsched.backend import CompileOptions, Target, aligned_empty, compile_program

    kernel = compile_program(program, CompileOptions(threads=threads, target=Target.parse(target),
                                                     **settings))
    arrays = [inputs[b.name] for b in program.inputs]
    outputs = {b.name: aligned_empty(b.shape) for b in program.outputs}
    arrays += list(outputs.values())
    run = kernel.prepared(*arrays)
    run.outputs = outputs  # type: ignore[attr-defined]
    return run


def check(label: str, comp, got: dict, want: dict) -> None:
    import numpy as np

    from eqsched.reference import compare, tolerance

    ok, _, message = compare(got, {k: np.asarray(v, np.float64) for k, v in want.items()},
                             tolerance(comp))
    if not ok:
        raise SystemExit(f"{label}: disagrees with numpy: {message}")


def peaks(target: str) -> tuple[float, float]:
    """The calibrated one-core peaks (GFLOPS) of `target` and of the host, whose instructions
    onnxruntime runs."""
    from eqsched.backend import Target
    from eqsched.machine_model import machine_model

    return machine_model(Target.parse(target)).peak_gflops, machine_model().peak_gflops


def part_target(target: str, cases: list[str], trials: int, seed: int, repeats: int,
                replay: Path | None) -> list:
    from eqsched.workloads import get_workload

    peak, host_peak = peaks(target)
    rows = []
    for name in cases:
        workload, size = CASES[name]
        label = f"{name} [{target}]"
        best = winner(workload, size, trials, seed, 1, target, label,
                      replay and replay / f"{trace_stem(name, target)}.json")
        if best is None:
            rows.append({"case": name, "target": target, "error": "no correct program"})
            continue
        wl = get_workload(workload)
        comp = computation(workload, size)
        inputs = aligned_inputs(comp)
        ours = kernel_run(best.program, inputs, 1, target)
        numpy_run = wl.numpy_baseline(inputs, *size)
        ort_run = onnxruntime_run(workload, size, inputs)
        ours()
        want = numpy_run()
        check(label, comp, ours.outputs, want)
        ort_run()
        check(f"{label} onnxruntime", comp, {next(iter(ours.outputs)): ort_run.output}, want)
        samples = sampled([ours, numpy_run, ort_run], repeats)
        stats = [summary(s) for s in samples]
        eq, npy, ort = (comp.flops / median / 1e9 for median, _ in stats)
        rows.append({"case": name, "target": target, "eqsched": eq, "numpy": npy,
                     "onnxruntime": ort, "peak": peak, "host_peak": host_peak,
                     "vs_numpy": paired_speedup(samples[0], samples[1]),
                     "vs_onnxruntime": paired_speedup(samples[0], samples[2]),
                     "spread": max(spread for _, spread in stats),
                     "explore_s": best.explore_s, "trials": trials, "workload": workload,
                     "in_run": best.in_run, "remeasured": best.remeasured,
                     "size": list(size), "trace": best.trace})
        print(f"{label}: {eq:.1f} / numpy {npy:.1f} / onnxruntime {ort:.1f} GFLOPS",
              file=sys.stderr, flush=True)
    return rows


def part_threads(cases: list[str], trials: int, seed: int, repeats: int,
                 replay: Path | None) -> list:
    from eqsched.workloads import get_workload

    rows = []
    for name in cases:
        workload, size = CASES[name]
        comp = computation(workload, size)
        inputs = aligned_inputs(comp)
        runs, traces = [], []
        for threads in (1, 2):
            label = f"{name} [{threads} threads]"
            best = winner(workload, size, trials, seed, threads, "host", label,
                          replay and replay / f"{thread_trace_stem(name, threads)}.json")
            if best is None:
                raise SystemExit(f"{label}: no correct program")
            runs.append(kernel_run(best.program, inputs, threads, "host"))
            traces.append(best.trace)
            runs[-1]()
        want = get_workload(workload).numpy_baseline(inputs, *size)()
        for run in runs:
            check(name, comp, run.outputs, want)
        # What two threads buy a strong library on this machine: a shared host's second core
        # is not always a whole core, and this says how far from 2x the machine itself is.
        runs += [onnxruntime_run(workload, size, inputs, threads) for threads in (1, 2)]
        samples = sampled(runs, repeats)
        stats = [summary(s) for s in samples]
        one, two = (comp.flops / median / 1e9 for median, _ in stats[:2])
        rows.append({"case": name, "one": one, "two": two, "workload": workload,
                     "speedup": paired_speedup(samples[1], samples[0]),
                     "onnxruntime_speedup": paired_speedup(samples[3], samples[2]),
                     "size": list(size), "spread": max(spread for _, spread in stats),
                     "trace_one": traces[0], "trace_two": traces[1]})
    return rows


def judged_onnxruntime_ratio(row: dict) -> tuple[float, bool]:
    """The ratio a conv2d row's onnxruntime bar judges, and whether it is of shares of peak:
    the plain ratio, unless the target's peak is clearly under the host's (`EQUAL_PEAKS`),
    where onnxruntime's kernels run the host's wider instructions."""
    narrower = row["peak"] < EQUAL_PEAKS * row["host_peak"]
    if not narrower:
        return row["vs_onnxruntime"], False
    return row["vs_onnxruntime"] * row["host_peak"] / row["peak"], True


def report(rows_by_target: dict[str, list], thread_rows: list) -> bool:
    ok = True
    for target, rows in rows_by_target.items():
        numpy_name = "numpy" + (" (Haswell kernel)" if TARGETS[target] else "")
        width = max(7, len(numpy_name))
        print(f"\n== target {target}: one thread, GFLOPS, medians of alternating runs; ratios: "
              f"medians of each round's ratio; peak: of the instructions each side runs ==")
        print(f"{'case':<21} {'eqsched':>8} {'peak':>5} {numpy_name:>{width}} {'ratio':>6} "
              f"{'onnxrt':>7} {'peak':>5} {'ratio':>6} {'explore s':>9} {'spread':>6} "
              f"{'in-run':>7} {'finals':>7}")
        shares = False
        for row in rows:
            if "error" in row:
                print(f"{row['case']:<21} {row['error']}  BELOW")
                ok = False
                continue
            r_np = row["vs_numpy"]
            r_ort, of_peak = judged_onnxruntime_ratio(row)
            conv = row["case"].startswith("conv2d")
            good = r_np >= NUMPY_BAR[target] and (not conv or r_ort >= ORT_BAR)
            ok &= good
            shares |= conv and of_peak
            print(f"{row['case']:<21} {row['eqsched']:>8.1f} {row['eqsched'] / row['peak']:>5.0%} "
                  f"{row['numpy']:>{width}.1f} {r_np:>6.2f} "
                  f"{row['onnxruntime']:>7.1f} {row['onnxruntime'] / row['host_peak']:>5.0%} "
                  f"{row['vs_onnxruntime']:>6.2f} {_or_dash(row['explore_s']):>9} "
                  f"{row['spread']:>6.1%} {_or_dash(row['in_run']):>7} "
                  f"{_or_dash(row['remeasured']):>7}  {'ok' if good else 'BELOW'}"
                  + (f" (of peak {r_ort:.2f})" if conv and of_peak else ""))
        print(f"(bars: >= {NUMPY_BAR[target]} x numpy; conv2d >= {ORT_BAR} x onnxruntime; "
              f"in-run: the exploration's best single timing, finals: its finalists' best "
              f"re-measured side by side, both in its worker)")
        if shares:
            row = next(row for row in rows if "peak" in row)
            print(f"(this target's peak, {row['peak']:.1f} GFLOPS, is "
                  f"{row['peak'] / row['host_peak']:.2f}x the host's {row['host_peak']:.1f}, "
                  f"whose instructions onnxruntime runs: its conv2d bar compares shares of "
                  f"each one's peak)")
    if thread_rows:
        print("\n== two threads vs one (host; each its own exploration's winner; speedup: "
              "the median of each round's ratio) ==")
        print(f"{'case':<21} {'1 thread':>9} {'2 threads':>9} {'speedup':>8} {'onnxrt':>7} "
              f"{'spread':>6}")
        for row in thread_rows:
            speedup = row["speedup"]
            ok &= speedup >= THREADS_BAR
            print(f"{row['case']:<21} {row['one']:>9.1f} {row['two']:>9.1f} {speedup:>8.2f} "
                  f"{row['onnxruntime_speedup']:>7.2f} {row['spread']:>6.1%}  "
                  f"{'ok' if speedup >= THREADS_BAR else 'BELOW'}")
        print(f"(bar: >= {THREADS_BAR} x; onnxrt: onnxruntime's own two-thread speedup, timed "
              f"in the same rounds)")
    return ok


def _or_dash(figure: float | None) -> str:
    """A figure of the exploration, '-' where there was none (replayed, or no finalists)."""
    return "-" if figure is None else f"{figure:.1f}"


def trace_stem(case: str, target: str) -> str:
    return f"{case}-{target.replace(',', '')}"


def thread_trace_stem(case: str, threads: int) -> str:
    return f"{case}-{('one', 'two')[threads - 1]}-threads"


def write_traces(directory: Path, rows_by_target: dict[str, list], thread_rows: list) -> None:
    from eqsched.schedule import save_trace

    directory.mkdir(parents=True, exist_ok=True)
    files = [(trace_stem(row["case"], target), row, "trace")
             for target, rows in rows_by_target.items() for row in rows if "trace" in row]
    files += [(thread_trace_stem(row["case"], threads), row, key)
              for row in thread_rows for threads, key in ((1, "trace_one"), (2, "trace_two"))]
    for stem, row, key in files:
        save_trace(directory / f"{stem}.json", row[key], workload=row["workload"],
                   size=row["size"])


def run_part(argv: list[str], coretype: str | None) -> list:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, __file__, *argv, "--part-out", out.name], env=env,
                       check=True)
        return json.loads(Path(out.name).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="cases (default all)")
    ap.add_argument("--targets", nargs="*", choices=sorted(TARGETS), default=list(TARGETS))
    ap.add_argument("--no-threads", action="store_true", help="skip the two-thread part")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=15, help="alternating timing runs")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--traces", metavar="DIR", help="write each winner's trace here (replay "
                    "with `eqsched run WORKLOAD --size ... --schedule FILE --target ...`)")
    ap.add_argument("--replay", metavar="DIR", type=Path,
                    help="time the winners an earlier run wrote with --traces DIR instead of "
                         "exploring again")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--part-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    cases = args.only or list(CASES)
    common = ["--trials", str(args.trials), "--seed", str(args.seed), "--repeats",
              str(args.repeats), "--only", *cases]
    if args.replay:
        common += ["--replay", str(args.replay.resolve())]
    if args.part:
        threads_for_libraries(1)
        if args.part == "threads":
            rows = part_threads([c for c in cases if c in THREAD_CASES], args.trials, args.seed,
                                args.repeats, args.replay)
        else:
            rows = part_target(args.part, cases, args.trials, args.seed, args.repeats,
                               args.replay)
        Path(args.part_out).write_text(json.dumps(rows))
        return
    rows_by_target = {t: run_part(["--part", t, *common], TARGETS[t]) for t in args.targets}
    thread_rows = []
    if not args.no_threads and any(c in THREAD_CASES for c in cases):
        thread_rows = run_part(["--part", "threads", *common], None)
    if args.traces:
        write_traces(Path(args.traces), rows_by_target, thread_rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"targets": rows_by_target,
                                               "threads": thread_rows}, indent=1))
    sys.exit(0 if report(rows_by_target, thread_rows) else 1)


if __name__ == "__main__":
    main()
