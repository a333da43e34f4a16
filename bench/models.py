"""Whole models end to end: each built-in model tuned by `tune_model`, then its latency beside
numpy's own evaluation of the graph and onnxruntime's, one thread and two, in one run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/models.py --trials 1000
    ... --only mlp --trials 64 --threads 1
    ... --schedulers --only bert_layer --budgets 200 500 1000 --keep kept/  # the schedulers
    ... --retime kept/ --only bert_layer

Per model and thread count, the model is tuned into a fresh database with that many threads
(a one-thread program has no parallel loop to use a second core; `--keep DIR` keeps a copy as
`<model>.x<threads>.<trials>.db`), then the compiled model,
`Model.evaluate` (numpy, one BLAS thread per thread asked) and an onnxruntime session of the
model's ONNX export (`intra_op_num_threads` = threads) are timed alternately, so all three see
the same machine noise; each figure is a median, each ratio the median of the rounds' own
ratios (`portability.paired_speedup`). `--json FILE` is rewritten as each model is done, so a
run cut short keeps what it measured. Bar (issue 15): the BERT layer and the ResNet
block at >= 1.0x onnxruntime's speed on one thread with at most 1,000 trials in all.
`--conv winograd` has eqsched compute 3x3 stride-1 convolutions by Winograd F(2x2, 3x3)
(`model.winograd`; each row records its `conv`); numpy and onnxruntime run the model as it is.

`--schedulers` instead tunes one model with each task scheduler for the largest budget, keeps a
copy of its database as the run passes each budget, and then times the model compiled from
every copy alternately, beside onnxruntime, so all the latencies after 200, 500 and 1,000
trials share one machine's noise. `--keep DIR` keeps the copies; `--retime DIR` only times
them again (tuning is long, and the timing wants a quiet machine). `--schedulers gradient`
tunes and times one scheduler alone, so two processes can tune the two side by side into one
`--keep DIR` for one `--retime DIR`.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
from pathlib import Path

from eqsched.args import early_stopping_arg
from eqsched.task_scheduler import EARLY_STOPPING

MODELS = {"mlp": {}, "mlp-64": {"batch": 64}, "bert_layer": {}, "resnet_block": {}}
BAR_MODELS, BAR = ("bert_layer", "resnet_block"), 1.0
SCHEDULERS = ["gradient", "round-robin"]


def onnxruntime_run(model, threads: int, inputs: dict):
    import onnxruntime as ort
    from portability import session_options

    from eqsched.model import to_onnx

    session = ort.InferenceSession(to_onnx(model).SerializeToString(), session_options(threads),
                                   providers=["CPUExecutionProvider"])
    named = model.source_names
    feed = {named.get(k, k): v for k, v in inputs.items()}
    return lambda: session.run(None, feed)


def part_model(name: str, threads: int, trials: int, seed: int, repeats: int,
               keep: Path | None = None, conv: str = "direct") -> dict:
    from portability import paired_speedup, sampled, summary

    from eqsched.backend import CompileOptions, Target
    from eqsched.compiled_model import CompiledModel
    from eqsched.model import get_model
    from eqsched.model.winograd import applies, winograd
    from eqsched.tools.tune_model import tune_model

    source = get_model(name.split("-")[0], **MODELS[name])
    # numpy and onnxruntime run the model as it is; eqsched the model whose convolutions
    # compute as --conv says (a model without one Winograd takes computes as it is).
    winograd_applies = any(applies(source, n) for n in source.nodes)
    model = winograd(source) if conv == "winograd" and winograd_applies else source
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "models.db"
        tuned = tune_model(model, trials, db=db, seed=seed, threads=threads,
                           progress=lambda event, data: event == "tasks" and print(
                               f"  {name} x{threads}: {data['trials']}/{data['of']} trials",
                               file=sys.stderr, flush=True))
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            copy_database(db, keep / f"{name}.x{threads}.{tuned.trials}.db")
        compiled = CompiledModel(model, db=db, options=CompileOptions(
            threads=threads, target=Target.parse("host")))
        inputs = compiled.random_inputs(seed)
        verdict = compiled.check(inputs)
        if not verdict:
            raise SystemExit(f"{name} x{threads}: {verdict.message}")
        samples = sampled([lambda: compiled(inputs), onnxruntime_run(source, threads, inputs),
                           lambda: source.evaluate(inputs)], repeats)
    ours, theirs, numpy_eval = (summary(s) for s in samples)
    return {"model": name, "threads": threads, "trials": tuned.trials,
            "conv": conv if model is not source else "direct",
            "eqsched_s": ours[0], "onnxruntime_s": theirs[0], "numpy_s": numpy_eval[0],
            "vs_onnxruntime": paired_speedup(samples[0], samples[1]),
            "default_s": tuned.default_latency_s, "spread": max(ours[1], theirs[1]),
            "tasks": tuned.tasks}


def copy_database(source: Path, copy: Path) -> None:
    """A consistent copy of a SQLite database, its write-ahead log included (a file copy of a
    database in WAL mode can miss the measurements still in the log)."""
    copy.unlink(missing_ok=True)
    with sqlite3.connect(source) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)


def part_schedulers(name: str, schedulers: list[str], budgets: list[int], seed: int,
                    keep: Path, early_stopping: int | None = EARLY_STOPPING) -> None:
    """Tune `name` with each scheduler for the largest budget, in one run per scheduler, and
    keep a copy of its database as it passes each budget in `keep`, named
    `<model>.<scheduler>.<trials>.db` (the trials spent when the copy was made: the first
    slice's end at or past the budget): a tuning curve, as Ansor's and MetaSchedule's are
    read. A run per budget would search its first trials again for every budget.
    `time_schedulers` times the copies side by side afterwards."""
    from eqsched.model import get_model
    from eqsched.tools.tune_model import tune_model

    model = get_model(name.split("-")[0], **MODELS[name])
    keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for scheduler in schedulers:
            db = Path(tmp) / f"{scheduler}.db"
            pending = sorted(budgets)[:-1]

            def progress(event: str, data: dict) -> None:  # called within this iteration
                if event != "tasks":
                    return
                print(f"  {name} {scheduler}: {data['trials']}/{data['of']} trials",
                      file=sys.stderr, flush=True)
                passed = [budget for budget in pending if data["trials"] >= budget]
                if passed:
                    del pending[:len(passed)]
                    copy_database(db, keep / f"{name}.{scheduler}.{data['trials']}.db")

            result = tune_model(model, max(budgets), scheduler=scheduler, db=db, seed=seed,
                                threads=1, early_stopping=early_stopping, progress=progress)
            copy_database(db, keep / f"{name}.{scheduler}.{result.trials}.db")
            print(f"  {name} {scheduler}: {result.trials} trials, "
                  f"{result.latency_s * 1e3:.3f} ms when it ended, "
                  f"{'correct' if result.correct else 'WRONG'}", file=sys.stderr, flush=True)


def time_schedulers(name: str, keep: Path, schedulers: list[str], repeats: int,
                    seed: int) -> list[dict]:
    """The end-to-end latency of every database kept for `name` by `schedulers`, timed
    alternately with each other and with onnxruntime's, so every budget and scheduler sees the
    same machine noise."""
    from portability import paired_speedup, sampled, summary

    from eqsched.backend import CompileOptions, Target
    from eqsched.compiled_model import CompiledModel
    from eqsched.model import get_model

    model = get_model(name.split("-")[0], **MODELS[name])
    kept = sorted((p for p in keep.glob(f"{name}.*.*.db") if p.stem.split(".")[1] in schedulers),
                  key=lambda p: (p.stem.split(".")[1], int(p.stem.split(".")[2])))
    if not kept:
        raise SystemExit(f"{keep}: no databases kept for {name}")
    options = CompileOptions(threads=1, target=Target.parse("host"))
    compiled = [CompiledModel(model, db=db, options=options) for db in kept]
    inputs = compiled[0].random_inputs(seed)
    verdicts = [c.check(inputs) for c in compiled]
    calls = [lambda c=c: c(inputs) for c in compiled] + [onnxruntime_run(model, 1, inputs)]
    samples = sampled(calls, repeats)
    ort_s = summary(samples[-1])[0]
    return [{"model": name, "scheduler": db.stem.split(".")[1],
             "trials": int(db.stem.split(".")[2]), "latency_s": median, "spread": spread,
             "onnxruntime_s": ort_s, "vs_onnxruntime": paired_speedup(s, samples[-1]),
             "correct": bool(v)}
            for db, s, (median, spread), v in zip(kept, samples, map(summary, samples),
                                                  verdicts)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), help="models (default all)")
    ap.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--trials", type=int, default=1000, help="trials per model, in all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=15, help="alternating timing runs")
    ap.add_argument("--schedulers", nargs="*", choices=SCHEDULERS,
                    help="gradient vs round-robin instead, after each of --budgets (default: "
                         "both; one alone lets two processes tune side by side into one --keep)")
    ap.add_argument("--budgets", nargs="*", type=int, default=[200, 500, 1000])
    ap.add_argument("--keep", help="keep each model's database here (<model>.x<threads>."
                    "<trials>.db); with --schedulers, each budget's")
    ap.add_argument("--early-stopping", type=early_stopping_arg, default=EARLY_STOPPING,
                    metavar="N|off", help="with --schedulers: a task is done after N trials "
                    "without a gain (default off: the whole budget)")
    ap.add_argument("--retime", metavar="DIR",
                    help="time the databases a --schedulers --keep DIR run kept, tuning nothing")
    ap.add_argument("--conv", choices=("direct", "winograd"), default="direct",
                    help="how eqsched computes 3x3 stride-1 convolutions (tune-model --conv)")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from portability import threads_for_libraries  # imports no numpy

    names = args.only or list(MODELS)
    if args.part:  # one thread count in a child, its BLAS and OpenMP set before numpy loads
        threads = int(args.part)
        threads_for_libraries(threads)
        keep = Path(args.keep) if args.keep else None
        for n in names:  # a row a line, as each model is done: a cut-short run keeps them
            print(json.dumps(part_model(n, threads, args.trials, args.seed, args.repeats, keep,
                                        args.conv)), flush=True)
        return
    if args.schedulers is not None or args.retime:
        threads_for_libraries(1)
        rows = []
        for n in names:
            with tempfile.TemporaryDirectory() as tmp:
                keep = Path(args.keep or args.retime or tmp)
                schedulers = args.schedulers or SCHEDULERS
                if not args.retime:
                    part_schedulers(n, schedulers, args.budgets, args.seed, keep,
                                    args.early_stopping)
                rows += time_schedulers(n, keep, schedulers, args.repeats, args.seed)
        print("model         scheduler     trials  latency ms  onnxrt ms  vs onnxrt  spread")
        for r in rows:
            print(f"{r['model']:<13} {r['scheduler']:<13} {r['trials']:>6}  "
                  f"{r['latency_s'] * 1e3:10.3f}  {r['onnxruntime_s'] * 1e3:9.3f}  "
                  f"{r['vs_onnxruntime']:8.2f}x  {r['spread']:5.1%}"
                  f"{'' if r['correct'] else '  WRONG'}")
    else:
        import subprocess

        rows = []
        for threads in args.threads:
            with subprocess.Popen([sys.executable, __file__, "--part", str(threads), "--only",
                                   *names, "--trials", str(args.trials), "--seed",
                                   str(args.seed), "--repeats", str(args.repeats),
                                   "--conv", args.conv,
                                   *(["--keep", args.keep] if args.keep else [])],
                                  stdout=subprocess.PIPE, text=True) as part:
                for line in part.stdout:
                    rows.append(json.loads(line))
                    if args.json:  # every row so far, should the run be cut short
                        Path(args.json).write_text(json.dumps(rows, indent=1))
            if part.returncode:
                raise SystemExit(f"the {threads}-thread part failed (exit {part.returncode})")
        print("model         threads  trials  eqsched ms  onnxrt ms  numpy ms  default ms  "
              "vs onnxrt  spread")
        for r in rows:
            speed = r["vs_onnxruntime"]
            bar = (r["model"] in BAR_MODELS and r["threads"] == 1
                   and r["trials"] <= 1000)
            verdict = ("ok" if speed >= BAR else "BELOW") if bar else ""
            print(f"{r['model']:<13} {r['threads']:>7}  {r['trials']:>6}  "
                  f"{r['eqsched_s'] * 1e3:10.3f}  {r['onnxruntime_s'] * 1e3:9.3f}  "
                  f"{r['numpy_s'] * 1e3:8.3f}  {r['default_s'] * 1e3:10.3f}  "
                  f"{speed:8.3f}x  {r['spread']:5.1%}  {verdict}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
